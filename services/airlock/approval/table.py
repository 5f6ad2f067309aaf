"""The requests pending now, as an object that owns them and their lookups.

`PendingTable` is approval's table of `Pending` requests keyed by (agent
uid, request ID): one agent's IDs neither collide with nor reveal another's
(issue 27).  Its lookups are the ways a request is named: exactly by an
operator (`find`, `named`: refs.py), by its own agent (`own`), or as the
identical request another one is attached to (`leader_for`, issue 34).
`check_expected` is an approve line's ``--expect`` check, journaled when
it refuses.
"""

from __future__ import annotations

import asyncio
from typing import Any

from airlock.approval import refs
from airlock.approval.pending import Pending, ticket_binding
from airlock.approval.transitions import SHARED, Outcome, State, move
from airlock.approval.verdict import Decided
from airlock.common import shown, validate
from airlock.common.audit import Audit, Ids
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.server import Call


class PendingTable(dict[tuple[int, str], Pending]):
    """(agent uid, request ID) -> the request pending now."""

    def find(self, ref: Any, expect: str | None = None) -> Pending:
        """The request pending now under exactly this ID or ``AGENT/ID`` (refs.py: no prefix, no
        operation ID); an ID several agents have pending needs ``AGENT/ID`` or ``expect``."""
        ref = validate.text("id", ref, max_len=256, allow_empty=False)
        return refs.exact(ref, self.values(), expect)

    def named(self, ref: str) -> Pending | None:
        """The pending request ``ref`` names exactly: its ID, or ``AGENT/ID`` (a user name or uid) when
        agents share the ID (pending requests are keyed by (uid, ID)); a shared ID alone is refused."""
        return refs.named(ref, self.values())

    def stdin(self, ref: str, *, operator: bool) -> dict[str, Any]:
        """Issue 45: the whole stdin of the request ``ref`` names exactly (``show`` with ``stdin: true``), for
        an ``operator`` only.  Only approval holds it, and only while it is pending: records keep its digest."""
        if not operator:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "a request's stdin is shown to operators only")
        entry = self.named(ref)
        if entry is None:
            raise AirlockError(
                ErrorCode.NOT_FOUND,
                f"{ref!r} is not pending (give its whole ID): stdin is kept only while a request is pending; "
                "its records hold its size and sha256",
            )
        return {"request_id": entry.request_id, "stdin": entry.stdin, "summary": shown.summary(entry.stdin)}

    def own(self, uid: int, request_id: str) -> Pending | None:
        """Agent ``uid``'s own pending request ``request_id`` (an agent names only its own)."""
        return self.get((uid, request_id))

    # --- settling: the only place a pending request's outcome is set (issue 47) ---------------------

    @staticmethod
    def is_open(entry: Pending) -> bool:
        """Whether ``entry`` is still pending: nothing has settled it."""
        return entry.state is State.PENDING

    def settle(self, entry: Pending, outcome: Outcome) -> None:
        """End ``entry`` with ``outcome``, as `transitions.MOVES` allows (else `IllegalMove`).

        An allow or a deny is shared in the same call by the identical requests attached to it
        (issue 34), unless it was decided for itself alone (``solo``: an operator's cancel); every
        other end leaves them waiting, and `promote` makes the oldest a question of its own.
        """
        entry.state = move(entry.state, outcome.decided)
        entry.ended = outcome
        _waiter(entry).set_result(outcome)
        if outcome.decided in SHARED and not entry.solo:
            for follower in self._followers((entry.peer.uid, entry.request_id)):
                follower.decided_with = entry.request_id
                follower.tally = entry.tally  # who approved, for its own approval.decided
                self.settle(follower, outcome)

    def settle_open(self, entry: Pending, outcome: Outcome) -> bool:
        """`settle` if ``entry`` is still open (a race someone else may have won: a second console,
        a connection that closed as the decision came); False when it was settled already."""
        if not self.is_open(entry):
            return False
        self.settle(entry, outcome)
        return True

    async def outcome(self, entry: Pending, wait: float) -> Outcome:
        """Wait for ``entry``'s outcome; nobody deciding within ``wait`` seconds settles it as timed out."""
        try:
            return await asyncio.wait_for(asyncio.shield(_waiter(entry)), wait)
        except TimeoutError:
            self.settle_open(entry, Outcome(Decided.TIMEOUT, "timeout"))
            assert entry.ended is not None
            return entry.ended

    def interrupt_all(self) -> None:
        """approval is stopping: every open request ends interrupted (its agent hears approval_interrupted)."""
        for entry in list(self.values()):
            self.settle_open(entry, Outcome(Decided.INTERRUPTED, "shutdown"))

    def withdraw(self, uid: int, request_id: str) -> bool:
        """Agent ``uid``'s own request ``request_id`` is withdrawn (out of the table at once: from now on an
        approve finds nothing); False when it is not pending, or already decided."""
        entry = self.own(uid, request_id)  # only that agent's own request
        if entry is None or not self.is_open(entry):
            return False
        del self[(uid, request_id)]
        self.settle(entry, Outcome(Decided.WITHDRAWN, "agent", None, "withdrawn by the agent before a decision"))
        return True

    async def withdraw_when_gone(self, call: Call, entry: Pending) -> None:
        """Withdraw a pending request once the connection that asked for it has closed."""
        await call.connection.wait_gone()
        gone = Outcome(Decided.WITHDRAWN, "agent", None, "the requesting agent went away before a decision")
        self.settle_open(entry, gone)

    def waiting(self, uid: int) -> int:
        """How many of agent ``uid``'s requests are pending."""
        return sum(1 for entry in self.values() if entry.peer.uid == uid)

    def leader_for(self, entry: Pending) -> Pending | None:
        """Issue 34: the request pending now that ``entry`` is identical to, to be decided with it.

        Only the same agent's (uid: another agent's request is never joined, whatever it asks), in the
        same session, with the same ticket binding (the spec's digest and everything approval resolved:
        binaries, sandbox, changeable arguments, a file's reviewed content) under the same rule and the
        same quorum: an operator's decision of the leader is then exactly a decision of this one.
        """
        binding = ticket_binding(entry.digest, entry.bound)
        session = entry.request.get("session") or None
        for other in sorted(self.values(), key=lambda p: p.created):
            if (
                other is not entry
                and other.peer.uid == entry.peer.uid
                and other.attached_to is None
                and self.is_open(other)
                and (other.request.get("session") or None) == session
                and other.rule == entry.rule
                and other.tally is not None
                and entry.tally is not None
                and other.tally.requirement == entry.tally.requirement
                and ticket_binding(other.digest, other.bound) == binding
            ):
                return other
        return None

    def leading(self, key: tuple[int, str]) -> bool:
        """Whether the request under ``key`` is pending now, undecided, and leads (is attached to none)."""
        leader = self.get(key)
        return leader is not None and self.is_open(leader) and leader.attached_to is None

    def _followers(self, key: tuple[int, str]) -> list[Pending]:
        return sorted((p for p in self.values() if p.attached_to == key and self.is_open(p)), key=lambda p: p.created)

    def promote(self, entry: Pending) -> Pending | None:
        """The leader ``entry`` left pending without a shared decision (withdrawn, timed out, interrupted,
        cancelled alone): the oldest attached request becomes a question of its own and leads the rest
        (returned: operators are to be called for it).  Synchronous: nothing decides a follower meanwhile."""
        followers = self._followers((entry.peer.uid, entry.request_id))
        if not followers:
            return None
        first = followers[0]
        first.attached_to = None
        for follower in followers[1:]:
            follower.attached_to = (first.peer.uid, first.request_id)
        return first


def _waiter(entry: Pending) -> asyncio.Future[Outcome]:
    if entry._waiter is None:
        entry._waiter = asyncio.get_running_loop().create_future()
    return entry._waiter


async def check_expected(audit: Audit, call: Call, entry: Pending, action: str) -> None:
    """``expect`` (an approve line's --expect) must name the request pending now; else journaled, refused."""
    refused = refs.mismatch(entry, refs.expected(call.args))
    if refused is None:
        return
    await audit.record(
        "operator.action",
        Ids(entry.request_id, entry.operation_id, call.peer.uid),
        payload={
            "action": "refused",
            "refused": action,
            "code": refused.code.value,
            "operator": call.peer.user,
            "expected": refused.details["expected"],
            "pending": refused.details["pending"],
            "agent_uid": entry.peer.uid,  # whose request: request IDs are each agent's own
        },
    )
    raise refused

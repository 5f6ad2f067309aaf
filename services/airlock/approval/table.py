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

from typing import Any

from airlock.approval import refs
from airlock.approval.pending import Pending, ticket_binding
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

    def withdraw(self, uid: int, request_id: str) -> bool:
        """Agent ``uid``'s own request ``request_id`` is withdrawn (out of the table at once: from now on an
        approve finds nothing); False when it is not pending, or already decided."""
        entry = self.own(uid, request_id)  # only that agent's own request
        if entry is None or entry.future.done():
            return False
        del self[(uid, request_id)]
        entry.future.set_result(("withdrawn", "agent", None, "withdrawn by the agent before a decision"))
        return True

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
                and not other.future.done()
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
        return leader is not None and not leader.future.done() and leader.attached_to is None

    def settle_followers(
        self, entry: Pending, key: tuple[int, str], outcome: tuple[str, str, int | None, str]
    ) -> Pending | None:
        """The leader ``entry`` left pending with ``outcome``: an operator's (or a quorum's) allow or deny decides
        its attached requests too; otherwise (withdrawn, expired, interrupted, cancelled alone) the oldest
        attached one becomes a pending question of its own and leads the rest (returned: operators are to be
        called for it).  Synchronous: nothing decides a follower between the leader's decision and this."""
        followers = sorted(
            (p for p in self.values() if p.attached_to == key and not p.future.done()), key=lambda p: p.created
        )
        if not followers:
            return None
        if outcome[0] in ("allow", "deny") and not entry.solo:
            for follower in followers:
                follower.decided_with = entry.request_id
                follower.tally = entry.tally  # who approved, for its own approval.decided
                follower.future.set_result(outcome)
            return None
        first = followers[0]
        first.attached_to = None
        for follower in followers[1:]:
            follower.attached_to = (first.peer.uid, first.request_id)
        return first


async def check_expected(audit: Audit, call: Call, entry: Pending, action: str, expect: str | None) -> None:
    """``expect`` (an approve line's --expect) must name the request pending now; else journaled, refused."""
    refused = refs.mismatch(entry, expect)
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


async def withdraw_when_gone(call: Call, entry: Pending) -> None:
    """Withdraw a pending request once the connection that asked for it has closed."""
    await call.connection.wait_gone()
    if not entry.future.done():
        entry.future.set_result(("withdrawn", "agent", None, "the requesting agent went away before a decision"))

"""Tickets and the hold: what lets an approved request run.

`TicketBook` owns them (the tickets issued and not yet redeemed, and the
hold), and is passed to what needs it: a decision to allow issues a single-use ticket bound to the spec's digest and
what approval bound beyond it (`pending.ticket_binding`), valid for a few
seconds; the runner ``redeem``s it once.  The hold is the brake on tickets:
while held a rule's allow waits for an operator, and a ticket a rule issued
just before is not redeemed.  Operators set and lift it (``hold``,
``release``); at start it is read back from the journal, held until known.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from airlock.approval import restore
from airlock.approval.pending import Ticket, ticket_binding
from airlock.approval.rules import Policy
from airlock.approval.table import PendingTable
from airlock.approval.transitions import Outcome
from airlock.approval.verdict import HOLD_RULE, By, Decided, verdict
from airlock.common.audit import Audit, Ids
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.server import Call
from airlock.common.wire import approval as wire
from airlock.common.wire import operator as op
from airlock.common.wire.verb import Empty, Stub

# How long approval waits at start to read its hold state from the journal; then it starts held.
HOLD_RESTORE_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Hold:
    """The hold as it stood when read: its reason (None: not held) and who set it."""

    reason: str | None
    by: Mapping[str, Any]

    @property
    def held(self) -> bool:
        return self.reason is not None


class TicketBook:
    """The tickets issued and not yet redeemed, and the hold (held until the journal says otherwise)."""

    def __init__(
        self,
        journal: Stub,
        audit: Audit,
        log: Any,
        pending: PendingTable,
        policy: Callable[[], Policy],
        ttl: Callable[[], float],
    ) -> None:
        self.journal = journal
        self.audit = audit
        self.log = log
        self.pending = pending  # the requests the hold alone may keep waiting (release decides them)
        self._policy = policy  # the policy now (a reload replaces it)
        self._ttl = ttl  # approval.ticket_ttl_seconds now
        self.tickets: dict[str, Ticket] = {}
        # Held until the journal says otherwise (restore_hold at start): fail closed.
        self.hold_reason: str | None = "restoring the hold state from the journal"
        self.hold_by: dict[str, Any] = {
            "operator": "airlock-approval",
            "uid": None,
            "since": iso_utc(timespec="seconds"),
        }
        self._hold_known = asyncio.Event()

    async def current(self) -> Hold:
        """The hold now: the one way to read it, so no reader sees the start's "restoring" hold (issue 44).

        Waits until `restore_hold` has read the journal's state at start
        (bounded by its own journal call); afterwards it returns at once.
        """
        await self._hold_known.wait()
        return Hold(self.hold_reason, dict(self.hold_by))

    def issue(self, digest: str, bound: Mapping[str, Any], *, by_policy: bool, mark: str | None = None) -> str:
        """A single-use ticket for exactly this binding, valid ``approval.ticket_ttl_seconds``."""
        now = time.monotonic()
        for key in [k for k, t in self.tickets.items() if t.expires < now]:
            del self.tickets[key]
        ticket = secrets.token_urlsafe(32)
        # Only a hash is kept: a memory dump does not yield a redeemable ticket.
        self.tickets[_ticket_key(ticket)] = Ticket(ticket_binding(digest, bound), now + self._ttl(), by_policy, mark)
        return ticket

    async def redeem(self, call: Call, args: wire.Redeem) -> wire.Redeemed:
        """The runner's (`wire.approval.REDEEM`): a ticket, spent once, for exactly the binding it was issued for."""
        ticket, digest, bound = args.ticket, args.digest, args.bound
        entry = self.tickets.pop(_ticket_key(ticket), None)  # single use: gone whatever happens next
        binding = ticket_binding(digest, bound)
        if entry is None or entry.expires < time.monotonic() or not secrets.compare_digest(entry.binding, binding):
            raise AirlockError(ErrorCode.INVALID_TICKET, "the approval ticket is not valid for this request")
        if entry.by_policy and (await self.current()).held:
            # A rule allowed it just before the hold: the brake wins (the model's property P4).
            raise AirlockError(
                ErrorCode.DENIED, "airlock is on hold: a rule's approval is not redeemed while held", {"rule": "hold"}
            )
        return wire.Redeemed(True, entry.mark)

    async def hold(self, call: Call, args: op.Hold) -> op.Held:
        return await self.hold_as(call.peer, args.reason)

    async def hold_as(self, who: Peer, reason: str, extra: Mapping[str, Any] | None = None) -> op.Held:
        """The hold by ``who`` (the caller, or the person whose passkey signed it: issue 49's ``extra``)."""
        await self.current()  # an operator's hold replaces the restored state, never the other way round
        since = iso_utc(timespec="seconds")
        # The brake takes effect at once, in memory, then is journaled, where the next
        # start reads it back.  The other order would let a rule's allow through while
        # the record is written.  If it cannot be journaled, this process stays held
        # and the operator is told the hold would not survive a restart.
        self.hold_reason = reason
        self.hold_by = {"operator": who.user, "uid": who.uid, "since": since}
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=who.uid),
            payload={"action": "hold", "operator": who.user, "reason": reason, "since": since} | dict(extra or {}),
        )
        return op.Held(True, reason)

    async def release(self, call: Call, args: Empty) -> op.Released:
        return await self.release_as(call.peer)

    async def release_as(self, who: Peer, extra: Mapping[str, Any] | None = None) -> op.Released:
        await self.current()
        # Durable first, then lifted: a release that cannot be journaled leaves it held.
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=who.uid),
            payload={"action": "release", "operator": who.user} | dict(extra or {}),
        )
        self.hold_reason = None
        return op.Released(False, tuple(self._redecide_held(who)))

    def _redecide_held(self, who: Peer) -> list[str]:
        """Requests the hold alone kept waiting are decided by their rule at once (issue 32).

        Only a request whose own policy decision was a plain ``allow`` (one
        approval, nothing that made it ask) goes; everything else stays
        pending for an operator, as it would have without the hold.
        """
        released = []
        for entry in list(self.pending.values()):
            decision = entry.decision
            if entry.rule != HOLD_RULE or not self.pending.is_open(entry):
                continue
            # The same verdict a request arriving now would get, with the hold lifted: only the rule's own allow.
            if verdict(decision, False, None, self._policy().requirement(decision)).by is not By.POLICY:
                continue
            why = f"the hold was released; rule {decision.rule!r} allows it"
            self.pending.settle(entry, Outcome(Decided.ALLOW, f"release by {who.user}", who.uid, why))
            released.append(entry.request_id)
        if released:
            self.log.info("approval.hold.released_waiting", count=len(released), operator=who.user)
        return released

    async def restore_hold(self) -> None:
        """At start: the hold state is the journal's newest hold or release (held if it cannot be read)."""
        try:
            latest = await restore.latest_hold(self.journal, HOLD_RESTORE_SECONDS)
            if latest is None or latest.get("action") == "release":
                self.hold_reason = None
            else:
                self.hold_reason = str(latest.get("reason") or "no reason recorded")
                since = latest.get("since") or latest.get("time")
                self.hold_by = {"operator": latest.get("operator"), "uid": latest.get("peer_uid"), "since": since}
            self.log.info("approval.hold.restored", hold=self.hold_reason is not None, seq=(latest or {}).get("seq"))
        except AirlockError as exc:
            self.hold_reason = (
                f"the hold state could not be read from the journal at start ({exc.message}); "
                "approval started held: release it with `airlock release` once the journal is healthy"
            )
            self.hold_by = {"operator": "airlock-approval", "uid": None, "since": iso_utc(timespec="seconds")}
            self.log.error("approval.hold.unknown", error=exc.message, code=exc.code.value)
        finally:
            self._hold_known.set()


def _ticket_key(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()

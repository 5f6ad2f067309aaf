"""airlock-approval: policy decisions, pending approvals, single-use tickets.

Two doors: ``internal/approval.sock`` (intake asks ``decide``; the runner
``redeem``s tickets) and ``operator.sock`` (the operators' own front door).
A decision is journaled before it is returned; an approval produces a ticket
bound to the spec's digest, valid once and for a few seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import socket
import stat
import time
from collections.abc import Callable, Mapping
from typing import Any

from airlock.approval import fileop_review as filereview
from airlock.approval import grants, hook, quorum
from airlock.approval.lookup import JournalLookup
from airlock.approval.pending import Pending, Ticket, bind_binaries, describe_binaries, ticket_binding
from airlock.approval.policy import Decision, Policy, PolicyError, Subject, load_policy
from airlock.approval.signed import Ledger
from airlock.approval.signers import Signers
from airlock.approval.tokens import (
    DEFAULT_TTL_SECONDS,
    MAX_TTL_SECONDS,
    TokenStore,
    new_token,
    token_hash,
    unauthorized,
)
from airlock.approval.votes import Votes
from airlock.common import daemon, log, trail, validate
from airlock.common.audit import Audit, Ids, lifecycle, marks_of
from airlock.common.codec import iso_utc
from airlock.common.config import Config, ConfigError, load
from airlock.common.errors import AirlockError, ErrorCode, within_reference_004
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client
from airlock.common.peer import AllowList, Peer, identify, may_decide, uid_of
from airlock.common.server import Call, Door, Service, Verb
from airlock.common.spec import ExecSpec

NAME = "approval"
# How long approval waits at start to read its hold state from the journal; then it starts held.
HOLD_RESTORE_SECONDS = 30.0


def subject_of(peer: Peer, spec: ExecSpec | FileSpec, session: str | None) -> Subject:
    return Subject(
        uid=peer.uid,
        user=peer.user,
        groups=frozenset(peer.groups),
        session=session or None,
        privileged=spec.privileged,
        target_uid=spec.run_as,
    )


class Approval(Votes):
    def __init__(self, config: Config, policy: Policy, config_path: str | None) -> None:
        self.config = config
        self.policy = policy
        self.config_path = config_path
        self.audit = Audit(config, "approval")
        self.journal = Client(config.socket_path("journal"), service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
        self.runner = Client(config.socket_path("runner"), service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE)
        self.pending: dict[str, Pending] = {}
        self.tickets: dict[str, Ticket] = {}
        # Held until the journal says otherwise (restore_hold at start): fail closed.
        self.hold_reason: str | None = "restoring the hold state from the journal"
        self.hold_by: dict[str, Any] = {"operator": "airlock-approval", "uid": None, "since": iso_utc(timespec="seconds")}
        self._hold_known = asyncio.Event()
        self.tokens = TokenStore()
        self.notifier = hook.NotifyCommand(
            config.approval.notify_command, config.approval.notify_timeout_seconds, str(config.socket_path("operator"))
        )
        self.runner = Client(config.socket_path("runner"), service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE)
        self.intake_uid = uid_of(config.services.intake_user)
        self.lookup = JournalLookup(self.journal)
        self.log = log.get()
        self.ledger = Ledger(Signers(config.approval.allowed_signers))
        self.grants = grants.Grants()
        self._grant_timers: dict[str, asyncio.TimerHandle] = {}
        self.host = config.notify.host or socket.gethostname()

    # --- intake: decide -------------------------------------------------------

    async def decide(self, call: Call) -> dict[str, Any]:
        a = call.args
        request = a.get("request")
        if not isinstance(request, dict):
            raise validate.bad("request", "must be an object")
        # A file operation (issue 10) carries its spec as "file"; a command as "spec".
        spec: ExecSpec | FileSpec = (
            FileSpec.from_dict(request["file"]) if "file" in request else ExecSpec.from_dict(request.get("spec"))
        )
        peer_in = a.get("peer")
        if not isinstance(peer_in, dict):
            raise validate.bad("peer", "must be an object")
        try:
            peer = Peer.from_dict(peer_in)
        except ValueError as exc:
            raise validate.bad("peer", str(exc)) from None
        if peer.uid != spec.uid:
            raise validate.bad("peer", "does not match the spec's uid")
        request_id = validate.text("request_id", request.get("request_id"), max_len=256, allow_empty=False)
        operation_id = validate.optional_text("operation_id", a.get("operation_id"), max_len=256)
        session = validate.optional_text("session", request.get("session"), max_len=256)
        digest = spec.digest()
        subject = subject_of(peer, spec, session)
        if isinstance(spec, FileSpec):
            decision = self.policy.decide_file(subject, spec.tool, spec.path)
        else:
            decision = self.policy.decide(subject, spec.stages)
        # What approval resolved beyond the request, bound to the ticket and enforced by the runner.
        bound: dict[str, Any] = {}
        if isinstance(spec, ExecSpec) and decision.decision != "deny":
            bound["binaries"] = bind_binaries(decision, privileged=spec.run_as == 0)
            if any(stage.sandbox for stage in decision.stages):
                # The runner applies exactly the confinement approval saw (issue 22).
                bound["sandbox"] = [dict(stage.sandbox or {}) for stage in decision.stages]
        await self._hold_restored()
        verdict, rule = decision.decision, decision.rule
        if self.hold_reason is not None and verdict == "allow":
            verdict, rule = "ask", "hold"
        common = Ids(request_id, operation_id, peer.uid, session)
        # intake's deferred request.received (issue 21): the decision's records name its
        # mark, so none is journaled (nor a ticket issued) if the journal lost it.
        after = marks_of(a.get("after"))
        requirement = self.policy.requirement(decision)
        if verdict != "deny":
            await self._require_reason(request, requirement, decision, common, after=after)
        granted = self._granted(verdict, spec, peer, session, digest, decision, requirement)
        if granted is not None:
            # Durable (not deferred like a rule's allow): a grant's use is an operator's
            # decision standing in, and it costs one commit only where a grant applies.
            await self.audit.record(
                "approval.decided",
                common,
                payload={"decision": "allow", "rule": rule, "by": "grant", "grant_id": granted.grant_id,
                         "grant_scope": granted.scope, "granted_by": granted.made_by, "policy": decision.to_dict()},
                log_fields={"decision": "allow", "rule": rule},
                after=after,
            )
            # by_policy: like a rule's allow, a hold made before the runner redeems it stops it.
            return {"decision": "allow", "rule": rule, "decided_by": f"grant {granted.grant_id}",
                    "ticket": self._issue(digest, bound, by_policy=True), "bound": bound}
        if verdict == "ask":
            if isinstance(spec, FileSpec):
                request = await filereview.operator_view(self.runner, request, spec)
                reviewed = filereview.bound_file(request)
                if reviewed is not None:
                    bound["file"] = reviewed
            return await self._wait_for_operator(call, request, peer, decision, digest, bound, common, spec, requirement,
                                                 after=after)
        payload = {"decision": verdict, "rule": rule, "by": "policy", "policy": decision.to_dict()}
        if verdict == "deny":
            await self.audit.record("approval.decided", common, payload=payload, log_fields={"decision": verdict, "rule": rule},
                                    after=after)
            raise AirlockError(ErrorCode.DENIED, f"denied by policy rule {rule!r}", {"rule": rule, "decided_by": "policy"})
        # A rule's allow is deferred (issue 21): durable with the runner's exec.started, which
        # names this mark (intake passes it on, and redeem hands it to the runner itself).
        mark = await self.audit.defer("approval.decided", common, payload=payload, log_fields={"decision": verdict, "rule": rule},
                                      after=after)
        return {"decision": "allow", "rule": rule, "decided_by": "policy",
                "ticket": self._issue(digest, bound, by_policy=True, mark=mark), "bound": bound, "mark": mark}

    async def _wait_for_operator(
        self,
        call: Call,
        request: dict[str, Any],
        peer: Peer,
        decision: Decision,
        digest: str,
        bound: dict[str, Any],
        common: Ids,
        spec: ExecSpec | FileSpec,
        requirement: quorum.Requirement | None = None,
        *,
        after: list[str] | None = None,
    ) -> dict[str, Any]:
        now = time.time()
        timeout = self.config.approval.timeout_seconds
        entry = Pending(
            request_id=request_id_of(common),
            operation_id=common.operation_id,
            peer=peer,
            request=request,
            decision=decision,
            digest=digest,
            bound=bound,
            created=now,
            expires=now + timeout,
            future=asyncio.get_running_loop().create_future(),
        )
        if entry.request_id in self.pending:
            raise AirlockError(ErrorCode.CONFLICT, "a request with this ID is already pending")
        rule = "hold" if self.hold_reason is not None and decision.decision == "allow" else decision.rule
        entry.rule = rule
        entry.privileged, entry.run_as, entry.run_as_user = spec.privileged, spec.run_as, _user_name(spec.run_as)
        entry.binaries = describe_binaries(decision, spec.run_as, bound.get("binaries"))
        entry.tally = quorum.Tally(requirement or quorum.Requirement(), peer.uid, peer.user)
        entry.published = self.ledger.publish(entry.request_id, self._statements(entry))
        await self.audit.record(
            "approval.pending",
            common,
            payload={"rule": rule, "policy": decision.to_dict(), "timeout_seconds": timeout, "request": request}
            | self._pending_extra(entry),
            log_fields={"decision": "ask", "rule": rule},
            after=after,  # durable: request.received is too once this returns
        )
        self.pending[entry.request_id] = entry
        self.notifier.pending(entry.to_dict(now) | {"event": "pending"})
        # The request belongs to a live client: when intake's call is gone
        # (the agent went away or cancelled), the request is withdrawn.
        watch = asyncio.ensure_future(_withdraw_when_gone(call, entry))
        try:
            await call.emit("pending_approval", {"request_id": entry.request_id, "rule": rule, "timeout_seconds": timeout})
            verdict, by, operator_uid, reason = await asyncio.wait_for(asyncio.shield(entry.future), timeout)
        except TimeoutError:
            verdict, by, operator_uid, reason = "timeout", "timeout", None, ""
        finally:
            watch.cancel()
            self.pending.pop(entry.request_id, None)
            if entry.published is not None:
                self.ledger.settle(entry.published, _SETTLED.get(verdict, "decided"))
        if verdict == "interrupted":
            raise AirlockError(ErrorCode.APPROVAL_INTERRUPTED, "the approval service stopped while the request was pending")
        await self.audit.record(
            "approval.decided",
            common,
            payload={"decision": verdict, "rule": rule, "by": by, "operator_uid": operator_uid, "reason": reason}
            | _decided_quorum(entry),
            log_fields={"decision": verdict, "rule": rule},
        )
        if verdict == "timeout":
            raise AirlockError(
                ErrorCode.APPROVAL_TIMEOUT, f"no operator decided within {timeout:g}s", {"rule": rule}
            )
        if verdict == "withdrawn":
            raise AirlockError(ErrorCode.WITHDRAWN, reason, {"rule": rule})
        if verdict == "deny":
            raise AirlockError(
                ErrorCode.DENIED, f"denied by operator {by}" + (f": {reason}" if reason else ""), {"rule": rule, "decided_by": by}
            )
        return {"decision": "allow", "rule": rule, "decided_by": by, "ticket": self._issue(entry.digest, entry.bound, by_policy=False),
                "bound": entry.bound}

    def _issue(self, digest: str, bound: Mapping[str, Any], *, by_policy: bool, mark: str | None = None) -> str:
        now = time.monotonic()
        for key in [k for k, t in self.tickets.items() if t.expires < now]:
            del self.tickets[key]
        ticket = secrets.token_urlsafe(32)
        # Only a hash is kept: a memory dump does not yield a redeemable ticket.
        self.tickets[_ticket_key(ticket)] = Ticket(
            ticket_binding(digest, bound), now + self.config.approval.ticket_ttl_seconds, by_policy, mark
        )
        return ticket

    async def withdraw(self, call: Call) -> dict[str, Any]:
        """intake: the agent went away or cancelled; the pending request is withdrawn at once."""
        if self.intake_uid is None or call.peer.uid != self.intake_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        request_id = validate.text("request_id", call.args.get("request_id"), max_len=256, allow_empty=False)
        entry = self.pending.get(request_id)
        if entry is None or entry.future.done():
            return {"withdrawn": False}
        del self.pending[request_id]  # from now on an approve finds nothing
        entry.future.set_result(("withdrawn", "agent", None, "withdrawn by the agent before a decision"))
        return {"withdrawn": True}

    # --- runner: redeem -------------------------------------------------------

    async def redeem(self, call: Call) -> dict[str, Any]:
        ticket = validate.text("ticket", call.args.get("ticket"), max_len=256, allow_empty=False)
        digest = validate.text("digest", call.args.get("digest"), max_len=128, allow_empty=False)
        bound = validate.mapping("bound", call.args.get("bound"))
        entry = self.tickets.pop(_ticket_key(ticket), None)  # single use: gone whatever happens next
        binding = ticket_binding(digest, bound)
        if entry is None or entry.expires < time.monotonic() or not secrets.compare_digest(entry.binding, binding):
            raise AirlockError(ErrorCode.INVALID_TICKET, "the approval ticket is not valid for this request")
        if entry.by_policy and self.hold_reason is not None:
            # A rule allowed it just before the hold: the brake wins (the model's property P4).
            raise AirlockError(ErrorCode.DENIED, "airlock is on hold: a rule's approval is not redeemed while held",
                               {"rule": "hold"})
        return {"valid": True, "mark": entry.mark}

    # --- operators -------------------------------------------------------------

    def _find(self, ref: Any) -> Pending:
        ref = validate.text("id", ref, max_len=256, allow_empty=False)
        if ref in self.pending:
            return self.pending[ref]
        matches = [p for key, p in self.pending.items() if key.startswith(ref) or (p.operation_id or "") == ref]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no pending request {ref!r}")
        raise AirlockError(ErrorCode.CONFLICT, f"{ref!r} matches {len(matches)} pending requests; give more of the ID")

    async def _settle(self, call: Call, verdict: str) -> dict[str, Any]:
        if call.args.get("signature") is not None:
            return await self._settle_signed(call, (verdict,), via="operator")
        entry = self._find(call.args.get("id"))
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        operator = call.peer
        if operator.uid == entry.peer.uid and not self.config.approval.allow_self_approval and verdict == "allow":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "operators cannot approve their own requests")
        if entry.future.done():
            raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
        voter = quorum.Voter(operator.uid, operator.user, frozenset(operator.groups))
        grant = None
        if verdict == "allow":
            self._require_operator_reason(entry, reason)
            grant = self._grant_for(entry, operator, call.args)  # the arguments first, then who votes
            self._check_vote(entry, voter)
        ids = Ids(entry.request_id, entry.operation_id, operator.uid)
        await self.audit.record(
            "operator.action",
            ids,
            payload={"action": "approve" if verdict == "allow" else "deny", "operator": operator.user, "reason": reason}
            | self._vote_progress(entry, verdict) | ({"grant_id": grant.grant_id} if grant else {}),
        )
        if grant is not None and not entry.future.done():
            await self._add_grant(grant, ids, operator.user, reason)
        out = self._count(entry, verdict, voter, reason)
        return out | ({"grant": grant.to_dict()} if grant is not None else {})

    async def approve(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "allow")

    async def deny(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "deny")

    async def list_pending(self, call: Call) -> dict[str, Any]:
        now = time.time()
        return {"pending": [p.to_dict(now) for p in sorted(self.pending.values(), key=lambda p: p.created)]}

    async def status(self, call: Call) -> dict[str, Any]:
        await self._hold_restored()
        now = time.time()
        held = self.hold_reason is not None
        return {
            "hold": held,
            "hold_reason": self.hold_reason,
            "hold_by": self.hold_by.get("operator") if held else None,
            "hold_uid": self.hold_by.get("uid") if held else None,
            "hold_since": self.hold_by.get("since") if held else None,
            "pending": len(self.pending),
            "tokens": self.tokens.live(now),
            "grants": len(self.grants.live(now)),
            "services": await self._services(),
            "policy": {"default": self.policy.default, "rules": len(self.policy.rules), "sources": list(self.policy.sources)},
        }

    async def _services(self) -> dict[str, Any]:
        """Whether the other services can be reached.

        The journal is asked (it is needed anyway, and reports its size).
        Intake's and the runner's sockets are only looked at: connecting would
        start a socket-activated root runner just to answer a status query.
        """
        out: dict[str, Any] = {"approval": {"state": "up", "pid": os.getpid()}}
        try:
            head = await self.journal.call("head", {}, timeout=5)
            out["journal"] = {"state": "up", "events": head.get("seq")}
        except AirlockError as exc:
            out["journal"] = {"state": "down", "error": exc.message}
        for name, door in (("intake", "agent"), ("runner", "runner")):
            try:
                listening = stat.S_ISSOCK(os.stat(self.config.socket_path(door)).st_mode)
            except OSError:
                listening = False
            out[name] = {"state": "listening" if listening else "missing"}
        return out

    async def hold(self, call: Call) -> dict[str, Any]:
        reason = validate.text("reason", call.args.get("reason"), max_len=4096, allow_empty=False)
        await self._hold_restored()
        since = iso_utc(timespec="seconds")
        # The brake takes effect at once, in memory, then is journaled, where the next
        # start reads it back.  The other order would let a rule's allow through while
        # the record is written.  If it cannot be journaled, this process stays held
        # and the operator is told the hold would not survive a restart.
        self.hold_reason = reason
        self.hold_by = {"operator": call.peer.user, "uid": call.peer.uid, "since": since}
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid),
            payload={"action": "hold", "operator": call.peer.user, "reason": reason, "since": since},
        )
        return {"hold": True, "reason": reason}

    async def release(self, call: Call) -> dict[str, Any]:
        await self._hold_restored()
        # Durable first, then lifted: a release that cannot be journaled leaves it held.
        await self.audit.record("operator.action", Ids(peer_uid=call.peer.uid), payload={"action": "release", "operator": call.peer.user})
        self.hold_reason = None
        return {"hold": False}

    async def restore_hold(self) -> None:
        """At start: the hold state is the journal's newest hold or release (held if it cannot be read)."""
        try:
            found = await self.journal.call("hold.state", {}, timeout=HOLD_RESTORE_SECONDS)
            latest = found.get("latest")
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

    async def _hold_restored(self) -> None:
        # restore_hold always sets the event (its journal call has its own bound).
        await self._hold_known.wait()

    async def policy_check(self, call: Call) -> dict[str, Any]:
        a = call.args
        user = validate.text("user", a.get("user") or call.peer.user, max_len=256)
        peer = _peer_for_user(user)
        privileged = validate.boolean("privileged", a.get("privileged"), True)
        pipeline = a.get("pipeline") or ([a["argv"]] if a.get("argv") is not None else None)
        if not isinstance(pipeline, list) or not pipeline:
            raise validate.bad("argv", "give argv or pipeline")
        stages = tuple(validate.argv(f"pipeline[{i}]", s) for i, s in enumerate(pipeline))
        spec = ExecSpec(mode="exec", stages=stages, privileged=privileged, uid=peer.uid)
        decision = self.policy.decide(subject_of(peer, spec, validate.optional_text("session", a.get("session"))), stages)
        await self._hold_restored()
        return decision.to_dict() | {"hold": self.hold_reason is not None}

    async def events(self, call: Call) -> dict[str, Any]:
        unknown = sorted(set(call.args) - {"after", "tail", "limit", "scope"})
        if unknown:
            raise validate.bad(unknown[0], "unknown argument (known: after, tail, limit, scope)")
        return await self.journal.call("events", call.args)

    # --- operators: show, cancel --------------------------------------------------

    async def show(self, call: Call) -> dict[str, Any]:
        ref = validate.text("ref", call.args.get("ref"), max_len=256, allow_empty=False)
        now = time.time()
        for entry in self.pending.values():
            if ref in (entry.request_id, entry.operation_id):
                return await self._show_pending(entry, now)
        prefixed = [p for p in self.pending.values() if p.request_id.startswith(ref) or (p.operation_id or "").startswith(ref)]
        events = await self.lookup.request_events(ref)
        if not events:
            events = await self.lookup.operation_events(ref)
        if not events and not prefixed:
            request_ids, operation_ids = await self.lookup.prefixed(ref)
            found = sorted(request_ids | operation_ids)
            if len(found) > 1:
                raise AirlockError(ErrorCode.CONFLICT, f"{ref!r} matches {len(found)} requests; give more of the ID", {"matches": found[:16]})
            if request_ids:
                events = await self.lookup.request_events(found[0])
            elif operation_ids:
                events = await self.lookup.operation_events(found[0])
        elif not events and len(prefixed) == 1:
            return await self._show_pending(prefixed[0], now)
        elif not events:
            raise AirlockError(ErrorCode.CONFLICT, f"{ref!r} matches {len(prefixed)} pending requests; give more of the ID")
        if not events:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no request or operation {ref!r} in the journal")
        return trail.summarise(events)

    async def _show_pending(self, entry: Pending, now: float) -> dict[str, Any]:
        events = await self.lookup.request_events(entry.request_id)
        shown = trail.summarise(events) if events else {}
        return shown | {
            "request_id": entry.request_id,
            "operation_id": entry.operation_id,
            "state": "pending",
            "settled": False,
            "pending": True,
            "peer": entry.peer.to_dict(),
            "session": entry.request.get("session") or "",
            "reason": entry.request.get("reason") or "",
            "request": entry.request,
            "detail": entry.to_dict(now),
            "events": events,
        }

    async def cancel(self, call: Call) -> dict[str, Any]:
        op = validate.text("operation_id", call.args.get("operation_id"), max_len=256, allow_empty=False)
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        operator = call.peer
        waiting = [p for p in self.pending.values() if p.operation_id == op]
        await self.audit.record(
            "operator.action",
            Ids(waiting[0].request_id if waiting else None, op, operator.uid),
            payload={"action": "cancel", "operator": operator.user, "reason": reason},
        )
        if waiting and not waiting[0].future.done():
            # Not running yet: cancelling a pending request is denying it.
            why = "cancelled by the operator" + (f": {reason}" if reason else "")
            waiting[0].future.set_result(("deny", operator.user, operator.uid, why))
            return {"operation_id": op, "cancelling": True, "was": "pending"}
        data = await self.runner.call("cancel", {"operation_id": op})
        return dict(data) | {"was": "running"}

    # --- operators: session tokens ------------------------------------------------

    async def token_issue(self, call: Call) -> dict[str, Any]:
        session = validate.text("session", call.args.get("session"), max_len=256, allow_empty=False)
        ttl = call.args.get("ttl_seconds", DEFAULT_TTL_SECONDS)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 1 <= ttl <= MAX_TTL_SECONDS:
            raise validate.bad("ttl_seconds", f"must be a number of seconds from 1 to {MAX_TTL_SECONDS}")
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        token = new_token()
        now = time.time()
        expires_at = iso_utc(now + ttl, timespec="seconds")
        # Journaled before it is usable; the record holds a short hash prefix, never the token.
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid, session=session),
            payload={"action": "token.issue", "operator": call.peer.user, "reason": reason,
                     "token_id": token_hash(token)[:16], "expires_at": expires_at},
        )
        self.tokens.issue(token, session, float(ttl), now)
        return {"token": token, "token_id": token_hash(token)[:16], "session": session, "expires_at": expires_at}

    async def token_revoke(self, call: Call) -> dict[str, Any]:
        token, session = call.args.get("token"), call.args.get("session")
        if (token is None) == (session is None):
            raise validate.bad("token", "give exactly one of token and session")
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        if token is not None:
            token = validate.text("token", token, max_len=256, allow_empty=False)
            target: dict[str, Any] = {"token_id": token_hash(token)[:16]}
        else:
            session = validate.text("session", session, max_len=256, allow_empty=False)
            target = {"session": session}
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid, session=session),
            payload={"action": "token.revoke", "operator": call.peer.user, "reason": reason} | target,
        )
        revoked = self.tokens.revoke_token(token) if token is not None else self.tokens.revoke_session(str(session))
        return {"revoked": revoked} | target

    async def token_check(self, call: Call) -> dict[str, Any]:
        """intake asks: which session does this token stand for? (`unauthorized` for any failure)"""
        if self.intake_uid is None or call.peer.uid != self.intake_uid:
            raise unauthorized()
        token = call.args.get("token")
        if not isinstance(token, str) or not token or len(token) > 256:
            raise unauthorized()
        return {"session": self.tokens.check(token, time.time())}

    async def audit_verify(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("verify", call.args, timeout=600)

    async def audit_head(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("head", {})

    # --- lifecycle ---------------------------------------------------------------

    def interrupt_pending(self) -> None:
        for entry in self.pending.values():
            if not entry.future.done():
                entry.future.set_result(("interrupted", "shutdown", None, ""))

    async def reload(self) -> None:
        try:
            config = load(_path(self.config_path))
            policy = load_policy(config)
        except (ConfigError, PolicyError) as exc:
            self.log.error("approval.policy.rejected", error=str(exc))
            return
        self.policy = policy
        await self.audit.record(
            "policy.reloaded", payload={"default": policy.default, "rules": len(policy.rules), "sources": list(policy.sources)}
        )


async def _withdraw_when_gone(call: Call, entry: Pending) -> None:
    """Withdraw a pending request once the connection that asked for it has closed."""
    await call.connection.wait_gone()
    if not entry.future.done():
        entry.future.set_result(("withdrawn", "agent", None, "the requesting agent went away before a decision"))


# How a pending request ended, as the ledger of statements remembers it.
_SETTLED = {"timeout": "expired", "withdrawn": "withdrawn", "interrupted": "interrupted"}


def _decided_quorum(entry: Pending) -> dict[str, Any]:
    """Who approved, for approval.decided: each approver (uid, or principal and key fingerprint)."""
    if entry.tally is None or not entry.tally.votes:
        return {}
    return {"approvers": [v.to_dict() for v in entry.tally.votes], "quorum": entry.tally.progress()}


def _operator_only(verb: Verb) -> Verb:
    """Tokens belong to agents: one on the operator socket is refused like any stranger."""

    async def checked(call: Call) -> dict[str, Any]:
        if call.request.token is not None:
            raise unauthorized()
        return await verb(call)

    return checked


# What a read-only operator (``operators.observers``) may call on operator.sock.
OBSERVER_VERBS = frozenset({"status", "pending", "show", "events", "statement", "grants"})


def _not_observer(verb: Verb, decides: Callable[[Peer], bool]) -> Verb:
    """A verb that changes something: an observer is refused (`common.peer.may_decide` says who is one)."""

    async def checked(call: Call) -> dict[str, Any]:
        if not decides(call.peer):
            raise AirlockError(ErrorCode.UNAUTHORIZED, "observers may only read (status, pending, show, events)")
        return await verb(call)

    return checked


def request_id_of(ids: Ids) -> str:
    assert ids.request_id is not None
    return ids.request_id


def _path(value: str | None) -> Any:
    from pathlib import Path

    return Path(value) if value and value != "<built-in>" else None


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _ticket_key(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


def _peer_for_user(user: str) -> Peer:
    import pwd

    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise validate.bad("user", f"no such user {user!r}") from None
    return identify(0, entry.pw_uid, entry.pw_gid)


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    try:
        policy = load_policy(config)
    except PolicyError as exc:
        raise ConfigError(str(exc)) from None
    approval = Approval(config, policy, config.source)
    s = config.services
    internal = Door(
        "approval",
        allow=AllowList.of([s.intake_user, s.runner_user], []),
        verbs={"decide": approval.decide, "redeem": approval.redeem, "token.check": approval.token_check,
               "withdraw": approval.withdraw, "approve_signed": approval.approve_signed},
        max_line=config.limits.max_request_bytes * 2,
    )
    observers = config.operators.observers

    def decides(peer: Peer) -> bool:
        return may_decide(peer, config.operators.users, config.operators.groups, observers.users)

    operator = Door(
        "operator",
        allow=AllowList.of(
            [*config.operators.users, *observers.users], [*config.operators.groups, *observers.groups], root=True
        ),
        errors=within_reference_004,
        verbs={
            name: _operator_only(verb if name in OBSERVER_VERBS else _not_observer(verb, decides))
            for name, verb in {
                "status": approval.status,
                "pending": approval.list_pending,
                "show": approval.show,
                "statement": approval.statement,
                "grants": approval.list_grants,
                "grant.revoke": approval.revoke_grant,
                "approve": approval.approve,
                "deny": approval.deny,
                "cancel": approval.cancel,
                "hold": approval.hold,
                "release": approval.release,
                "policy.check": approval.policy_check,
                "events": approval.events,
                "audit.verify": approval.audit_verify,
                "audit.head": approval.audit_head,
                "token.issue": approval.token_issue,
                "token.revoke": approval.token_revoke,
            }.items()
        },
    )
    service = Service(NAME, config, [internal, operator])
    service.on_reload = approval.reload
    service.on_stopping = approval.interrupt_pending
    lifecycle(service, approval.audit)
    journal_started = service.on_started
    journal_stopping = service.on_stop

    async def started() -> None:
        await approval.restore_grants()  # before the hold: decide waits for the hold, so for the grants too
        await approval.restore_hold()
        if journal_started is not None:
            await journal_started()

    service.on_started = started

    async def stop() -> None:
        await approval.notifier.close()
        if journal_stopping is not None:
            await journal_stopping()

    service.on_stop = stop
    # An idle exit would revoke every session token (they live only in memory).
    service.keep_alive = lambda: approval.tokens.live(time.time()) > 0 or bool(approval.grants.live(time.time()))
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)

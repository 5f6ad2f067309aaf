"""airlock-approval: policy decisions, pending approvals, single-use tickets.

Two doors: ``internal/approval.sock`` (intake asks ``decide``; the runner
``redeem``s tickets) and ``operator.sock`` (the operators' own front door).
A decision is journaled before it is returned; an approval produces a ticket
bound to the spec's digest, valid once and for a few seconds.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.approval.policy import Decision, Policy, PolicyError, Subject, load_policy
from airlock.common import daemon, log, validate
from airlock.common.audit import Audit, Ids, lifecycle
from airlock.common.config import Config, ConfigError, load
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.peer import AllowList, Peer, identify
from airlock.common.server import Call, Door, Service
from airlock.common.spec import ExecSpec

NAME = "approval"


@dataclass
class Pending:
    request_id: str
    operation_id: str | None
    peer: Peer
    request: dict[str, Any]
    decision: Decision
    digest: str
    created: float
    expires: float
    future: asyncio.Future[tuple[str, str, int | None, str]] = field(repr=False)

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "operation_id": self.operation_id,
            "peer": self.peer.to_dict(),
            "request": self.request,
            "policy": self.decision.to_dict(),
            "created": self.created,
            "seconds_left": max(0.0, round(self.expires - now, 1)),
        }


@dataclass(frozen=True, slots=True)
class Ticket:
    digest: str
    expires: float


def subject_of(peer: Peer, spec: ExecSpec, session: str | None) -> Subject:
    return Subject(
        uid=peer.uid,
        user=peer.user,
        groups=frozenset(peer.groups),
        session=session or None,
        privileged=spec.privileged,
        target_uid=spec.run_as,
    )


class Approval:
    def __init__(self, config: Config, policy: Policy, config_path: str | None) -> None:
        self.config = config
        self.policy = policy
        self.config_path = config_path
        self.audit = Audit(config, "approval")
        self.journal = Client(config.socket_path("journal"), service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
        self.pending: dict[str, Pending] = {}
        self.tickets: dict[str, Ticket] = {}
        self.hold_reason: str | None = None
        self.log = log.get()

    # --- intake: decide -------------------------------------------------------

    async def decide(self, call: Call) -> dict[str, Any]:
        a = call.args
        request = a.get("request")
        if not isinstance(request, dict):
            raise validate.bad("request", "must be an object")
        spec = ExecSpec.from_dict(request.get("spec"))
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
        decision = self.policy.decide(subject_of(peer, spec, session), spec.stages)
        verdict, rule = decision.decision, decision.rule
        if self.hold_reason is not None and verdict == "allow":
            verdict, rule = "ask", "hold"
        common = Ids(request_id, operation_id, peer.uid, session)
        if verdict == "ask":
            return await self._wait_for_operator(call, request, peer, decision, digest, common)
        await self.audit.record(
            "approval.decided",
            common,
            payload={"decision": verdict, "rule": rule, "by": "policy", "policy": decision.to_dict()},
            log_fields={"decision": verdict, "rule": rule},
        )
        if verdict == "deny":
            raise AirlockError(ErrorCode.DENIED, f"denied by policy rule {rule!r}", {"rule": rule, "decided_by": "policy"})
        return {"decision": "allow", "rule": rule, "decided_by": "policy", "ticket": self._issue(digest)}

    async def _wait_for_operator(
        self, call: Call, request: dict[str, Any], peer: Peer, decision: Decision, digest: str, common: Ids
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
            created=now,
            expires=now + timeout,
            future=asyncio.get_running_loop().create_future(),
        )
        if entry.request_id in self.pending:
            raise AirlockError(ErrorCode.CONFLICT, "a request with this ID is already pending")
        rule = "hold" if self.hold_reason is not None and decision.decision == "allow" else decision.rule
        await self.audit.record(
            "approval.pending",
            common,
            payload={"rule": rule, "policy": decision.to_dict(), "timeout_seconds": timeout, "request": request},
            log_fields={"decision": "ask", "rule": rule},
        )
        self.pending[entry.request_id] = entry
        await call.emit("pending_approval", {"request_id": entry.request_id, "rule": rule, "timeout_seconds": timeout})
        try:
            verdict, by, operator_uid, reason = await asyncio.wait_for(asyncio.shield(entry.future), timeout)
        except TimeoutError:
            verdict, by, operator_uid, reason = "timeout", "timeout", None, ""
        finally:
            self.pending.pop(entry.request_id, None)
        if verdict == "interrupted":
            raise AirlockError(ErrorCode.APPROVAL_INTERRUPTED, "the approval service stopped while the request was pending")
        await self.audit.record(
            "approval.decided",
            common,
            payload={"decision": verdict, "rule": rule, "by": by, "operator_uid": operator_uid, "reason": reason},
            log_fields={"decision": verdict, "rule": rule},
        )
        if verdict == "timeout":
            raise AirlockError(
                ErrorCode.APPROVAL_TIMEOUT, f"no operator decided within {timeout:g}s", {"rule": rule}
            )
        if verdict == "deny":
            raise AirlockError(
                ErrorCode.DENIED, f"denied by operator {by}" + (f": {reason}" if reason else ""), {"rule": rule, "decided_by": by}
            )
        return {"decision": "allow", "rule": rule, "decided_by": by, "ticket": self._issue(entry.digest)}

    def _issue(self, digest: str) -> str:
        now = time.monotonic()
        for key in [k for k, t in self.tickets.items() if t.expires < now]:
            del self.tickets[key]
        ticket = secrets.token_urlsafe(32)
        # Only a hash is kept: a memory dump does not yield a redeemable ticket.
        self.tickets[_ticket_key(ticket)] = Ticket(digest, now + self.config.approval.ticket_ttl_seconds)
        return ticket

    # --- runner: redeem -------------------------------------------------------

    async def redeem(self, call: Call) -> dict[str, Any]:
        ticket = validate.text("ticket", call.args.get("ticket"), max_len=256, allow_empty=False)
        digest = validate.text("digest", call.args.get("digest"), max_len=128, allow_empty=False)
        entry = self.tickets.pop(_ticket_key(ticket), None)  # single use: gone whatever happens next
        if entry is None or entry.expires < time.monotonic() or not secrets.compare_digest(entry.digest, digest):
            raise AirlockError(ErrorCode.INVALID_TICKET, "the approval ticket is not valid for this request")
        return {"valid": True}

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
        entry = self._find(call.args.get("id"))
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        operator = call.peer
        if operator.uid == entry.peer.uid and not self.config.approval.allow_self_approval and verdict == "allow":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "operators cannot approve their own requests")
        if entry.future.done():
            raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
        await self.audit.record(
            "operator.action",
            Ids(entry.request_id, entry.operation_id, operator.uid),
            payload={"action": "approve" if verdict == "allow" else "deny", "operator": operator.user, "reason": reason},
        )
        if entry.future.done():  # another console won while we journaled
            raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
        entry.future.set_result((verdict, operator.user, operator.uid, reason))
        return {"request_id": entry.request_id, "decision": verdict}

    async def approve(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "allow")

    async def deny(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "deny")

    async def list_pending(self, call: Call) -> dict[str, Any]:
        now = time.time()
        return {"pending": [p.to_dict(now) for p in sorted(self.pending.values(), key=lambda p: p.created)]}

    async def status(self, call: Call) -> dict[str, Any]:
        return {
            "hold": self.hold_reason is not None,
            "hold_reason": self.hold_reason,
            "pending": len(self.pending),
            "policy": {"default": self.policy.default, "rules": len(self.policy.rules), "sources": list(self.policy.sources)},
        }

    async def hold(self, call: Call) -> dict[str, Any]:
        reason = validate.text("reason", call.args.get("reason"), max_len=4096, allow_empty=False)
        await self.audit.record("operator.action", Ids(peer_uid=call.peer.uid), payload={"action": "hold", "operator": call.peer.user, "reason": reason})
        self.hold_reason = reason
        return {"hold": True, "reason": reason}

    async def release(self, call: Call) -> dict[str, Any]:
        await self.audit.record("operator.action", Ids(peer_uid=call.peer.uid), payload={"action": "release", "operator": call.peer.user})
        self.hold_reason = None
        return {"hold": False}

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
        return decision.to_dict() | {"hold": self.hold_reason is not None}

    async def events(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("events", call.args)

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


def request_id_of(ids: Ids) -> str:
    assert ids.request_id is not None
    return ids.request_id


def _path(value: str | None) -> Any:
    from pathlib import Path

    return Path(value) if value and value != "<built-in>" else None


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
        verbs={"decide": approval.decide, "redeem": approval.redeem},
        max_line=config.limits.max_request_bytes * 2,
    )
    operator = Door(
        "operator",
        allow=AllowList.of(config.operators.users, config.operators.groups, root=True),
        verbs={
            "status": approval.status,
            "pending": approval.list_pending,
            "approve": approval.approve,
            "deny": approval.deny,
            "hold": approval.hold,
            "release": approval.release,
            "policy.check": approval.policy_check,
            "events": approval.events,
            "audit.verify": approval.audit_verify,
            "audit.head": approval.audit_head,
        },
    )
    service = Service(NAME, config, [internal, operator])
    service.on_reload = approval.reload
    service.on_stopping = approval.interrupt_pending
    lifecycle(service, approval.audit)
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)

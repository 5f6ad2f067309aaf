"""The operators' verbs on operator.sock, and the table that serves them.

`Operating` is a part of `airlock.approval.service.Approval` (its mixin):
``pending``, ``show``, ``approve``/``deny``, ``cancel``, ``status``,
``policy.check``, ``events``, ``audit.*`` and the session tokens
(``token.issue``/``token.revoke``, and intake's ``token.check``).  ``hold``
and ``release`` are in `tickets`; ``statement``, ``grants`` and
``grant.revoke`` in `votes`.  `Operating.operator_verbs` is the operator
door's verb table, built from `common.wire.operator`'s declarations: a token
is refused there, an observer may call only what the declarations let it.
"""

from __future__ import annotations

import dataclasses
import os
import stat
import time
from collections.abc import Callable
from typing import Any

from airlock.approval import fileop_review, quorum, refs
from airlock.approval.decide import subject_of
from airlock.approval.lookup import JournalLookup
from airlock.approval.output import OutputReads
from airlock.approval.passkeys import Passkeys
from airlock.approval.pending import Pending
from airlock.approval.rules import Policy
from airlock.approval.tickets import Tickets
from airlock.approval.tokens import (
    DEFAULT_TTL_SECONDS,
    MAX_TTL_SECONDS,
    TokenStore,
    new_token,
    token_hash,
    unauthorized,
)
from airlock.approval.votes import Votes
from airlock.common import trail, validate
from airlock.common.audit import Ids
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.peer import Peer, identify, may_decide, uid_of, user_name
from airlock.common.server import Call, Verb
from airlock.common.spec import ExecSpec
from airlock.common.wire import operator as op
from airlock.common.wire import runner as runner_wire
from airlock.common.wire import verb as wire
from airlock.common.wire.verb import Caller, Empty


class Operating(Tickets, Votes, Passkeys, OutputReads):
    """The operators' side of `Approval`; the attributes below are `Approval`'s."""

    policy: Policy
    pending: dict[tuple[int, str], Pending]
    tokens: TokenStore
    lookup: JournalLookup
    runner: Client
    intake_uid: int | None

    def _find(self, ref: Any, expect: str | None = None) -> Pending:
        """The request pending now under exactly this ID or ``AGENT/ID`` (refs.py: no prefix, no
        operation ID); an ID several agents have pending needs ``AGENT/ID`` or ``expect``."""
        ref = validate.text("id", ref, max_len=256, allow_empty=False)
        return refs.exact(ref, self.pending.values(), expect)

    async def _check_expected(self, call: Call, entry: Pending, action: str) -> None:
        """``expect`` (an approve line's --expect) must name the request pending now; else journaled, refused."""
        refused = refs.mismatch(entry, refs.expected(call.args))
        if refused is None:
            return
        await self.audit.record(
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

    def _named(self, ref: str) -> Pending | None:
        """The pending request ``ref`` names exactly: its ID, or ``AGENT/ID`` (a user name or uid) when
        agents share the ID (pending requests are keyed by (uid, ID)); a shared ID alone is refused."""
        return refs.named(ref, self.pending.values())

    async def _settle(self, call: Call, verdict: str) -> dict[str, Any]:
        if call.args.get("signature") is not None:
            # The self-approval check is the signer's person's (`quorum.Tally.check`), not the submitter's.
            return await self._settle_signed(call, (verdict,), via="operator", carrier=call.peer)
        entry = self._find(call.args.get("id"), refs.expected(call.args))
        await self._check_expected(call, entry, "approve" if verdict == "allow" else "deny")
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        operator = call.peer
        if operator.uid == entry.peer.uid and not self.config.approval.allow_self_approval and verdict == "allow":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "operators cannot approve their own requests")
        if entry.future.done():
            raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
        voter = quorum.Voter(operator.uid, operator.user, frozenset(operator.groups))  # the person is the account
        grant = None
        if verdict == "allow":
            self._require_operator_reason(entry, reason)
            grant = self._grant_for(entry, operator, call.args)  # the arguments first, then who votes
            self._check_vote(entry, voter)
        ids = Ids(entry.request_id, entry.operation_id, operator.uid)
        await self.audit.record(
            "operator.action",
            ids,
            payload={
                "action": "approve" if verdict == "allow" else "deny",
                "operator": operator.user,
                "reason": reason,
                "agent_uid": entry.peer.uid,  # whose request: request IDs are each agent's own
            }
            | self._vote_progress(entry, verdict)
            | ({"grant_id": grant.grant_id} if grant else {}),
        )
        if grant is not None and not entry.future.done():
            await self._add_grant(grant, ids, operator.user, reason)
        out = self._count(entry, verdict, voter, reason)
        return out | ({"grant": grant.to_dict()} if grant is not None else {})

    async def approve(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "allow")

    async def deny(self, call: Call) -> dict[str, Any]:
        return await self._settle(call, "deny")

    def _shown(self, call: Call, shown: dict[str, Any]) -> dict[str, Any]:
        """A pending request as this peer may see it: file content (a write's diff) only for operators."""
        o = self.config.operators
        if may_decide(call.peer, o.users, o.groups, o.observers.users):
            return shown
        return fileop_review.for_observer(shown)

    async def list_pending(self, call: Call) -> dict[str, Any]:
        now = time.time()
        # Issue 34: a request attached to an identical one is listed with ``attached_to`` (the console, the
        # relay and the hook do not ask about it), and the first names it under ``attached``.
        attached: dict[tuple[int, str], list[str]] = {}
        for p in self.pending.values():
            if p.attached_to is not None:
                attached.setdefault(p.attached_to, []).append(p.request_id)
        return {
            "pending": [
                self._shown(
                    call,
                    p.to_dict(now)
                    | p.attachment()
                    | {"attached": sorted(attached.get((p.peer.uid, p.request_id), []))},
                )
                for p in sorted(self.pending.values(), key=lambda p: p.created)
            ]
        }

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
            "policy": {
                "default": self.policy.default,
                "rules": len(self.policy.rules),
                "sources": list(self.policy.sources),
            },
            # Where the relay reports (relay/state.py); `airlock status` reads it on this host.
            "relay": {
                "channels": [c["name"] for c in self.config.notify.channels],
                "state_dir": str(self.config.notify.state_dir),
            },
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
        try:
            out["journal"]["disk"] = await self.journal.call("disk", {}, timeout=5)
        except AirlockError as exc:
            out["journal"]["disk"] = {"error": exc.message}
        for name, door in (("intake", "agent"), ("runner", "runner")):
            try:
                listening = stat.S_ISSOCK(os.stat(self.config.socket_path(door)).st_mode)
            except OSError:
                listening = False
            out[name] = {"state": "listening" if listening else "missing"}
        return out

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
        subject = subject_of(peer, spec, validate.optional_text("session", a.get("session")))
        decision = self.policy.decide(subject, stages)
        await self._hold_restored()
        # Issue 34: what the reviewer may do with it, and what each matching shadow rule would decide.
        extra: dict[str, Any] = {"shadow": self.policy.shadow_verdicts(subject, stages)}
        if decision.decision == "ask":
            extra["reviewer_may"] = self.policy.reviewer_may(decision)
        return (
            decision.to_dict() | {"hold": self.hold_reason is not None, "warnings": list(self.policy.warnings)} | extra
        )

    async def events(self, call: Call) -> dict[str, Any]:
        unknown = sorted(set(call.args) - {"after", "tail", "limit", "scope"})
        if unknown:
            raise validate.bad(unknown[0], "unknown argument (known: after, tail, limit, scope)")
        return await self.journal.call("events", call.args)

    async def show(self, call: Call) -> dict[str, Any]:
        """A request's story by its request or operation ID; a person may type a unique prefix of a
        request pending now (refs.py), never of an operation ID or a settled request."""
        ref = validate.text("ref", call.args.get("ref"), max_len=256, allow_empty=False)
        now = time.time()
        named = self._named(ref)
        if named is not None:
            return self._shown(call, await self._show_pending(named, now))
        for entry in self.pending.values():
            if ref == entry.operation_id:
                return self._shown(call, await self._show_pending(entry, now))
        events = await self._one_agents_events(ref)
        if not events:
            events = await self.lookup.operation_events(ref)
        if events:
            return trail.summarise(events)
        settled, unsure = self.ledger.settled_since(now - refs.window(self.config.approval.timeout_seconds))
        entry = refs.by_prefix(ref, self.pending.values(), settled, unsure)
        return self._shown(call, await self._show_pending(entry, now))

    async def _request_events(self, ref: str) -> list[dict[str, Any]]:
        """A request's events by request ID (or ``AGENT/ID``), else by operation ID: for output.py."""
        return await self._one_agents_events(ref) or await self.lookup.operation_events(ref)

    async def _one_agents_events(self, ref: str) -> list[dict[str, Any]]:
        """The journal events of the request ``ref`` names: an ID one agent used, or ``AGENT/ID``.

        Request IDs are each agent's own (issue 27): an ID several agents used
        names several stories, and is refused with their owners.
        """
        events = await self.lookup.request_events(ref)
        if not events and "/" in ref:
            owner, _, bare = ref.partition("/")
            uid = _agent_uid(owner)
            return [e for e in await self.lookup.request_events(bare) if _agents(e, uid)] if uid is not None else []
        owners: list[int] = sorted(
            {
                e["peer_uid"]
                for e in events
                if e.get("kind") == "request.received" and isinstance(e.get("peer_uid"), int)
            }
        )
        if len(owners) > 1:
            names = [user_name(uid) for uid in owners]
            raise AirlockError(
                ErrorCode.CONFLICT,
                f"request ID {ref!r} was used by {len(owners)} agents ("
                + ", ".join(f"{n} uid {u}" for n, u in zip(names, owners, strict=True))
                + "); name one as AGENT/ID: "
                + ", ".join(f"{n}/{ref}" for n in names),
                {
                    "owners": [{"user": n, "uid": u} for n, u in zip(names, owners, strict=True)],
                    "references": [f"{n}/{ref}" for n in names],
                },
            )
        return events

    async def _show_pending(self, entry: Pending, now: float) -> dict[str, Any]:
        # Only this agent's story: another agent may have used the same request ID.
        events = [e for e in await self.lookup.request_events(entry.request_id) if _agents(e, entry.peer.uid)]
        shown = trail.summarise(events) if events else {}
        return shown | {
            "request_id": entry.request_id,
            "operation_id": entry.operation_id,
            "expect": entry.expect,
            "state": "pending",
            "settled": False,
            "pending": True,
            "peer": entry.peer.to_dict(),
            "session": entry.request.get("session") or "",
            "reason": entry.request.get("reason") or "",
            "request": entry.request,
            "detail": entry.to_dict(now) | entry.attachment(),
            "events": events,
        }

    async def cancel(self, call: Call) -> dict[str, Any]:
        op = validate.text("operation_id", call.args.get("operation_id"), max_len=256, allow_empty=False)
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        operator = call.peer
        waiting = [p for p in self.pending.values() if p.operation_id == op]
        if not waiting and "/" in op:  # AGENT/OPERATION, when agents share an operation ID
            owner, _, bare = op.partition("/")
            waiting = [
                p for p in self.pending.values() if p.operation_id == bare and owner in (p.peer.user, str(p.peer.uid))
            ]
            op = bare if waiting else op
        if len(waiting) > 1:
            raise AirlockError(
                ErrorCode.CONFLICT,
                f"operation {op!r} is pending for {len(waiting)} agents; name one as AGENT/OPERATION: "
                + ", ".join(f"{p.peer.user}/{op}" for p in waiting),
                {"owners": [{"user": p.peer.user, "uid": p.peer.uid} for p in waiting]},
            )
        named = next((p for p in self.pending.values() if p.request_id == op), None)
        if not waiting and named is not None and not named.future.done():
            # A person typed the request ID `airlock pending` shows: say which ID cancel takes,
            # rather than the runner's "not running" (the walk of issue 32).  Nothing is decided.
            raise AirlockError(
                ErrorCode.NOT_FOUND,
                f"{op!r} is a pending request's ID; cancel takes its operation ID {named.operation_id!r} "
                f"(airlock cancel {named.operation_id}), or deny it: airlock deny {op}",
                {"request_id": op, "operation_id": named.operation_id},
            )
        await self.audit.record(
            "operator.action",
            Ids(waiting[0].request_id if waiting else None, op, operator.uid),
            payload={"action": "cancel", "operator": operator.user, "reason": reason}
            | ({"agent_uid": waiting[0].peer.uid} if waiting else {}),
        )
        if waiting and not waiting[0].future.done():
            # Not running yet: cancelling a pending request is denying it.
            why = "cancelled by the operator" + (f": {reason}" if reason else "")
            waiting[0].solo = True  # one operation: requests attached to it keep waiting (issue 34)
            waiting[0].future.set_result(("deny", operator.user, operator.uid, why))
            return {"operation_id": op, "cancelling": True, "was": "pending"}
        data = await runner_wire.stub(self.runner).call(runner_wire.CANCEL, runner_wire.Cancel(op))
        return data.to_dict() | {"was": "running"}

    async def kill(self, call: Call) -> dict[str, Any]:
        """Signal a running job (issue 35): ``ref`` is its request or operation ID (``AGENT/ID`` when
        agents share it), ``signal`` TERM by default.  Journaled (who, signal, why) before the signal goes."""
        ref = validate.text("ref", call.args.get("ref"), max_len=256, allow_empty=False)
        reason = validate.text("reason", call.args.get("reason") or "", max_len=1024)
        signame = call.args.get("signal")
        operator = call.peer
        args = runner_wire.Kill(ref=ref, by=operator.user, reason=reason, signal=signame)
        owner, _, bare = ref.rpartition("/")
        if owner:
            uid = _agent_uid(owner)
            if uid is None:
                raise AirlockError(ErrorCode.NOT_FOUND, f"no such agent {owner!r}")
            args = dataclasses.replace(args, ref=bare, uid=uid)
        runner = runner_wire.stub(self.runner)
        job = (await runner.call(runner_wire.KILL, dataclasses.replace(args, dry=True))).to_dict()
        await self.audit.record(
            "operator.action",
            Ids(job.get("request_id"), job.get("operation_id"), operator.uid),
            payload={
                "action": "kill",
                "operator": operator.user,
                "reason": reason,
                "signal": str(signame or "TERM"),
                "agent_uid": job.get("agent_uid"),
            },
        )
        return (await runner.call(runner_wire.KILL, args)).to_dict()

    async def running(self, call: Call) -> dict[str, Any]:
        """The commands running now (the runner's list): for `airlock watch`'s kill key and for reading."""
        return (await runner_wire.stub(self.runner).call(runner_wire.RUNNING, Empty())).to_dict()

    async def token_issue(self, call: Call) -> dict[str, Any]:
        session = validate.text("session", call.args.get("session"), max_len=256, allow_empty=False)
        ttl = call.args.get("ttl_seconds", DEFAULT_TTL_SECONDS)
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 1 <= ttl <= MAX_TTL_SECONDS:
            raise validate.bad("ttl_seconds", f"must be a number of seconds from 1 to {MAX_TTL_SECONDS}")
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        user, uid = _token_holder(call.args.get("user"))
        token = new_token()
        now = time.time()
        expires_at = iso_utc(now + ttl, timespec="seconds")
        # Journaled before it is usable; the record holds a short hash prefix, never the token.
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid, session=session),
            payload={
                "action": "token.issue",
                "operator": call.peer.user,
                "reason": reason,
                "token_id": token_hash(token)[:16],
                "expires_at": expires_at,
                "user": user,
                "uid": uid,
            },
        )
        self.tokens.issue(token, session, uid, float(ttl), now)
        return {
            "token": token,
            "token_id": token_hash(token)[:16],
            "session": session,
            "user": user,
            "uid": uid,
            "expires_at": expires_at,
        }

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
        """intake asks: which session does this token stand for, presented by this uid?

        ``uid`` is the agent's, from the kernel at intake's accept.  Any failure,
        a token presented by another uid included, is `unauthorized`.
        """
        if self.intake_uid is None or call.peer.uid != self.intake_uid:
            raise unauthorized()
        token, uid = call.args.get("token"), call.args.get("uid")
        if not isinstance(token, str) or not token or len(token) > 256:
            raise unauthorized()
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
            raise unauthorized()
        return {"session": self.tokens.check(token, uid, time.time())}

    async def audit_verify(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("verify", call.args, timeout=600)

    async def audit_archive(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("archive", call.args, timeout=600)

    async def audit_head(self, call: Call) -> dict[str, Any]:
        return await self.journal.call("head", {})

    def operator_verbs(self, decides: Callable[[Peer], bool]) -> dict[str, Verb]:
        """The operator door's table, built from `wire.operator`'s declarations: none for a token; each
        verb refuses a caller its declaration does not name (an observer: not ``decides``)."""
        web_user = self.config.web.user

        def caller_of(peer: Peer) -> frozenset[Caller]:
            if decides(peer):
                return frozenset({Caller.OPERATOR})
            if peer.user == web_user and peer.uid != 0:
                return frozenset({Caller.OBSERVER, Caller.WEB})
            return frozenset({Caller.OBSERVER})

        handlers = {
            op.STATUS: self.status,
            op.PENDING: self.list_pending,
            op.SHOW: self.show,
            op.STATEMENT: self.statement,
            op.GRANTS: self.list_grants,
            op.GRANT_REVOKE: self.revoke_grant,
            op.APPROVE: self.approve,
            op.DENY: self.deny,
            op.CANCEL: self.cancel,
            op.KILL: self.kill,
            op.RUNNING: self.running,
            op.HOLD: self.hold,
            op.RELEASE: self.release,
            op.POLICY_CHECK: self.policy_check,
            op.EVENTS: self.events,
            op.AUDIT_VERIFY: self.audit_verify,
            op.AUDIT_HEAD: self.audit_head,
            op.AUDIT_ARCHIVE: self.audit_archive,
            op.TOKEN_ISSUE: self.token_issue,
            op.TOKEN_REVOKE: self.token_revoke,
            op.OUTPUT: self.output,
            op.LOGS: self.logs,
            op.PASSKEY_ENROLL: self.passkey_enroll,
            op.PASSKEY_ENROLL_WAIT: self.passkey_enroll_wait,
            op.PASSKEY_REGISTER_BEGIN: self.passkey_register_begin,
            op.PASSKEY_REGISTER_FINISH: self.passkey_register_finish,
            op.PASSKEY_LOGIN_BEGIN: self.passkey_login_begin,
            op.PASSKEY_LOGIN_FINISH: self.passkey_login_finish,
            op.PASSKEY_DECIDE_BEGIN: self.passkey_decide_begin,
            op.PASSKEY_DECIDE: self.passkey_decide,
            op.PASSKEY_LIST: self.passkey_list,
            op.PASSKEY_REVOKE: self.passkey_revoke,
        }
        table = wire.serve(
            op.DOOR,
            {verb: wire.untyped(handler) for verb, handler in handlers.items()},
            caller_of=caller_of,
            refuse=_observers_only_read,
        )
        return {name: _operator_only(served) for name, served in table.items()}


def _operator_only(verb: Verb) -> Verb:
    """Tokens belong to agents: one on the operator socket is refused like any stranger."""

    async def checked(call: Call) -> dict[str, Any]:
        if call.request.token is not None:
            raise unauthorized()
        return await verb(call)

    return checked


def _observers_only_read(verb: wire.Verb[Any, Any]) -> AirlockError:
    """What an observer gets for a verb that changes something (`wire.operator` declares who may call what)."""
    return AirlockError(ErrorCode.UNAUTHORIZED, "observers may only read (status, pending, show, events)")


def _agent_uid(owner: str) -> int | None:
    """The uid an ``AGENT/ID`` reference's agent part names (a user name or uid); None if no such user."""
    return int(owner) if owner.isdigit() else uid_of(owner)


def _agents(event: dict[str, Any], uid: int) -> bool:
    """Whether a journal event belongs to agent ``uid``'s request: an operator's action names the
    agent it acted for (``agent_uid``); every other record of a request carries the agent's uid."""
    if event.get("kind") == "operator.action":
        payload = event.get("payload")
        agent = payload.get("agent_uid") if isinstance(payload, dict) else None
        return agent is None or agent == uid  # older records name no agent: kept
    return event.get("peer_uid") in (None, uid)


def _peer_for_user(user: str) -> Peer:
    import pwd

    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise validate.bad("user", f"no such user {user!r}") from None
    return identify(0, entry.pw_uid, entry.pw_gid)


def _token_holder(raw: object) -> tuple[str, int]:
    """The agent account a token is issued for: a user name or uid that exists here."""
    text = validate.text("user", raw, max_len=256, allow_empty=False)
    uid = uid_of(text)
    if uid is None:
        raise validate.bad("user", f"no such user {text!r}: a token is issued for an existing agent account")
    return user_name(uid), uid

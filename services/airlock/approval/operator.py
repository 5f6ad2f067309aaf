"""The operators' verbs on operator.sock, and the table that serves them.

`Operating` is the operators' side of approval (intake's is
`decide.Deciding`), handed what it shares:
``pending``, ``show``, ``approve``/``deny``, ``cancel``, ``status``,
``policy.check``, ``events``, ``audit.*``, ``kill``, ``running``.  The
session tokens' verbs are `sessions.SessionTokens`'; ``hold`` and
``release`` are `tickets.TicketBook`'s; the ``passkey.*`` verbs are
`passkeys.Passkeys`'; ``statement``, ``grants`` and ``grant.revoke`` are in
`votes`.  `Operating.operator_verbs` is the operator
door's verb table, built from `common.wire.operator`'s declarations: a token
is refused there, an observer may call only what the declarations let it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from airlock.approval import ballot, fileop_review, quorum, refs
from airlock.approval.asked import subject_of
from airlock.approval.hostactions import HostActions
from airlock.approval.lookup import JournalLookup
from airlock.approval.output import OutputReads
from airlock.approval.parts import Books, Live, Outside
from airlock.approval.passkeyimport import PasskeyImport
from airlock.approval.passkeys import Passkeys
from airlock.approval.pending import Pending
from airlock.approval.rules import Policy
from airlock.approval.servicestate import services_state
from airlock.approval.table import PendingTable, check_expected
from airlock.approval.tokens import unauthorized
from airlock.approval.transitions import Outcome
from airlock.approval.verdict import Decided
from airlock.approval.votes import Signed, Votes
from airlock.common import trail, validate
from airlock.common.audit import Ids
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer, identify, may_decide
from airlock.common.server import Call, Verb
from airlock.common.spec import ExecSpec
from airlock.common.wire import journal as jwire
from airlock.common.wire import operator as op
from airlock.common.wire import runner as runner_wire
from airlock.common.wire import verb as wire
from airlock.common.wire.verb import Caller, Empty


class Operating:
    """The operators' verbs on operator.sock, handed what they share with intake's side."""

    def __init__(
        self, live: Live, outside: Outside, pending: PendingTable, books: Books, votes: Votes, passkeys: Passkeys
    ) -> None:
        self.live = live  # a reload replaces config and policy: read when used
        self.audit, self.journal, self.runner = outside.audit, outside.journal, outside.runner
        self.lookup = JournalLookup(outside.journal)
        self.pending = pending  # settles every pending request (table.py)
        self.book, self.grants, self.ledger, self.sessions = books.tickets, books.grants, books.ledger, books.sessions
        self.votes = votes
        self.passkeys = passkeys
        self.actions = HostActions(passkeys, self, books.tickets)  # issue 49: a fleet console's kill, hold, release
        self.outputs = OutputReads(outside.audit, outside.runner, self._request_events)

    @property
    def config(self) -> Config:
        return self.live.config

    @property
    def policy(self) -> Policy:
        return self.live.policy

    async def _settle(self, call: Call, args: op.Decision, verdict: str) -> op.Vote:
        if args.signature is not None:
            # The self-approval check is the signer's person's (`quorum.Tally.check`), not the submitter's;
            # a signature carries no grant (`op.Decision.check`).
            signed = Signed(args.id, args.signature, args.reason or "", args.principal, args.expect)
            return op.Vote(await self.votes.settle_signed(call, signed, (verdict,), via="operator", carrier=call.peer))
        entry = self.pending.find(args.id, args.expect)
        await check_expected(self.audit, call, entry, "approve" if verdict == "allow" else "deny", args.expect)
        reason = args.reason or ""
        operator = call.peer
        if operator.uid == entry.peer.uid and not self.config.approval.allow_self_approval and verdict == "allow":
            raise AirlockError(ErrorCode.UNAUTHORIZED, "operators cannot approve their own requests")
        if not self.pending.is_open(entry):
            raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
        voter = quorum.Voter(operator.uid, operator.user, frozenset(operator.groups))  # the person is the account
        grant = None
        if verdict == "allow":
            ballot.require_operator_reason(self.config.approval, entry, reason)
            grant = self.grants.asked_for(
                entry, operator, args.grant_seconds, args.scope, args.uses, self.config.approval.max_grant_seconds
            )  # the arguments first, then who votes
            ballot.check_vote(self.config.approval, entry, voter)
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
            | ballot.progress(entry, verdict)
            | ({"grant_id": grant.grant_id} if grant else {}),
        )
        if grant is not None and self.pending.is_open(entry):
            await self.grants.make(grant, ids, operator.user, reason)
        out = ballot.count(self.config.approval, self.pending, entry, verdict, voter, reason)
        return op.Vote(out | ({"grant": grant.to_dict()} if grant is not None else {}))

    async def approve(self, call: Call, args: op.Decision) -> op.Vote:
        return await self._settle(call, args, "allow")

    async def deny(self, call: Call, args: op.Decision) -> op.Vote:
        return await self._settle(call, args, "deny")

    def _decides(self, call: Call) -> bool:
        o = self.config.operators
        return may_decide(call.peer, o.users, o.groups, o.observers.users)

    def _shown(self, call: Call, shown: dict[str, Any]) -> dict[str, Any]:
        """A pending request as this peer may see it: file content (a write's diff) only for operators."""
        return shown if self._decides(call) else fileop_review.for_observer(shown)

    async def list_pending(self, call: Call, args: Empty) -> op.PendingList:
        now = time.time()
        # Issue 34: a request attached to an identical one is listed with ``attached_to`` (the console, the
        # relay and the hook do not ask about it), and the first names it under ``attached``.
        attached: dict[tuple[int, str], list[str]] = {}
        for p in self.pending.values():
            if p.attached_to is not None:
                attached.setdefault(p.attached_to, []).append(p.request_id)
        listed = {
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
        note = self.policy.standing.sentence()  # issue 44: refused files on disk; pending's header says so
        return op.PendingList(listed | ({"policy_note": note} if note else {}))

    async def status(self, call: Call, args: Empty) -> op.StatusReport:
        hold = await self.book.current()
        now = time.time()
        held = hold.held
        return op.StatusReport(
            hold=held,
            hold_reason=hold.reason,
            hold_by=hold.by.get("operator") if held else None,
            hold_uid=hold.by.get("uid") if held else None,
            hold_since=hold.by.get("since") if held else None,
            pending=len(self.pending),
            config_refused=self.config.refused or None,  # issue 44: running on a kept copy or the defaults
            tokens=self.sessions.store.live(now),
            grants=len(self.grants.live(now)),
            services=await services_state(self.config, self.journal),
            policy={
                "default": self.policy.default,
                "rules": len(self.policy.rules),
                "sources": list(self.policy.sources),
                "standing": self.policy.standing.to_dict(),  # issue 44
            },
            # Where the relay reports (relay/state.py; `airlock status` reads it on this host), and
            # approval's wait for a person, with why when notify.channels chose it (issue 44).
            relay={
                "channels": [c["name"] for c in self.config.notify.channels],
                "state_dir": str(self.config.notify.state_dir),
                "approval_timeout_seconds": self.config.approval.timeout_seconds,
                "approval_timeout_why": dict(self.config.derived).get("approval.timeout_seconds"),
            },
        )

    async def policy_check(self, call: Call, args: op.PolicyCheck) -> op.Checked:
        user = args.user or call.peer.user
        peer = _peer_for_user(user)
        privileged = True if args.privileged is None else args.privileged
        stages = args.stages
        spec = ExecSpec(
            mode="exec",
            stages=stages,
            privileged=privileged,
            uid=peer.uid,
            cwd=args.cwd or None,
            stdin=args.stdin or None,
        )
        subject = subject_of(peer, spec, args.session)
        decision = self.policy.decide(subject, stages)
        held = (await self.book.current()).held
        # Issue 34: what the reviewer may do with it, and what each matching shadow rule would decide.
        extra: dict[str, Any] = {"shadow": self.policy.shadow_verdicts(subject, stages)}
        if decision.decision == "ask":
            extra["reviewer_may"] = self.policy.reviewer_may(decision)
        extra |= {"checked_as": {"user": user, "uid": peer.uid}, "policy_note": self.policy.standing.sentence()}
        return op.Checked(decision.to_dict() | {"hold": held, "warnings": list(self.policy.warnings)} | extra)

    async def events(self, call: Call, args: op.Events) -> jwire.Page:
        return await self.journal.call(jwire.EVENTS, args)

    async def show(self, call: Call, args: op.Show) -> op.Story:
        """A request's story by its request or operation ID; a person may type a unique prefix of a
        request pending now (refs.py), else of one request in the journal (lookup.py), never of an operation ID."""
        return op.Story(await self._story(call, args.ref, stdin=args.stdin is True))

    async def _story(self, call: Call, ref: str, *, stdin: bool) -> dict[str, Any]:
        now = time.time()
        if stdin:  # issue 45: a pending request's whole stdin, operators only
            return self.pending.stdin(ref, operator=self._decides(call))
        named = self.pending.named(ref)
        if named is not None:
            return self._shown(call, await self._show_pending(named, now))
        for entry in self.pending.values():
            if ref == entry.operation_id:
                return self._shown(call, await self._show_pending(entry, now))
        events = await self.lookup.one_agents(ref) or await self.lookup.operation_events(ref)
        if events:
            return trail.summarise(events)
        settled, unsure = self.ledger.settled_since(now - refs.window(self.config.approval.timeout_seconds))
        try:
            entry = refs.by_prefix(ref, self.pending.values(), settled, unsure)
        except AirlockError as exc:
            # No pending request starts so: one request in the journal may (issue 44), else not found.
            events = await self.lookup.prefixed(ref) if exc.code is ErrorCode.NOT_FOUND else []
            if not events:
                raise
            return trail.summarise(events)
        return self._shown(call, await self._show_pending(entry, now))

    async def _request_events(self, ref: str) -> list[dict[str, Any]]:
        """A request's events by request ID (or ``AGENT/ID``), operation ID or a prefix naming one: for output.py."""
        return (
            await self.lookup.one_agents(ref)
            or await self.lookup.operation_events(ref)
            or await self.lookup.prefixed(ref)
        )

    async def _show_pending(self, entry: Pending, now: float) -> dict[str, Any]:
        # Only this agent's story: another agent may have used the same request ID.
        events = [e for e in await self.lookup.request_events(entry.request_id) if refs.belongs_to(e, entry.peer.uid)]
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

    async def cancel(self, call: Call, args: op.Cancel) -> op.Cancelled:
        return op.Cancelled.from_dict(await self._cancel(call, args.operation_id, args.reason or ""))

    async def _cancel(self, call: Call, op: str, reason: str) -> dict[str, Any]:
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
        if not waiting and named is not None and self.pending.is_open(named):
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
        if waiting and self.pending.is_open(waiting[0]):
            # Not running yet: cancelling a pending request is denying it.
            why = "cancelled by the operator" + (f": {reason}" if reason else "")
            waiting[0].solo = True  # one operation: requests attached to it keep waiting (issue 34)
            self.pending.settle(waiting[0], Outcome(Decided.DENY, operator.user, operator.uid, why))
            return {"operation_id": op, "cancelling": True, "was": "pending"}
        data = await runner_wire.stub(self.runner).call(runner_wire.CANCEL, runner_wire.Cancel(op))
        return data.to_dict() | {"was": "running"}

    async def kill(self, call: Call, args: op.Kill) -> runner_wire.Killed:
        """Signal a running job (issue 35): ``ref`` is its request or operation ID (``AGENT/ID`` when
        agents share it), ``signal`` TERM by default.  Journaled (who, signal, why) before the signal goes."""
        kill, job = await self.kill_target(call.peer, args.ref, args.signal, args.reason or "")
        return await self.kill_as(call.peer, kill, job)

    async def kill_target(
        self, who: Peer, ref: str, signame: str | None, reason: str
    ) -> tuple[runner_wire.Kill, dict[str, Any]]:
        """The runner's kill of the job ``ref`` names, by ``who``, and that job (a dry run: nothing is signalled)."""
        kill = runner_wire.Kill(ref=ref, by=who.user, reason=reason, signal=signame)
        owner, _, bare = ref.rpartition("/")
        if owner:
            uid = refs.agent_uid(owner)
            if uid is None:
                raise AirlockError(ErrorCode.NOT_FOUND, f"no such agent {owner!r}")
            kill = dataclasses.replace(kill, ref=bare, uid=uid)
        return kill, await self.kill_dry(kill)

    async def kill_dry(self, kill: runner_wire.Kill) -> dict[str, Any]:
        """The job ``kill`` would signal now (the runner's dry run; `not_found` when none runs)."""
        dry = dataclasses.replace(kill, dry=True)
        return (await runner_wire.stub(self.runner).call(runner_wire.KILL, dry)).to_dict()

    async def kill_as(
        self, who: Peer, kill: runner_wire.Kill, job: dict[str, Any], extra: dict[str, Any] | None = None
    ) -> runner_wire.Killed:
        """Journal the kill of ``job`` by ``who`` (issue 49: the person whose passkey signed it, ``extra``
        saying how), then signal it."""
        await self.audit.record(
            "operator.action",
            Ids(job.get("request_id"), job.get("operation_id"), who.uid),
            payload={
                "action": "kill",
                "operator": who.user,
                "reason": kill.reason,
                "signal": str(kill.signal or "TERM"),
                "agent_uid": job.get("agent_uid"),
            }
            | (extra or {}),
        )
        return await runner_wire.stub(self.runner).call(runner_wire.KILL, dataclasses.replace(kill, by=who.user))

    async def running(self, call: Call, args: Empty) -> runner_wire.Running:
        """The commands running now (the runner's list): for `airlock watch`'s kill key and for reading."""
        return await runner_wire.stub(self.runner).call(runner_wire.RUNNING, Empty())

    async def audit_verify(self, call: Call, args: op.Verify) -> op.AuditReport:
        return op.AuditReport((await self.journal.call(jwire.VERIFY, args, timeout=600)).report)

    async def audit_archive(self, call: Call, args: op.Archive) -> op.AuditReport:
        return op.AuditReport((await self.journal.call(jwire.ARCHIVE, args, timeout=600)).report)

    async def audit_head(self, call: Call, args: Empty) -> jwire.Head:
        return await self.journal.call(jwire.HEAD, Empty())

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

        handlers: dict[wire.Verb[Any, Any], wire.Handler[Any, Any]] = {
            op.STATUS: self.status,
            op.PENDING: self.list_pending,
            op.SHOW: self.show,
            op.STATEMENT: self.votes.statement,
            op.GRANTS: self.votes.list_grants,
            op.GRANT_REVOKE: self.votes.revoke_grant,
            op.APPROVE: self.approve,
            op.DENY: self.deny,
            op.CANCEL: self.cancel,
            op.KILL: self.kill,
            op.RUNNING: self.running,
            op.HOLD: self.book.hold,
            op.RELEASE: self.book.release,
            op.POLICY_CHECK: self.policy_check,
            op.EVENTS: self.events,
            op.AUDIT_VERIFY: self.audit_verify,
            op.AUDIT_HEAD: self.audit_head,
            op.AUDIT_ARCHIVE: self.audit_archive,
            op.TOKEN_ISSUE: self.sessions.issue,
            op.TOKEN_REVOKE: self.sessions.revoke,
            op.OUTPUT: self.outputs.output,
            op.LOGS: self.outputs.logs,
            op.PASSKEY_ENROLL: self.passkeys.passkey_enroll,
            op.PASSKEY_ENROLL_WAIT: self.passkeys.passkey_enroll_wait,
            op.PASSKEY_REGISTER_BEGIN: self.passkeys.passkey_register_begin,
            op.PASSKEY_REGISTER_FINISH: self.passkeys.passkey_register_finish,
            op.PASSKEY_LOGIN_BEGIN: self.passkeys.passkey_login_begin,
            op.PASSKEY_LOGIN_FINISH: self.passkeys.passkey_login_finish,
            op.PASSKEY_DECIDE_BEGIN: self.passkeys.passkey_decide_begin,
            op.PASSKEY_DECIDE: self.passkeys.passkey_decide,
            op.PASSKEY_LIST: self.passkeys.passkey_list,
            op.PASSKEY_REVOKE: self.passkeys.passkey_revoke,
            op.PASSKEY_SESSION: self.passkeys.consoles.session,
            op.PASSKEY_SESSIONS_END: self.passkeys.consoles.sessions_end,
            op.PASSKEY_IMPORT: PasskeyImport(self.passkeys).passkey_import,  # issue 49
            op.PASSKEY_ACT_BEGIN: self.actions.act_begin,
            op.PASSKEY_ACT: self.actions.act,
        }
        table = wire.serve(op.DOOR, handlers, caller_of=caller_of, refuse=_observers_only_read)
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


def _peer_for_user(user: str) -> Peer:
    import pwd

    try:
        entry = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise validate.bad("user", f"no such user {user!r}") from None
    return identify(0, entry.pw_uid, entry.pw_gid)

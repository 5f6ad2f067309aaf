"""Deciding: the policy's verdict on a request, and waiting for operators.

`Deciding` is a part of `airlock.approval.service.Approval` (its mixin):
intake's ``decide`` (the policy decides; a grant may stand in for an
operator; an ``ask`` waits as a `Pending` request for operators or a quorum,
within ``approval.timeout_seconds``) and ``withdraw`` (the agent went away).
Pending requests are keyed by (agent uid, request ID): one agent's IDs
neither collide with nor reveal another's (issue 27).
A decision is journaled before it is returned; an allow carries a ticket
(`tickets`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from airlock.approval import fileop_review, hook, quorum, reviewer
from airlock.approval.asks import Admission, AskLimits
from airlock.approval.pending import Pending, bind_binaries, check_chains, describe_binaries
from airlock.approval.rules import UNRESOLVED_RULE, Decision, Policy, Subject
from airlock.approval.table import PendingTable
from airlock.approval.tickets import TicketBook
from airlock.approval.verdict import By, Decided, Ruling, asking_rules, verdict
from airlock.approval.votes import Votes
from airlock.common import arguments, validate
from airlock.common.audit import Ids, marks_of
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client
from airlock.common.peer import Peer
from airlock.common.resolve import default_path
from airlock.common.server import Call
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire


def subject_of(peer: Peer, spec: ExecSpec | FileSpec, session: str | None) -> Subject:
    return Subject(
        uid=peer.uid,
        user=peer.user,
        groups=frozenset(peer.groups),
        session=session or None,
        privileged=spec.privileged,
        target_uid=spec.run_as,
    )


@dataclass(frozen=True, slots=True)
class Asked:
    """One ``decide`` call's request, checked once: every step after the checks reads it from here."""

    request: dict[str, Any]  # as intake sent it (what operators are shown)
    spec: ExecSpec | FileSpec
    peer: Peer  # the agent (intake names it; its uid is the spec's)
    session: str | None
    digest: str  # the spec's, computed once here
    decision: Decision  # the policy's (an allow whose arguments others can change became an ask)
    bound: dict[str, Any]  # what approval resolved beyond the request, bound to the ticket
    ids: Ids
    after: list[str] | None  # intake's deferred marks the decision's records name


def policy_refusal(decision: Decision, spec: ExecSpec | FileSpec, rule: str) -> AirlockError:
    """What the agent is told of a policy's deny: a missing program as a shell says it, else the rule."""
    if rule == UNRESOLVED_RULE and isinstance(spec, ExecSpec):
        return not_found(decision, spec)
    return AirlockError(ErrorCode.DENIED, f"denied by policy rule {rule!r}", {"rule": rule, "decided_by": "policy"})


def not_found(decision: Decision, spec: ExecSpec) -> AirlockError:
    """A program that is not there: said as a shell says it, not as a policy decision (issue 32).

    Still journaled as the ``unresolved`` pseudo-rule's deny: nothing ran, and a
    program that appears there later was never approved.
    """
    missing = next(stage for stage in decision.stages if stage.resolved is None)
    program = missing.argv[0]
    searched = default_path(spec.run_as)
    where = (
        f"an absolute path is needed; {program!r} is relative"
        if "/" in program and not program.startswith("/")
        else f"no such executable file {program!r}"
        if "/" in program
        else f"searched {'root' if spec.run_as == 0 else 'the user'}'s secure PATH {searched}"
    )
    return AirlockError(
        ErrorCode.COMMAND_NOT_FOUND,
        f"{program}: command not found ({where}); nothing ran",
        {"program": program, "searched": searched, "rule": UNRESOLVED_RULE, "decided_by": "policy"},
    )


class Deciding(Votes):
    """intake's side of `Approval`; the attributes below are `Approval`'s."""

    policy: Policy
    pending: PendingTable
    notifier: hook.NotifyCommand
    runner: Client
    journal: Client
    intake_uid: int | None
    asks: AskLimits
    book: TicketBook
    denials: collections.OrderedDict[tuple[int, str], float]

    def _ttl(self) -> float:
        return self.config.approval.ticket_ttl_seconds

    async def decide(self, call: Call, args: wire.Decide) -> wire.Decided:
        """intake's request to decide (`wire.approval.DECIDE`): the typed message is the door's check of
        its shape; the spec's own fields are checked here again (approval does not trust intake)."""
        # A file operation (issue 10) carries its spec as "file"; a command as "spec".
        spec: ExecSpec | FileSpec = (
            FileSpec.from_dict(args.file) if args.file is not None else ExecSpec.from_dict(args.spec)
        )
        try:
            peer = Peer.from_dict(args.peer.to_dict())
        except ValueError as exc:
            raise validate.bad("peer", str(exc)) from None
        if peer.uid != spec.uid:
            raise validate.bad("peer", "does not match the spec's uid")
        request_id = validate.request_id("request_id", args.request.request_id)
        operation_id = validate.optional_text("operation_id", args.operation_id, max_len=256)
        session = validate.optional_text("session", args.request.session, max_len=256)
        request = operator_view(args.request, spec)
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
            bound |= credentials_bound(decision)  # issue 35: which files the job's units load
            changeable = await self._inspect_arguments(spec, bound["binaries"]) if spec.privileged else []
            if changeable:
                # Bound by identity and content, checked again by the runner (issue 27).
                bound["arguments"] = changeable
                touched = {int(item["stage"]) for item in changeable}
                if decision.decision == "allow" and not self.policy.allows_writable(decision, touched):
                    # What the job reads can change after this check: a person decides, unless the rule said so.
                    decision = dataclasses.replace(decision, decision="ask")
            if spec.privileged and decision.decision == "ask":
                check_chains(decision)  # not worth an operator's time if the runner will refuse it
        await self.book.hold_restored()
        asked = Asked(
            request,
            spec,
            peer,
            session,
            digest,
            decision,
            bound,
            Ids(request_id, operation_id, peer.uid, session),
            # intake's deferred request.received (issue 21): the decision's records name its
            # mark, so none is journaled (nor a ticket issued) if the journal lost it.
            marks_of(list(args.after)),
        )
        ruling = self._rule_on(asked)
        if ruling.problem is not None:
            await self._deny_for_reason(decision, ruling.problem, asked.ids, after=asked.after)
        if ruling.by is By.GRANT:
            return await self._allow_by_grant(asked, ruling)
        if ruling.decided is Decided.ASK:
            return await self._ask(call, asked, ruling.rule)
        return await self._by_policy(asked, ruling)

    def _rule_on(self, asked: Asked) -> Ruling:
        """The verdict (`verdict.verdict`) on a request as it arrives.

        Synchronous from the grant's lookup to its use (`_allow_by_grant` takes
        it before any await): two requests racing for a grant's last use
        cannot both have it.
        """
        held = self.book.held
        decision, spec = asked.decision, asked.spec
        requirement = self.policy.requirement(decision)
        problem = None
        if requirement.reason and decision.decision != "deny":
            problem = quorum.reason_problem(asked.request.get("reason"), self.config.approval.min_reason_length)
        candidate = None
        if decision.decision == "ask" and not held and isinstance(spec, ExecSpec):
            found = self.grants.find
            candidate = found(
                time.time(), asked.peer.uid, asked.session, asked.digest, decision.rule, asking_rules(decision)
            )
        return verdict(
            decision,
            held,
            candidate,
            requirement,
            reason_problem=problem,
            changeable=bool(asked.bound.get("arguments")),
            command=isinstance(spec, ExecSpec),
        )

    async def _allow_by_grant(self, asked: Asked, ruling: Ruling) -> wire.Decided:
        """A grant stands in for an operator: one use taken, journaled (durable), a ticket issued."""
        granted = ruling.grant
        assert granted is not None
        number, _last = self.grants.take(granted)  # before any await (see _rule_on)
        rule = ruling.rule
        # Durable (not deferred like a rule's allow): a grant's use is an operator's
        # decision standing in, and it costs one commit only where a grant applies.
        await self.audit.record(
            "approval.decided",
            asked.ids,
            payload={
                "decision": Decided.ALLOW.value,
                "rule": rule,
                "by": "grant",
                "grant_id": granted.grant_id,
                "grant_scope": granted.scope,
                "granted_by": granted.made_by,
                "grant_use": number,  # issue 34: counted again from these records at start
                "grant_uses": granted.uses,
                "policy": asked.decision.to_dict(),
            }
            | self._shadow_of(asked.spec, asked.peer, asked.session),
            log_fields={"decision": "allow", "rule": rule},
            after=asked.after,
        )
        await self.grants.after_use(granted, number)
        # by_policy: like a rule's allow, a hold made before the runner redeems it stops it.
        return wire.Decided(
            "allow",
            rule,
            f"grant {granted.grant_id}",
            self.book.issue(asked.digest, asked.bound, self._ttl(), by_policy=True),
            asked.bound,
        )

    async def _ask(self, call: Call, asked: Asked, rule: str) -> wire.Decided:
        """People decide (or a reviewer where the rules let it): admitted, previewed, reviewed, then waited for."""
        admission = self._admit_ask(asked.peer, asked.ids)  # before a file's preview: a refused ask costs nothing
        spec, request, decision = asked.spec, asked.request, asked.decision
        try:
            if isinstance(spec, FileSpec):
                request = await self._file_view(request, spec, decision, asked.bound)
            opinion = await self._review(request, spec, asked.peer, decision, rule, asked.bound, asked.digest)
            if opinion is not None and opinion.decides:
                return await self._reviewer_decided(
                    opinion,
                    spec,
                    asked.peer,
                    asked.session,
                    decision,
                    rule,
                    asked.digest,
                    asked.bound,
                    asked.ids,
                    asked.after,
                )
            return await self._wait_for_operator(
                call,
                request,
                asked.peer,
                decision,
                asked.digest,
                asked.bound,
                asked.ids,
                spec,
                self.policy.requirement(decision),
                after=asked.after,
                admission=admission,
                opinion=opinion,
            )
        finally:
            admission.release()

    async def _by_policy(self, asked: Asked, ruling: Ruling) -> wire.Decided:
        """A rule's own allow or deny: a deny journaled (durable) and refused, an allow deferred with a ticket."""
        decided, rule, spec = ruling.decided, ruling.rule, asked.spec
        # privileged and run_as: its journald sentence says as whom (`USER=root`), as sudo's line does.
        payload = {
            "decision": decided.value,
            "rule": rule,
            "by": "policy",
            "policy": asked.decision.to_dict(),
            "privileged": spec.privileged,
            "run_as": spec.run_as,
        } | self._shadow_of(spec, asked.peer, asked.session)
        log_fields = {"decision": decided.value, "rule": rule}
        ids, after = asked.ids, asked.after
        if decided is Decided.DENY:
            await self.audit.record("approval.decided", ids, payload=payload, log_fields=log_fields, after=after)
            raise policy_refusal(asked.decision, spec, rule)
        # A rule's allow is deferred (issue 21): durable with the runner's exec.started, which
        # names this mark (intake passes it on, and redeem hands it to the runner itself).
        mark = await self.audit.defer("approval.decided", ids, payload=payload, log_fields=log_fields, after=after)
        ticket = self.book.issue(asked.digest, asked.bound, self._ttl(), by_policy=True, mark=mark)
        return wire.Decided("allow", rule, "policy", ticket, asked.bound, mark)

    async def _file_view(
        self, request: dict[str, Any], spec: FileSpec, decision: Decision, bound: dict[str, Any]
    ) -> dict[str, Any]:
        """A file operation as operators see it (its preview), and the reviewed file bound to the ticket."""
        named = fileop_review.names_path(decision)
        request = await fileop_review.operator_view(self.runner, request, spec, named=named)
        reviewed = fileop_review.bound_file(request)
        if reviewed is not None:
            bound["file"] = reviewed
        return request

    async def _review(
        self,
        request: dict[str, Any],
        spec: ExecSpec | FileSpec,
        peer: Peer,
        decision: Decision,
        rule: str,
        bound: dict[str, Any],
        digest: str,
    ) -> reviewer.Opinion | None:
        """Ask the reviewer, through the runner (runner/review.py), before any person is asked (issue 34).

        None: no reviewer is configured.  Every failure is an opinion of "ask":
        people decide.  Bounded by ``approval.reviewer_timeout_seconds`` (the
        runner kills it then) plus a margin for the runner's own reply.
        """
        settings = self.config.approval
        if not settings.reviewer_command:
            return None
        # During a hold nothing automatic allows: the reviewer only advises, as on a hold's own asks.
        may = "advise" if rule == "hold" or self.book.held else self.policy.reviewer_may(decision)
        text = reviewer.statement(
            request_id=str(request.get("request_id") or ""),
            request=fileop_review.without_content(request),
            spec=spec.to_dict() if isinstance(spec, ExecSpec) else {"privileged": spec.privileged},
            peer=peer.to_dict(),
            run_as={"uid": spec.run_as, "user": _user_name(spec.run_as)},
            policy=decision.to_dict(),
            rule=rule,
            may=may,
            bound=bound,
        )
        if isinstance(spec, FileSpec):
            text["file"] = {"tool": spec.tool, "path": spec.path}
            text["command"] = f"{spec.tool} {spec.path}"
            text["stages"] = []
        started = time.monotonic()
        result: dict[str, Any] | None
        try:
            result = await self.runner.call(
                "review", {"statement": text}, timeout=settings.reviewer_timeout_seconds + REVIEW_MARGIN_SECONDS
            )
        except (AirlockError, OSError, TimeoutError) as exc:
            self.log.warning("approval.reviewer.unreachable", request_id=text["request_id"], error=str(exc))
            result = None
        if result is not None and not result.get("ran"):
            self.log.warning("approval.reviewer.not_run", request_id=text["request_id"], why=result.get("why"))
            result = None
        denied = self._denied_before(peer.uid, digest)
        opinion = reviewer.judge(
            settings.reviewer_label, result, may=may, flagged=bool(bound.get("arguments")), denied_before=denied
        )
        if opinion.decides and opinion.decision == "allow" and await self._denied_in_journal(peer.uid, spec):
            # A person's deny from before a restart (the memory above is lost then): people decide.
            opinion = reviewer.judge(
                settings.reviewer_label, result, may=may, flagged=bool(bound.get("arguments")), denied_before=True
            )
        self.log.info(
            "approval.reviewer.answered",
            request_id=text["request_id"],
            reviewer=opinion.name,
            opinion=opinion.decision,
            outcome=opinion.outcome,
            decides=opinion.decides,
            seconds=round(time.monotonic() - started, 3),
        )
        return opinion

    async def _reviewer_decided(
        self,
        opinion: reviewer.Opinion,
        spec: ExecSpec | FileSpec,
        peer: Peer,
        session: str | None,
        decision: Decision,
        rule: str,
        digest: str,
        bound: dict[str, Any],
        common: Ids,
        after: list[str] | None,
    ) -> wire.Decided:
        """The reviewer's allow or deny where the rules let it decide: journaled (durable) as ``reviewer NAME``."""
        by = f"reviewer {opinion.name}"
        await self.audit.record(
            "approval.decided",
            common,
            payload={
                "decision": opinion.decision,
                "rule": rule,
                "by": by,
                "reason": opinion.reason,
                "reviewer": opinion.to_dict(),
                "policy": decision.to_dict(),
                "privileged": spec.privileged,
                "run_as": spec.run_as,
            }
            | self._shadow_of(spec, peer, session),
            log_fields={"decision": opinion.decision, "rule": rule},
            after=after,
        )
        if opinion.decision == "deny":
            raise AirlockError(
                ErrorCode.DENIED,
                f"denied by {by}" + (f": {opinion.reason}" if opinion.reason else ""),
                {"rule": rule, "decided_by": by},
            )
        # Automatic like a rule's allow: a hold made before the runner redeems it stops it (by_policy).
        return wire.Decided("allow", rule, by, self.book.issue(digest, bound, self._ttl(), by_policy=True), bound)

    def _shadow_of(self, spec: ExecSpec | FileSpec, peer: Peer, session: str | None) -> dict[str, Any]:
        """Issue 34: what each matching ``mode: shadow`` rule would have decided, beside the real decision."""
        if not self.policy.shadow:
            return {}
        subject = subject_of(peer, spec, session)
        try:
            if isinstance(spec, FileSpec):
                found = self.policy.shadow_verdicts(subject, file=(spec.tool, spec.path))
            else:
                found = self.policy.shadow_verdicts(subject, spec.stages)
        except AirlockError:
            return {}
        return {"shadow": found} if found else {}

    async def _denied_in_journal(self, uid: int, spec: ExecSpec | FileSpec) -> bool:
        """Whether a person denied this agent the same command (stages, privilege, run-as) in its newest records.

        Read from the journal (this agent's newest page of records), so it holds
        across restarts; broader than the digest the memory keeps (environment
        and directory aside), which only keeps more from the reviewer.  A journal
        that cannot be read counts as a deny: people decide.
        """
        stages = [list(s) for s in spec.stages] if isinstance(spec, ExecSpec) else [[spec.tool, spec.path]]
        try:
            page = await self.journal.call(
                "events", {"tail": DENIAL_PAGE, "limit": DENIAL_PAGE, "scope": {"peer_uid": uid}}, timeout=5.0
            )
        except (AirlockError, OSError, TimeoutError):
            return True
        for event in page.get("events") or []:
            payload = event.get("payload") if isinstance(event, dict) else None
            if event.get("kind") != "approval.decided" or not isinstance(payload, dict):
                continue
            by = str(payload.get("by") or "")
            if payload.get("decision") != "deny" or by in _NOT_A_PERSON or by.startswith("reviewer "):
                continue
            policy = payload.get("policy")
            if not isinstance(policy, dict):
                continue
            argvs = [stage.get("argv") for stage in policy.get("stages") or [] if isinstance(stage, dict)]
            if argvs == stages and (payload.get("privileged"), payload.get("run_as")) == (spec.privileged, spec.run_as):
                return True
        return False

    def _denied_before(self, uid: int, digest: str) -> bool:
        cutoff = time.time() - DENIAL_MEMORY_SECONDS
        seen = self.denials.get((uid, digest))
        return seen is not None and seen >= cutoff

    def _remember_denial(self, uid: int, digest: str) -> None:
        """A person denied this agent's request: the reviewer may never allow the same one (issue 34)."""
        self.denials[(uid, digest)] = time.time()
        self.denials.move_to_end((uid, digest))
        while len(self.denials) > DENIAL_MEMORY:
            self.denials.popitem(last=False)

    def _admit_ask(self, peer: Peer, ids: Ids) -> Admission:
        now = time.time()
        waiting = self.pending.waiting(peer.uid)
        limits = self.config.approval
        try:
            self.asks.admit(peer.uid, waiting, limits.max_pending_per_agent, limits.asks_per_minute, now)
        except AirlockError as exc:
            count = self.asks.should_log(peer.uid, now)
            if count:
                self.log.warning(
                    "approval.ask.limited",
                    request_id=ids.request_id,
                    peer_uid=peer.uid,
                    limit=exc.details.get("limit"),
                    refused=count,
                    error=exc.message,
                )
            raise
        return Admission(self.asks, peer.uid)

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
        admission: Admission | None = None,
        opinion: reviewer.Opinion | None = None,
    ) -> wire.Decided:
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
        key = (peer.uid, entry.request_id)
        if key in self.pending:  # the same agent's: another agent's ID is no concern of this one's
            raise AirlockError(ErrorCode.CONFLICT, "a request with this ID is already pending")
        rule = "hold" if self.book.held and decision.decision == "allow" else decision.rule
        entry.rule = rule
        entry.privileged, entry.run_as, entry.run_as_user = spec.privileged, spec.run_as, _user_name(spec.run_as)
        entry.binaries = describe_binaries(decision, spec.run_as, bound.get("binaries"))
        entry.tally = quorum.Tally(requirement or quorum.Requirement(), peer.uid, peer.user)
        entry.opinion = opinion.to_dict() if opinion is not None else None
        entry.published = self.ledger.publish(entry.request_id, self._statements(entry), peer.uid)
        leader = self.pending.leader_for(entry)
        if leader is not None:
            entry.attached_to = (leader.peer.uid, leader.request_id)
        await self.audit.record(
            "approval.pending",
            common,
            # The diff is file content: operators get it from `pending`, never from the journal (issue 39).
            payload={
                "rule": rule,
                "policy": decision.to_dict(),
                "timeout_seconds": timeout,
                "request": _once(fileop_review.without_content(request)),
            }
            | self._pending_extra(entry)
            | ({"attached_to": leader.request_id} if leader is not None else {}),
            log_fields={"decision": "ask", "rule": rule},
            after=after,  # durable: request.received is too once this returns
        )
        self.pending[key] = entry
        if admission is not None:
            admission.release()  # counted in pending from now on
        if entry.attached_to is not None and not self.pending.leading(entry.attached_to):
            # The first was decided, or left, while this one's record was written: its decision did not
            # reach this one, which joins another identical request or is a question of its own.
            other = self.pending.leader_for(entry)
            entry.attached_to = (other.peer.uid, other.request_id) if other is not None else None
        if entry.attached_to is None:  # an attached request is no new question: nobody is called for it
            self.notifier.pending(fileop_review.for_observer(entry.to_dict(now)) | {"event": "pending"})
        # The request belongs to a live client: when intake's call is gone
        # (the agent went away or cancelled), the request is withdrawn.
        watch = asyncio.ensure_future(_withdraw_when_gone(call, entry))
        verdict, by, operator_uid, reason = "interrupted", "", None, ""  # should the wait itself be cancelled
        try:
            await call.emit(
                "pending_approval", {"request_id": entry.request_id, "rule": rule, "timeout_seconds": timeout}
            )
            verdict, by, operator_uid, reason = await asyncio.wait_for(asyncio.shield(entry.future), timeout)
        except TimeoutError:
            verdict, by, operator_uid, reason = "timeout", "timeout", None, ""
        finally:
            watch.cancel()
            if self.pending.get(key) is entry:
                del self.pending[key]
            self._settle_followers(entry, key, (verdict, by, operator_uid, reason))
            if entry.published is not None:
                self.ledger.settle(entry.published, _SETTLED.get(verdict, "decided"))
        if verdict == "interrupted":
            raise AirlockError(
                ErrorCode.APPROVAL_INTERRUPTED, "the approval service stopped while the request was pending"
            )
        await self.audit.record(
            "approval.decided",
            common,
            # What was decided travels with the decision (as in a rule's or a grant's record), so the
            # journald sentence says what an operator approved, as whom (issue 32's walk).
            payload={"decision": verdict, "rule": rule, "by": by, "operator_uid": operator_uid, "reason": reason}
            | {"policy": decision.to_dict(), "privileged": entry.privileged, "run_as": entry.run_as}
            | _decided_quorum(entry)
            | ({"reviewer": entry.opinion} if entry.opinion else {})
            | ({"decided_with": entry.decided_with} if entry.decided_with else {})
            | self._shadow_of(spec, peer, session_of(request)),
            log_fields={"decision": verdict, "rule": rule},
        )
        if verdict == "deny" and by not in ("agent", "timeout"):
            self._remember_denial(peer.uid, digest)
        if verdict == "timeout":
            raise AirlockError(ErrorCode.APPROVAL_TIMEOUT, f"no operator decided within {timeout:g}s", {"rule": rule})
        if verdict == "withdrawn":
            raise AirlockError(ErrorCode.WITHDRAWN, reason, {"rule": rule})
        if verdict == "deny":
            raise AirlockError(
                ErrorCode.DENIED,
                f"denied by operator {by}" + (f": {reason}" if reason else ""),
                {"rule": rule, "decided_by": by},
            )
        return wire.Decided(
            "allow", rule, by, self.book.issue(entry.digest, entry.bound, self._ttl(), by_policy=False), entry.bound
        )

    def _settle_followers(
        self, entry: Pending, key: tuple[int, str], outcome: tuple[str, str, int | None, str]
    ) -> None:
        """The leader ``entry`` left pending with ``outcome``: an operator's (or a quorum's) allow or deny decides
        its attached requests too; otherwise (withdrawn, expired, interrupted, cancelled alone) the oldest
        attached one becomes a pending question of its own and leads the rest.  Synchronous: nothing decides
        a follower between the leader's decision and this."""
        followers = sorted(
            (p for p in self.pending.values() if p.attached_to == key and not p.future.done()), key=lambda p: p.created
        )
        if not followers:
            return
        if outcome[0] in ("allow", "deny") and not entry.solo:
            for follower in followers:
                follower.decided_with = entry.request_id
                follower.tally = entry.tally  # who approved, for its own approval.decided
                follower.future.set_result(outcome)
            return
        first = followers[0]
        first.attached_to = None
        for follower in followers[1:]:
            follower.attached_to = (first.peer.uid, first.request_id)
        self.log.info(
            "approval.pending.promoted",
            request_id=first.request_id,
            was_attached_to=entry.request_id,
            peer_uid=first.peer.uid,
        )
        self.notifier.pending(fileop_review.for_observer(first.to_dict(time.time())) | {"event": "pending"})

    async def _inspect_arguments(self, spec: ExecSpec, binaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """A root job's path arguments that someone other than root can change (issue 27).

        The runner classifies them: it is root and sees every file, which
        approval (its own unprivileged user, no /home) cannot; it must also find
        the same files before the job starts.  A job with no argument that may
        name a path (a plain ``true``) costs nothing here.
        """
        programs = [str(b.get("path") or "") for b in binaries]
        if not arguments.worth_inspecting(spec.stages, programs, cwd_given=spec.cwd is not None):
            return []
        found = await self.runner.call(
            "inspect", {"spec": spec.to_dict(), "programs": programs}, timeout=INSPECT_SECONDS
        )
        return arguments.parse_bound(found.get("arguments"), spec.stages)

    async def withdraw(self, call: Call, args: wire.Withdraw) -> wire.Withdrawn:
        """intake (`wire.approval.WITHDRAW`, intake's only): the agent went away or cancelled; withdrawn at once."""
        entry = self.pending.own(args.uid, args.request_id)  # only that agent's own request
        if entry is None or entry.future.done():
            return wire.Withdrawn(False)
        del self.pending[(args.uid, args.request_id)]  # from now on an approve finds nothing
        entry.future.set_result(("withdrawn", "agent", None, "withdrawn by the agent before a decision"))
        return wire.Withdrawn(True)


async def _withdraw_when_gone(call: Call, entry: Pending) -> None:
    """Withdraw a pending request once the connection that asked for it has closed."""
    await call.connection.wait_gone()
    if not entry.future.done():
        entry.future.set_result(("withdrawn", "agent", None, "the requesting agent went away before a decision"))


# The runner's reply to ``review`` may come this long after the reviewer's own deadline.
REVIEW_MARGIN_SECONDS = 5.0
# Requests people denied that a reviewer may not then allow: how many, for how long (in memory).
DENIAL_MEMORY = 4096
DENIAL_MEMORY_SECONDS = 7 * 86400.0
# How many of the agent's newest journal records are searched for a person's deny (one page).
DENIAL_PAGE = 256
# approval.decided's ``by`` values that are no person's decision.
_NOT_A_PERSON = frozenset({"policy", "grant", "timeout", "agent", "shutdown"})

# How long approval waits for the runner to classify a root job's arguments (hashing included).
INSPECT_SECONDS = 30.0

# How a pending request ended, as the ledger of statements remembers it.
_SETTLED = {"timeout": "expired", "withdrawn": "withdrawn", "interrupted": "interrupted"}


def _decided_quorum(entry: Pending) -> dict[str, Any]:
    """Who approved, for approval.decided: each approver (uid, or principal and key fingerprint)."""
    if entry.tally is None or not entry.tally.votes:
        return {}
    return {"approvers": [v.to_dict() for v in entry.tally.votes], "quorum": entry.tally.progress()}


def session_of(request: dict[str, Any]) -> str | None:
    session = request.get("session")
    return session if isinstance(session, str) and session else None


def request_id_of(ids: Ids) -> str:
    assert ids.request_id is not None
    return ids.request_id


def _user_name(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _once(request: Any) -> Any:
    """The request as ``approval.pending`` journals it: without its ``spec`` when the spec only repeats the
    request's own fields (issue 38: the spec is stored once per record; ``request.received``'s digest binds it)."""
    if not isinstance(request, dict) or not isinstance(request.get("spec"), dict):
        return request
    spec = request["spec"]
    if all(k in request and request[k] == v for k, v in spec.items()):
        return {k: v for k, v in request.items() if k != "spec"}
    return request


def credentials_bound(decision: Decision) -> dict[str, Any]:
    """``bound["credentials"]``: each stage's {name: path} (runner/credentials.py); empty when none has any."""
    if not any(stage.credentials for stage in decision.stages):
        return {}
    return {"credentials": [dict(stage.credentials or {}) for stage in decision.stages]}


def operator_view(asking: wire.Asking, spec: ExecSpec | FileSpec) -> dict[str, Any]:
    """The request as operators are shown it and ``approval.pending`` journals it: the agent's words and the
    checked spec (a command's fields and ``spec``; a file operation's description and ``file``), built here
    from the spec that travelled once."""
    words = {"request_id": asking.request_id, "reason": asking.reason, "session": asking.session}
    words |= {"host": asking.host, "time": asking.time}
    if isinstance(spec, FileSpec):
        return words | spec.describe() | {"file": spec.to_dict()}
    checked = spec.to_dict()
    return words | checked | {"spec": checked}

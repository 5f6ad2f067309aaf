"""Deciding: the policy's verdict on a request, and waiting for operators.

`Deciding` is intake's side of approval (the operators' is
`operator.Operating`), handed what it shares: intake's
``decide`` (the policy decides; a grant may stand in for an operator; an
``ask`` waits as a `Pending` request for operators or a quorum,
within ``approval.timeout_seconds``) and ``withdraw`` (the agent went away).
Pending requests are keyed by (agent uid, request ID): one agent's IDs
neither collide with nor reveal another's (issue 27).
A decision is journaled before it is returned; an allow carries a ticket
(`tickets.TicketBook`).  What the policy, the hold, a grant and the votes
add up to is `verdict.verdict` (pure); here are the steps each outcome
takes (journal, ticket, wait) and the wait itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from airlock.approval import fileop_review, hook, promote, quorum, reviewer
from airlock.approval.asked import (
    Asked,
    credentials_bound,
    operator_view,
    policy_refusal,
    request_id_of,
    session_of,
    shadow_of,
    subject_of,
    user_name,
)
from airlock.approval.asks import Admission
from airlock.approval.denials import NOT_A_PERSON
from airlock.approval.parts import Books, Live, Outside
from airlock.approval.pending import Pending, bind_binaries, check_chains, describe_binaries
from airlock.approval.reviewing import Reviewing
from airlock.approval.rules import Decision, Policy
from airlock.approval.table import PendingTable
from airlock.approval.transitions import SHARED, Outcome
from airlock.approval.verdict import HOLD_RULE, LEDGER_STATE, By, Decided, Ruling, asking_rules, verdict
from airlock.approval.votes import Votes
from airlock.common import arguments, validate
from airlock.common.audit import Ids, marks_of
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FileSpec
from airlock.common.peer import Peer
from airlock.common.server import Call
from airlock.common.spec import ExecSpec
from airlock.common.wire import approval as wire
from airlock.common.wire import runner as runner_wire


class Deciding:
    """intake's verbs (``decide``, ``withdraw``) and the wait for operators, handed what they share."""

    def __init__(
        self, live: Live, outside: Outside, pending: PendingTable, books: Books, votes: Votes, reviewing: Reviewing
    ) -> None:
        self.live = live  # what a reload replaces is read when used: a pending request keeps what it was given
        self.audit, self.log = outside.audit, outside.log
        self.runner = outside.runner  # inspect (a root job's arguments) and a file operation's preview
        self.pending = pending  # settles every pending request (table.py)
        self.asks, self.book, self.grants, self.ledger = books.asks, books.tickets, books.grants, books.ledger
        self.votes = votes
        self.reviewing = reviewing
        self.announcing: set[asyncio.Future[None]] = set()  # promote.announce tasks, held until done

    @property
    def config(self) -> Config:
        return self.live.config

    @property
    def policy(self) -> Policy:
        return self.live.policy

    @property
    def notifier(self) -> hook.NotifyCommand:
        return self.live.notifier

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
            # Root's checks for root's jobs and for another account's (issue 48), as the runner's JobSpec.trusted.
            bound["binaries"] = bind_binaries(decision, privileged=spec.run_as == 0 or spec.privileged)
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
        held = (await self.book.current()).held
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
        ruling = self._rule_on(asked, held)
        if ruling.problem is not None:
            await self.votes.deny_for_reason(decision, ruling.problem, asked.ids, after=asked.after)
        if ruling.by is By.GRANT:
            return await self._allow_by_grant(asked, ruling)
        if ruling.decided is Decided.ASK:
            if not args.wait:  # `sudo -n` (issue 48): nobody is asked, nothing waits
                raise AirlockError(
                    ErrorCode.APPROVAL_REQUIRED,
                    f"a person would be asked (rule {ruling.rule!r}) and the request said not to wait",
                    {"rule": ruling.rule},
                )
            return await self._ask(call, asked, ruling.rule)
        return await self._by_policy(asked, ruling)

    def _rule_on(self, asked: Asked, held: bool) -> Ruling:
        """The verdict (`verdict.verdict`) on a request as it arrives.

        Synchronous from the grant's lookup to its use (`_allow_by_grant` takes
        it before any await): two requests racing for a grant's last use
        cannot both have it.
        """
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
            if candidate is not None and self.reviewing.denied_before(asked.peer.uid, spec, decision, asked.bound):
                # Issue 45: a person denied what this would run; the grant does not stand in for them.
                self.log.info("approval.grant.passed_over", request_id=asked.ids.request_id, grant=candidate.grant_id)
                candidate = None
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
            | shadow_of(self.policy, asked.spec, asked.peer, asked.session),
            log_fields={"decision": "allow", "rule": rule},
            after=asked.after,
        )
        await self.grants.after_use(granted, number)
        # by_policy: like a rule's allow, a hold made before the runner redeems it stops it.
        return wire.Decided(
            "allow",
            rule,
            f"grant {granted.grant_id}",
            self.book.issue(asked.digest, asked.bound, by_policy=True),
            asked.bound,
        )

    async def _ask(self, call: Call, asked: Asked, rule: str) -> wire.Decided:
        """People decide (or a reviewer where the rules let it): admitted, previewed, reviewed, then waited for."""
        # Before a file's preview: a refused ask costs nothing.
        limits = self.config.approval
        admission = self.asks.admission(
            asked.peer.uid, self.pending.waiting(asked.peer.uid), limits, self.log, request_id=asked.ids.request_id
        )
        spec, request, decision = asked.spec, asked.request, asked.decision
        try:
            if isinstance(spec, FileSpec):
                request = await self._file_view(request, spec, decision, asked.bound)
            opinion = await self.reviewing.consult(request, spec, asked.peer, decision, rule, asked.bound)
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
        } | shadow_of(self.policy, spec, asked.peer, asked.session)
        log_fields = {"decision": decided.value, "rule": rule}
        ids, after = asked.ids, asked.after
        if decided is Decided.DENY:
            await self.audit.record("approval.decided", ids, payload=payload, log_fields=log_fields, after=after)
            raise policy_refusal(asked.decision, spec, rule)
        # A rule's allow is deferred (issue 21): durable with the runner's exec.started, which
        # names this mark (intake passes it on, and redeem hands it to the runner itself).
        mark = await self.audit.defer("approval.decided", ids, payload=payload, log_fields=log_fields, after=after)
        ticket = self.book.issue(asked.digest, asked.bound, by_policy=True, mark=mark)
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
            | shadow_of(self.policy, spec, peer, session),
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
        return wire.Decided("allow", rule, by, self.book.issue(digest, bound, by_policy=True), bound)

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
        )
        key = (peer.uid, entry.request_id)
        if key in self.pending:  # the same agent's: another agent's ID is no concern of this one's
            raise AirlockError(ErrorCode.CONFLICT, "a request with this ID is already pending")
        held = (await self.book.current()).held
        rule = HOLD_RULE if held and decision.decision == "allow" else decision.rule
        entry.rule = rule
        entry.privileged, entry.run_as, entry.run_as_user = spec.privileged, spec.run_as, user_name(spec.run_as)
        entry.stdin = spec.stdin if isinstance(spec, ExecSpec) else None
        entry.binaries = describe_binaries(decision, spec.run_as, bound.get("binaries"))
        entry.tally = quorum.Tally(requirement or quorum.Requirement(), peer.uid, peer.user)
        entry.opinion = opinion.to_dict() if opinion is not None else None
        entry.published = self.ledger.publish(entry.request_id, self.votes.statements(entry), peer.uid)
        leader = self.pending.leader_for(entry)
        if leader is not None:
            entry.attached_to = (leader.peer.uid, leader.request_id)
        await self.audit.record(
            "approval.pending",
            common,
            payload=promote.pending_payload(entry, timeout, self.votes)
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
        watch = asyncio.ensure_future(self.pending.withdraw_when_gone(call, entry))
        try:
            await call.emit(
                "pending_approval", {"request_id": entry.request_id, "rule": rule, "timeout_seconds": timeout}
            )
            await self.pending.outcome(entry, timeout)  # a timeout settles it as timed out
        finally:
            watch.cancel()
            self.pending.settle_open(entry, Outcome(Decided.INTERRUPTED, ""))  # the wait itself was cancelled
            if self.pending.get(key) is entry:
                del self.pending[key]
            ended = entry.ended
            assert ended is not None
            # An allow or deny was shared with the attached requests by the table; otherwise one leads now.
            promoted = self.pending.promote(entry) if ended.decided not in SHARED or entry.solo else None
            if promoted is not None:  # a question of its own now: operators are called for it
                # In the background: the leader's own answer does not wait for the promotion's record.
                told = promote.announce(
                    self.audit, self.notifier, self.votes, self.log, promoted, entry, common.session
                )
                self.announcing.add(task := asyncio.ensure_future(told))
                task.add_done_callback(self.announcing.discard)
            if entry.published is not None:
                self.ledger.settle(entry.published, LEDGER_STATE.get(ended.decided, "decided"))
        decided, by, operator_uid, reason = ended.decided, ended.by, ended.operator_uid, ended.reason
        verdict = decided.value
        if decided is Decided.INTERRUPTED:
            raise AirlockError(
                ErrorCode.APPROVAL_INTERRUPTED, "the approval service stopped while the request was pending"
            )
        # Issue 45: a person's deny is remembered by what would run (in memory first), and journaled with it.
        person_denied = decided is Decided.DENY and by not in NOT_A_PERSON
        denial = self.reviewing.remember_denial(peer.uid, spec, decision, bound) if person_denied else {}
        await self.audit.record(
            "approval.decided",
            common,
            # What was decided travels with the decision (as in a rule's or a grant's record), so the
            # journald sentence says what an operator approved, as whom (issue 32's walk).
            payload={"decision": verdict, "rule": rule, "by": by, "operator_uid": operator_uid, "reason": reason}
            | {"policy": decision.to_dict(), "privileged": entry.privileged, "run_as": entry.run_as}
            | entry.approvers()
            | ({"reviewer": entry.opinion} if entry.opinion else {})
            | ({"decided_with": entry.decided_with} if entry.decided_with else {})
            | shadow_of(self.policy, spec, peer, session_of(request))
            | denial,
            log_fields={"decision": verdict, "rule": rule},
        )
        if decided is Decided.TIMEOUT:
            raise AirlockError(ErrorCode.APPROVAL_TIMEOUT, f"no operator decided within {timeout:g}s", {"rule": rule})
        if decided is Decided.WITHDRAWN:
            raise AirlockError(ErrorCode.WITHDRAWN, reason, {"rule": rule})
        if decided is Decided.DENY:
            raise AirlockError(
                ErrorCode.DENIED,
                f"denied by operator {by}" + (f": {reason}" if reason else ""),
                {"rule": rule, "decided_by": by},
            )
        return wire.Decided("allow", rule, by, self.book.issue(entry.digest, entry.bound, by_policy=False), entry.bound)

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
        found = await runner_wire.stub(self.runner).call(
            runner_wire.INSPECT, runner_wire.Inspect(spec, tuple(programs)), timeout=INSPECT_SECONDS
        )
        return arguments.parse_bound(list(found.arguments), spec.stages)

    async def withdraw(self, call: Call, args: wire.Withdraw) -> wire.Withdrawn:
        """intake (`wire.approval.WITHDRAW`, intake's only): the agent went away or cancelled; withdrawn at once."""
        return wire.Withdrawn(self.pending.withdraw(args.uid, args.request_id))


INSPECT_SECONDS = 30.0  # for the runner to classify a root job's arguments (hashing included)

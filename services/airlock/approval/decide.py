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
from typing import Any

from airlock.approval import fileop_review, hook, quorum, reviewer
from airlock.approval.pending import Pending, bind_binaries, check_chains, describe_binaries, ticket_binding
from airlock.approval.rules import UNRESOLVED_RULE, Decision, Policy, Subject
from airlock.approval.tickets import Tickets
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
from airlock.common.wire import runner as runner_wire


def subject_of(peer: Peer, spec: ExecSpec | FileSpec, session: str | None) -> Subject:
    return Subject(
        uid=peer.uid,
        user=peer.user,
        groups=frozenset(peer.groups),
        session=session or None,
        privileged=spec.privileged,
        target_uid=spec.run_as,
    )


ASK_WINDOW_SECONDS = 60.0


class AskLimits:
    """Per-uid bounds on asking an operator (issue 28): how many wait at once, how many a minute.

    Checked before anything is journaled or shown, so a refused ask costs an
    operator nothing: no ``approval.pending``, no relay message.  One agent
    asking and withdrawing in a loop is held to ``approval.asks_per_minute``
    and cannot push other agents' requests out of operators' sight.
    """

    def __init__(self) -> None:
        self.windows: dict[int, collections.deque[float]] = {}
        self.admitting: collections.Counter[int] = collections.Counter()  # admitted, not yet in pending
        self.refused: collections.Counter[int] = collections.Counter()  # refusals not yet logged
        self.logged: dict[int, float] = {}

    def admit(self, uid: int, waiting: int, max_pending: int, per_minute: int, now: float) -> None:
        """Count one ask of ``uid`` (``waiting`` of whose requests are pending now), or raise rate_limited."""
        window = self.windows.setdefault(uid, collections.deque())
        while window and window[0] <= now - ASK_WINDOW_SECONDS:
            window.popleft()
        if len(self.windows) > 4096:  # forget agents that have not asked for a minute
            for other in [u for u, w in self.windows.items() if not w or w[-1] <= now - ASK_WINDOW_SECONDS]:
                if other != uid:
                    del self.windows[other]
        waiting += self.admitting[uid]
        if waiting >= max_pending:
            raise AirlockError(
                ErrorCode.RATE_LIMITED,
                f"{waiting} of your requests already wait for an operator (approval.max_pending_per_agent is "
                f"{max_pending}); wait for their decisions or withdraw one",
                {"limit": "approval.max_pending_per_agent", "waiting": waiting, "max": max_pending},
            )
        if len(window) >= per_minute:
            retry = max(0.1, round(window[0] + ASK_WINDOW_SECONDS - now, 1))
            raise AirlockError(
                ErrorCode.RATE_LIMITED,
                f"you asked operators {len(window)} times in the last minute (approval.asks_per_minute is "
                f"{per_minute}); retry in {retry:g}s",
                {"limit": "approval.asks_per_minute", "max": per_minute, "retry_after_seconds": retry},
            )
        window.append(now)
        self.admitting[uid] += 1

    def settled(self, uid: int) -> None:
        """An admitted ask is in ``pending`` now, or never will be (call once per admit)."""
        self.admitting[uid] -= 1
        if self.admitting[uid] <= 0:
            del self.admitting[uid]

    def should_log(self, uid: int, now: float) -> int:
        """How many refusals to report now (0: not yet); at most one log line per agent a minute."""
        self.refused[uid] += 1
        if now - self.logged.get(uid, 0.0) < ASK_WINDOW_SECONDS:
            return 0
        self.logged[uid] = now
        return self.refused.pop(uid)


class Admission:
    """One admitted ask: counted against its agent until it is in ``pending`` or gone (`release`, idempotent)."""

    def __init__(self, limits: AskLimits, uid: int) -> None:
        self.limits, self.uid, self.open = limits, uid, True

    def release(self) -> None:
        if self.open:
            self.open = False
            self.limits.settled(self.uid)


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


class Deciding(Tickets, Votes):
    """intake's side of `Approval`; the attributes below are `Approval`'s."""

    policy: Policy
    pending: dict[tuple[int, str], Pending]
    notifier: hook.NotifyCommand
    runner: Client
    journal: Client
    intake_uid: int | None
    asks: AskLimits
    denials: collections.OrderedDict[tuple[int, str], float]

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
        request_id = validate.request_id("request_id", request.get("request_id"))
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
        use = self._granted(verdict, spec, peer, session, digest, decision, requirement, bound)
        if use is not None:
            granted, number = use
            # Durable (not deferred like a rule's allow): a grant's use is an operator's
            # decision standing in, and it costs one commit only where a grant applies.
            await self.audit.record(
                "approval.decided",
                common,
                payload={
                    "decision": "allow",
                    "rule": rule,
                    "by": "grant",
                    "grant_id": granted.grant_id,
                    "grant_scope": granted.scope,
                    "granted_by": granted.made_by,
                    "grant_use": number,  # issue 34: counted again from these records at start
                    "grant_uses": granted.uses,
                    "policy": decision.to_dict(),
                }
                | self._shadow_of(spec, peer, session),
                log_fields={"decision": "allow", "rule": rule},
                after=after,
            )
            await self._after_use(granted, number)
            # by_policy: like a rule's allow, a hold made before the runner redeems it stops it.
            return {
                "decision": "allow",
                "rule": rule,
                "decided_by": f"grant {granted.grant_id}",
                "ticket": self._issue(digest, bound, by_policy=True),
                "bound": bound,
            }
        if verdict == "ask":
            admission = self._admit_ask(peer, common)  # before a file's preview: a refused ask costs nothing
            try:
                if isinstance(spec, FileSpec):
                    request = await self._file_view(request, spec, decision, bound)
                opinion = await self._review(request, spec, peer, decision, rule, bound, digest)
                if opinion is not None and opinion.decides:
                    return await self._reviewer_decided(
                        opinion, spec, peer, session, decision, rule, digest, bound, common, after
                    )
                return await self._wait_for_operator(
                    call,
                    request,
                    peer,
                    decision,
                    digest,
                    bound,
                    common,
                    spec,
                    requirement,
                    after=after,
                    admission=admission,
                    opinion=opinion,
                )
            finally:
                admission.release()
        # privileged and run_as: its journald sentence says as whom (`USER=root`), as sudo's line does.
        payload = {
            "decision": verdict,
            "rule": rule,
            "by": "policy",
            "policy": decision.to_dict(),
            "privileged": spec.privileged,
            "run_as": spec.run_as,
        } | self._shadow_of(spec, peer, session)
        if verdict == "deny":
            await self.audit.record(
                "approval.decided", common, payload=payload, log_fields={"decision": verdict, "rule": rule}, after=after
            )
            raise policy_refusal(decision, spec, rule)
        # A rule's allow is deferred (issue 21): durable with the runner's exec.started, which
        # names this mark (intake passes it on, and redeem hands it to the runner itself).
        mark = await self.audit.defer(
            "approval.decided", common, payload=payload, log_fields={"decision": verdict, "rule": rule}, after=after
        )
        return {
            "decision": "allow",
            "rule": rule,
            "decided_by": "policy",
            "ticket": self._issue(digest, bound, by_policy=True, mark=mark),
            "bound": bound,
            "mark": mark,
        }

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
        may = "advise" if rule == "hold" or self.hold_reason is not None else self.policy.reviewer_may(decision)
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
            reviewed = await runner_wire.stub(self.runner).call(
                runner_wire.REVIEW,
                runner_wire.Review(text),
                timeout=settings.reviewer_timeout_seconds + REVIEW_MARGIN_SECONDS,
            )
            result = reviewed.to_dict()
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
    ) -> dict[str, Any]:
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
        return {
            "decision": "allow",
            "rule": rule,
            "decided_by": by,
            "ticket": self._issue(digest, bound, by_policy=True),
            "bound": bound,
        }

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
        waiting = sum(1 for entry in self.pending.values() if entry.peer.uid == peer.uid)
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
        key = (peer.uid, entry.request_id)
        if key in self.pending:  # the same agent's: another agent's ID is no concern of this one's
            raise AirlockError(ErrorCode.CONFLICT, "a request with this ID is already pending")
        rule = "hold" if self.hold_reason is not None and decision.decision == "allow" else decision.rule
        entry.rule = rule
        entry.privileged, entry.run_as, entry.run_as_user = spec.privileged, spec.run_as, _user_name(spec.run_as)
        entry.binaries = describe_binaries(decision, spec.run_as, bound.get("binaries"))
        entry.tally = quorum.Tally(requirement or quorum.Requirement(), peer.uid, peer.user)
        entry.opinion = opinion.to_dict() if opinion is not None else None
        entry.published = self.ledger.publish(entry.request_id, self._statements(entry), peer.uid)
        leader = self._leader_for(entry)
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
        if entry.attached_to is not None and not self._leading(entry.attached_to):
            # The first was decided, or left, while this one's record was written: its decision did not
            # reach this one, which joins another identical request or is a question of its own.
            other = self._leader_for(entry)
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
        return {
            "decision": "allow",
            "rule": rule,
            "decided_by": by,
            "ticket": self._issue(entry.digest, entry.bound, by_policy=False),
            "bound": entry.bound,
        }

    def _leader_for(self, entry: Pending) -> Pending | None:
        """Issue 34: the request pending now that ``entry`` is identical to, to be decided with it.

        Only the same agent's (uid: another agent's request is never joined, whatever it asks), in the
        same session, with the same ticket binding (the spec's digest and everything approval resolved:
        binaries, sandbox, changeable arguments, a file's reviewed content) under the same rule and the
        same quorum: an operator's decision of the leader is then exactly a decision of this one.
        """
        binding = ticket_binding(entry.digest, entry.bound)
        session = entry.request.get("session") or None
        for other in sorted(self.pending.values(), key=lambda p: p.created):
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

    def _leading(self, key: tuple[int, str]) -> bool:
        """Whether the request under ``key`` is pending now, undecided, and leads (is attached to none)."""
        leader = self.pending.get(key)
        return leader is not None and not leader.future.done() and leader.attached_to is None

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
        found = await runner_wire.stub(self.runner).call(
            runner_wire.INSPECT, runner_wire.Inspect(spec, tuple(programs)), timeout=INSPECT_SECONDS
        )
        return arguments.parse_bound(list(found.arguments), spec.stages)

    async def withdraw(self, call: Call) -> dict[str, Any]:
        """intake: the agent went away or cancelled; the pending request is withdrawn at once."""
        if self.intake_uid is None or call.peer.uid != self.intake_uid:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")
        request_id = validate.text("request_id", call.args.get("request_id"), max_len=256, allow_empty=False)
        uid = call.args.get("uid")
        if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
            raise validate.bad("uid", "must be the requesting agent's uid")
        entry = self._find_own(uid, request_id)  # only that agent's own request
        if entry is None or entry.future.done():
            return {"withdrawn": False}
        del self.pending[(uid, request_id)]  # from now on an approve finds nothing
        entry.future.set_result(("withdrawn", "agent", None, "withdrawn by the agent before a decision"))
        return {"withdrawn": True}

    def _find_own(self, uid: int, request_id: str) -> Pending | None:
        """Agent ``uid``'s own pending request ``request_id`` (an agent names only its own)."""
        return self.pending.get((uid, request_id))


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

"""The reviewer (issue 34), asked before any person, and what keeps it from allowing what a person denied.

`Reviewing` asks the configured reviewer through the runner
(runner/review.py) and judges its answer (`reviewer.judge`): every failure
is an opinion of "ask" (people decide).  It owns the memory of what people
denied each agent (by digest, in memory) and reads the journal for a
person's deny from before a restart: the reviewer never allows those.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from airlock.approval import fileop_review, reviewer
from airlock.approval.asked import user_name
from airlock.approval.rules import Decision, Policy
from airlock.approval.tickets import TicketBook
from airlock.approval.verdict import Decided
from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client
from airlock.common.peer import Peer
from airlock.common.spec import ExecSpec
from airlock.common.wire import journal as journal_wire
from airlock.common.wire import runner as runner_wire
from airlock.common.wire.verb import Stub

# The runner's reply to ``review`` may come this long after the reviewer's own deadline.
REVIEW_MARGIN_SECONDS = 5.0
# Requests people denied that a reviewer may not then allow: how many, for how long (in memory).
DENIAL_MEMORY = 4096
DENIAL_MEMORY_SECONDS = 7 * 86400.0
# How many of the agent's newest journal records are searched for a person's deny (one page).
DENIAL_PAGE = 256
# approval.decided's ``by`` values that are no person's decision.
_NOT_A_PERSON = frozenset({"policy", "grant", "timeout", "agent", "shutdown"})


class Reviewing:
    """The reviewer's consultation and the denial memory it is held to."""

    def __init__(
        self,
        settings: Callable[[], Config],
        policy: Callable[[], Policy],
        book: TicketBook,
        runner: Client,
        journal: Stub,
        log: Any,
    ) -> None:
        self._settings = settings
        self._policy = policy
        self.book = book  # during a hold the reviewer only advises
        self.runner = runner
        self.journal = journal
        self.log = log
        self.denials: collections.OrderedDict[tuple[int, str], float] = collections.OrderedDict()

    @property
    def config(self) -> Config:
        return self._settings()

    @property
    def policy(self) -> Policy:
        return self._policy()

    async def consult(
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
            run_as={"uid": spec.run_as, "user": user_name(spec.run_as)},
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
        denied = self.denied_before(peer.uid, digest)
        opinion = reviewer.judge(
            settings.reviewer_label, result, may=may, flagged=bool(bound.get("arguments")), denied_before=denied
        )
        if opinion.decides and opinion.decision == Decided.ALLOW and await self.denied_in_journal(peer.uid, spec):
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

    async def denied_in_journal(self, uid: int, spec: ExecSpec | FileSpec) -> bool:
        """Whether a person denied this agent the same command (stages, privilege, run-as) in its newest records.

        Read from the journal (this agent's newest page of records), so it holds
        across restarts; broader than the digest the memory keeps (environment
        and directory aside), which only keeps more from the reviewer.  A journal
        that cannot be read counts as a deny: people decide.
        """
        stages = [list(s) for s in spec.stages] if isinstance(spec, ExecSpec) else [[spec.tool, spec.path]]
        try:
            page = await self.journal.call(
                journal_wire.EVENTS,
                journal_wire.Events(tail=DENIAL_PAGE, limit=DENIAL_PAGE, scope={"peer_uid": uid}),
                timeout=5.0,
            )
        except (AirlockError, OSError, TimeoutError):
            return True
        for event in page.events:
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

    def denied_before(self, uid: int, digest: str) -> bool:
        cutoff = time.time() - DENIAL_MEMORY_SECONDS
        seen = self.denials.get((uid, digest))
        return seen is not None and seen >= cutoff

    def remember_denial(self, uid: int, digest: str) -> None:
        """A person denied this agent's request: the reviewer may never allow the same one (issue 34)."""
        self.denials[(uid, digest)] = time.time()
        self.denials.move_to_end((uid, digest))
        while len(self.denials) > DENIAL_MEMORY:
            self.denials.popitem(last=False)

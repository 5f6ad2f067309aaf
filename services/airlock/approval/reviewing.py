"""The reviewer (issue 34), asked before any person, and what keeps it from allowing what a person denied.

`Reviewing` asks the configured reviewer through the runner
(runner/review.py) and judges its answer (`reviewer.judge`): every failure
is an opinion of "ask" (people decide).  It owns the memory of what people
denied each agent (`denials.DenialMemory`, by what would run, issue 45),
read back from the journal at start: neither the reviewer nor a grant
allows what a person denied.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from airlock.approval import denials, fileop_review, restore, reviewer
from airlock.approval.asked import user_name
from airlock.approval.denials import DenialMemory, Meaning
from airlock.approval.rules import Decision, Policy
from airlock.approval.tickets import TicketBook
from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client
from airlock.common.peer import Peer
from airlock.common.spec import ExecSpec
from airlock.common.wire import runner as runner_wire
from airlock.common.wire.verb import Stub

# The runner's reply to ``review`` may come this long after the reviewer's own deadline.
REVIEW_MARGIN_SECONDS = 5.0
# Reading people's denials back at start: each page's call may take this long; a failed read is
# tried again this often, this many times (an hour), then only a restart reads them.
RESTORE_SECONDS = 10.0
RESTORE_RETRY_SECONDS = 10.0
RESTORE_RETRIES = 360


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
        self.memory = DenialMemory()  # what people denied, by meaning (issue 45); loaded at start
        self._retrying: asyncio.Future[None] | None = None

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
        may = "advise" if rule == "hold" or (await self.book.current()).held else self.policy.reviewer_may(decision)
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
        denied = self.denied_before(peer.uid, spec, decision, bound)
        opinion = reviewer.judge(
            settings.reviewer_label, result, may=may, flagged=bool(bound.get("arguments")), denied_before=denied
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

    def meaning(self, uid: int, spec: ExecSpec | FileSpec, decision: Decision, bound: dict[str, Any]) -> Meaning:
        """What ``spec`` would run (`denials.Meaning`): how a person's denial of it is remembered."""
        if isinstance(spec, FileSpec):
            resolved = decision.stages[0].resolved if decision.stages else None
            return denials.of_file(uid, spec.run_as, spec.tool, resolved, spec.path)
        paths = [stage.resolved for stage in decision.stages]
        return denials.of_command(uid, spec.run_as, spec.stages, paths, bound.get("binaries"))

    def denied_before(self, uid: int, spec: ExecSpec | FileSpec, decision: Decision, bound: dict[str, Any]) -> bool:
        """Whether a person denied the same thing within ``approval.denial_memory_seconds`` (or the denials
        are not known: then every request counts as denied, and people decide)."""
        meaning = self.meaning(uid, spec, decision, bound)
        return self.memory.covers(meaning, time.time(), self.config.approval.denial_memory_seconds)

    def remember_denial(
        self, uid: int, spec: ExecSpec | FileSpec, decision: Decision, bound: dict[str, Any]
    ) -> dict[str, Any]:
        """A person denied it: neither a reviewer nor a grant may allow the same meaning (issues 34, 45).

        In memory at once; the fields returned, journaled in the decision, bring it back at the next
        start (`wire.journal.DENIAL_RECORDS`).
        """
        now = time.time()
        meaning = self.meaning(uid, spec, decision, bound)
        self.memory.forget_before(now - self.config.approval.denial_memory_seconds)
        self.memory.add(meaning, now)
        return {"remembered": "denial", "denial": meaning.to_dict() | {"at": now}}

    async def restore_denials(self) -> None:
        """At start: every denial a person made within the memory's time, from the journal (issue 45).

        Until this succeeds every request counts as denied (a grant or a reviewer allows nothing);
        a journal that cannot be read is tried again in the background (`RESTORE_RETRY_SECONDS`).
        """
        if not await self._restore_once() and self._retrying is None:
            self._retrying = asyncio.ensure_future(self._restore_later())

    async def _restore_later(self) -> None:
        for _ in range(RESTORE_RETRIES):
            await asyncio.sleep(RESTORE_RETRY_SECONDS)
            if await self._restore_once():
                return

    async def _restore_once(self) -> bool:
        try:
            found = await restore.denial_records(self.journal, RESTORE_SECONDS)
        except (AirlockError, OSError, TimeoutError) as exc:
            self.log.error("approval.denials.unknown", error=str(exc))
            return False
        cutoff = time.time() - self.config.approval.denial_memory_seconds
        for item in found:
            meaning, at = Meaning.from_dict(item), item.get("at")
            if meaning is not None and isinstance(at, (int, float)) and at >= cutoff:
                self.memory.add(meaning, float(at))
        self.memory.known = True
        self.log.info("approval.denials.restored", denials=len(self.memory))
        return True

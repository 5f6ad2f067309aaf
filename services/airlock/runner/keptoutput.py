"""Every job's output kept (issue 35): the running jobs' logs, retention, and the ``output`` verb.

The runner opens a job's log once ``exec.started`` is durable
(`KeptOutput.open`), closes it when the job ends (the fsync off the loop),
prunes logs at most once a minute (runner/outputkeep.py: each requester's in
a budget of its own; ``output_log.deleted`` is journaled before a file goes),
and serves approval's ``output``: a stored log, or a running job's output as
it comes (``follow``).
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

from airlock.common import validate
from airlock.common.audit import Audit, Ids
from airlock.common.config import Config
from airlock.common.errors import AirlockError
from airlock.common.server import Call
from airlock.common.wire import runner as wire
from airlock.runner import outputkeep, outputlog
from airlock.runner.jobspec import JobSpec

# Retention runs at most this often; a follower hears from us at least this often.
PRUNE_EVERY_SECONDS = 60.0
FOLLOW_TICK_SECONDS = 10.0


class KeptOutput:
    def __init__(self, config: Config, log: Any, audit: Audit) -> None:
        self.settings = config.runner
        self.log = log
        self.audit = audit
        self.logs: dict[str, outputlog.OutputLog] = {}  # running jobs' logs by file name (followed live)
        self._pruned_at = -float("inf")
        self._written = 0  # compressed bytes of logs closed since the last retention pass
        self._pruner: asyncio.Task[None] | None = None  # held: an unreferenced task may be collected

    def new_name(self, job: JobSpec) -> str | None:
        """The job's log name (journaled with its start), or None when runner.output_log_max_bytes is 0.

        The name carries whose budget the log counts in (outputkeep.py): the requester's, for its
        own-uid jobs, or the root jobs it asked for.
        """
        if self.settings.output_log_max_bytes <= 0:
            return None
        requester = job.owner_uid if job.owner_uid is not None else job.identity.uid
        return outputlog.new_name(owner=outputlog.group(requester, root=job.identity.uid == 0))

    def open(self, job: JobSpec, ids: Ids, name: str | None) -> outputlog.OutputLog | None:
        """This job's output log (outputlog.py), or None when it keeps none."""
        if name is None:
            return None
        header = {"operation_id": ids.operation_id, "request_id": ids.request_id, "uid": job.owner_uid}
        log = outputlog.OutputLog(self.settings.output_dir, name, self.settings.output_log_max_bytes, header)
        self.logs[log.name] = log
        return log

    async def close(self, log: outputlog.OutputLog | None) -> dict[str, Any] | None:
        if log is None:
            return None
        # The fsync off the loop (other jobs' output keeps flowing); followers are ended on it.
        kept = await asyncio.to_thread(log.finish) if log.stored else log.finish()
        log.end_followers()
        self.logs.pop(log.name, None)
        if kept.get("failed"):
            self.log.error("runner.output_log.failed", file=log.name, error=kept["failed"])
        now = asyncio.get_running_loop().time()
        self._written += int(kept.get("compressed_bytes") or 0)
        # Retention, off the loop: at most once a minute, or sooner once a budget's worth was written
        # since the last pass (a flood of output outruns its budget by about that much at most).
        soon = min(self.settings.output_log_agent_bytes, self.settings.output_log_root_bytes)
        busy = self._pruner is not None and not self._pruner.done()
        if not busy and (now - self._pruned_at >= PRUNE_EVERY_SECONDS or self._written >= soon):
            self._pruned_at = now
            self._written = 0
            self._pruner = asyncio.get_running_loop().create_task(self._prune(), name="runner-prune")
        return kept

    async def _prune(self) -> None:
        settings = self.settings
        budgets = outputkeep.Budgets(
            max_age=settings.output_log_max_age_seconds,
            agent=settings.output_log_agent_bytes,
            root=settings.output_log_root_bytes,
            total=settings.output_log_total_bytes,
        )
        try:
            entries = await asyncio.to_thread(outputkeep.scan, settings.output_dir, frozenset(self.logs))
            doomed = outputkeep.plan(entries, budgets, time.time())
            for start in range(0, len(doomed), outputkeep.PER_RECORD):
                batch = doomed[start : start + outputkeep.PER_RECORD]
                # Journaled first: a log never goes unrecorded (a journal that cannot take it keeps the file).
                await self.audit.record(
                    "output_log.deleted", Ids(None, None, 0), payload={"files": [d.to_dict() for d in batch]}
                )
                await asyncio.to_thread(outputkeep.remove, settings.output_dir, [d.name for d in batch])
        except (OSError, AirlockError) as exc:  # retention tries again after the next job
            why = exc.message if isinstance(exc, AirlockError) else exc.strerror or type(exc).__name__
            self.log.error("runner.output_log.prune_failed", error=why)
            return
        if doomed:
            self.log.info("runner.output_log.pruned", count=len(doomed))

    async def output(self, call: Call, args: wire.Output) -> wire.OutputRead:
        """approval, for an operator: a job's stored output log, or (``follow``) its output as it comes.

        Only approval may ask (the door's declaration); the agent door has no such verb.
        """
        name = args.file
        if not outputlog.valid_name(name):
            raise validate.bad("file", "is not an output log's name")
        if args.follow:
            running = self.logs.get(name)
            if running is not None:
                return await self._follow(call, running)
        settings = self.settings
        found = await asyncio.to_thread(outputlog.read, settings.output_dir, name, settings.output_log_max_bytes)
        return wire.OutputRead(
            file=name,
            running=False,
            complete=found["complete"],
            chunks=tuple(wire.Chunk(n, s, ms, base64.b64encode(d).decode()) for n, s, ms, d in found["chunks"]),
            streams=tuple(found["streams"]),
            log_sha256=found["log_sha256"],
        )

    async def _follow(self, call: Call, log: outputlog.OutputLog) -> wire.OutputRead:
        follower = log.follow()
        try:
            while True:
                got, dropped, ended = await outputlog.next_chunks(log, follower, FOLLOW_TICK_SECONDS)
                if dropped:
                    await call.emit("dropped", {"bytes": dropped})
                for kind, stage, data in got:
                    name = outputlog.KINDS[kind]
                    await call.emit(name, {"stream": name, "stage": stage, "data": base64.b64encode(data).decode()})
                if ended:
                    return wire.OutputRead(file=log.name, running=False, ended=True)
                if not got and not dropped:
                    await call.emit("tick", {})  # the reader learns the job still runs (and its wait stays bounded)
        finally:
            log.followers.discard(follower)

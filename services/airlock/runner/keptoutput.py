"""Every job's output kept (issue 35): the running jobs' logs, retention, and the ``output`` verb.

The runner opens a job's log once ``exec.started`` is durable
(`KeptOutput.open`), closes it when the job ends (the fsync off the loop),
prunes old logs at most once a minute, and serves approval's ``output``: a
stored log, or a running job's output as it comes (``follow``).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from airlock.common import validate
from airlock.common.audit import Ids
from airlock.common.config import Config
from airlock.common.server import Call
from airlock.common.wire import runner as wire
from airlock.runner import outputlog
from airlock.runner.jobspec import JobSpec

# Retention runs at most this often; a follower hears from us at least this often.
PRUNE_EVERY_SECONDS = 60.0
FOLLOW_TICK_SECONDS = 10.0


class KeptOutput:
    def __init__(self, config: Config, log: Any) -> None:
        self.settings = config.runner
        self.log = log
        self.logs: dict[str, outputlog.OutputLog] = {}  # running jobs' logs by file name (followed live)
        self._pruned_at = -float("inf")
        self._pruner: asyncio.Task[None] | None = None  # held: an unreferenced task may be collected

    def new_name(self) -> str | None:
        """The next job's log name (journaled with its start), or None when runner.output_log_max_bytes is 0."""
        return outputlog.new_name() if self.settings.output_log_max_bytes > 0 else None

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
        if now - self._pruned_at >= PRUNE_EVERY_SECONDS:  # retention: at most once a minute, off the loop
            self._pruned_at = now
            self._pruner = asyncio.get_running_loop().create_task(self._prune(), name="runner-prune")
        return kept

    async def _prune(self) -> None:
        settings = self.settings
        try:
            removed = await asyncio.to_thread(
                outputlog.prune,
                settings.output_dir,
                max_age=settings.output_log_max_age_seconds,
                total=settings.output_log_total_bytes,
                keep=frozenset(self.logs),
            )
        except OSError as exc:  # retention tries again after the next job
            self.log.error("runner.output_log.prune_failed", error=exc.strerror or type(exc).__name__)
            return
        if removed:
            self.log.info("runner.output_log.pruned", count=len(removed))

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

"""An operator reads a job's output (issue 35): ``output`` (the stored log) and ``logs`` (``--follow``).

`OutputReads` is a part of `airlock.approval.service.Approval` (its mixin).
The operator door names a request (request or operation ID, ``AGENT/ID``);
approval finds its ``exec.started`` (which names the runner's log file) and
``exec.finished`` (each stored stream's length and SHA-256, and whether the
log was cut) in the journal, and asks the runner, whose ``output`` verb only
approval's uid may call.  The agent door has no verb that reads a log: an
agent gets only what its own request returned.

``output`` compares the runner's digests of the file with the chain's and
says ``verified`` (or what differs): each stream's, and ``log_sha256``, the
whole log as written, notes and frame order included (issue 51; a log kept
before it has none, and ``whole`` says so).  Each read is journaled as an
``operator.action`` (``output`` or ``logs``) naming the request, as a
session playback is in Teleport.  Observers may not read output: it can hold
what a job printed about the system.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from airlock.common.audit import Audit, Ids
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.server import Call
from airlock.common.wire import operator as op
from airlock.common.wire import runner as runner_wire

# The longest a follow may last: a job's own timeout ends it sooner (the runner ends the stream).
FOLLOW_MAX_SECONDS = 7 * 86400.0


def _payload(event: dict[str, Any]) -> dict[str, Any]:
    payload = event.get("payload")
    return payload if isinstance(payload, dict) else {}


def job_records(events: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The last ``exec.started`` of a request's events and the ``exec.finished`` after it (or None)."""
    started = finished = None
    for event in events:
        if event.get("kind") == "exec.started":
            started, finished = event, None
        elif event.get("kind") == "exec.finished" and started is not None:
            finished = event
    return started, finished


def compare(chain: list[dict[str, Any]], stored: list[dict[str, Any]]) -> list[str]:
    """Streams whose stored digest or length is not what the chain holds (empty: the file is what ran)."""

    def keyed(items: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[Any, Any]]:
        return {(str(i.get("stream")), int(i.get("stage") or 0)): (i.get("bytes"), i.get("sha256")) for i in items}

    want, got = keyed(chain), keyed(stored)
    return [
        f"{name} of stage {stage + 1}"
        for name, stage in sorted(set(want) | set(got))
        if want.get((name, stage)) != got.get((name, stage))
    ]


class OutputReads:
    """The operator door's ``output`` and ``logs``: a job's output, read from the runner, journaled as read."""

    def __init__(
        self, audit: Audit, runner: Client, request_events: Callable[[str], Awaitable[list[dict[str, Any]]]]
    ) -> None:
        self.audit = audit
        self.runner = runner
        # A request's journal events by its request ID (or AGENT/ID), else by operation ID (the operators' `show`).
        self._request_events = request_events

    async def _job(self, ref: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
        started, finished = job_records(await self._request_events(ref))
        if started is None:
            raise AirlockError(ErrorCode.NOT_FOUND, f"{ref!r} names no job that started (no exec.started)")
        return started, finished

    async def _journal_read(self, call: Call, started: dict[str, Any], action: str) -> None:
        await self.audit.record(
            "operator.action",
            Ids(None, None, call.peer.uid),
            payload={
                "action": action,
                "operator": call.peer.user,
                "request_id": started.get("request_id"),
                "operation_id": started.get("operation_id"),
                "agent_uid": started.get("peer_uid"),
            },
        )

    async def output(self, call: Call, args: op.JobRef) -> op.Output:
        """A job's stored output, checked against the chain's digests."""
        return op.Output(await self._output(call, args.ref))

    async def _output(self, call: Call, ref: str) -> dict[str, Any]:
        started, finished = await self._job(ref)
        ids = {"request_id": started.get("request_id"), "operation_id": started.get("operation_id")}
        name = _payload(started).get("output_log")
        if finished is None:
            return ids | {"running": True, "chunks": [], "message": "the job is still running: airlock logs --follow"}
        kept = _payload(finished).get("output_log")
        if not isinstance(name, str) or not isinstance(kept, dict):
            return ids | {"running": False, "chunks": [], "message": "no output log was kept for this job"}
        if not kept.get("file"):
            why = f"the output log could not be written: {kept['failed']}" if kept.get("failed") else "no output"
            return ids | {"running": False, "chunks": [], "chain": kept, "message": why}
        await self._journal_read(call, started, "output")
        stored = (
            await runner_wire.stub(self.runner).call(runner_wire.OUTPUT, runner_wire.Output(name), timeout=60)
        ).to_dict()
        differ = compare(list(kept.get("streams") or []), list(stored.get("streams") or []))
        whole = kept.get("log_sha256")
        if whole is not None and stored.get("log_sha256") != whole:
            differ.append("the log as written (its frames, their order, airlock's notes)")
        return ids | {
            "running": False,
            "file": name,
            "chunks": stored.get("chunks") or [],
            "streams": stored.get("streams") or [],
            "complete": bool(stored.get("complete")),
            "chain": kept,
            "cut": bool(kept.get("cut")),
            "verified": not differ,
            "whole": whole is not None,  # False: an older log, whose notes and frame order no digest covers
            "mismatches": differ,
        }

    async def logs(self, call: Call, args: op.JobRef) -> op.Output:
        """A running job's output as it comes (events ``stdout``, ``stderr``, ``dropped``, ``tick``); a job that
        ended: its stored log, as ``output``."""
        return op.Output(await self._logs(call, args.ref))

    async def _logs(self, call: Call, ref: str) -> dict[str, Any]:
        started, finished = await self._job(ref)
        name = _payload(started).get("output_log")
        if finished is not None or not isinstance(name, str):
            return await self._output(call, ref) | {"followed": False}
        await self._journal_read(call, started, "logs")

        async def relay(event: Any) -> None:
            await call.emit(event.event, dict(event.fields))

        try:
            done = (
                await runner_wire.stub(self.runner).call(
                    runner_wire.OUTPUT,
                    runner_wire.Output(name, follow=True),
                    on_event=relay,
                    timeout=FOLLOW_MAX_SECONDS,
                )
            ).to_dict()
        except AirlockError as exc:
            if exc.code is ErrorCode.NOT_FOUND:  # it ended between the journal's answer and ours, and kept nothing
                return {"request_id": started.get("request_id"), "followed": True, "ended": True, "chunks": []}
            raise
        if done.get("chunks") is not None:  # it ended before the runner saw us: the stored log
            return await self._output(call, ref) | {"followed": False}
        return {"request_id": started.get("request_id"), "operation_id": started.get("operation_id")} | {
            "followed": True,
            "ended": True,
        }

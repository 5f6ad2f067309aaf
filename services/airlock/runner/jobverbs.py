"""An operator's verbs on running jobs, through approval: ``kill`` and ``running``.

The runner holds each running job's `JobControl` under its key (the
requesting agent's uid, the operation ID) with the job's request ID; an
operator names a job by either ID, or as AGENT/ID when two agents' jobs share
it.  Who may call these is the door's declaration (wire/runner.py: approval).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import Any

from airlock.common import validate
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire import runner as wire
from airlock.runner.control import JobControl, signal_name

KILL_SIGNALS = frozenset({"TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT"})
MAX_LISTED = 256  # running jobs one `running` lists

# A running job: (requesting uid, operation ID) -> (request ID, its live control).
Controls = Mapping[tuple[int, str], tuple[str | None, JobControl]]


def kill_signal(untrusted: Any) -> int:
    """A signal an operator may send a job: a name from `KILL_SIGNALS` (with or without SIG), default TERM."""
    name = "TERM" if untrusted is None else validate.text("signal", untrusted, max_len=16, allow_empty=False)
    name = name.upper().removeprefix("SIG")
    if name not in KILL_SIGNALS:
        raise validate.bad("signal", "must be one of " + ", ".join(sorted(KILL_SIGNALS)))
    return int(getattr(signal, "SIG" + name))


async def kill(controls: Controls, args: wire.Kill, log: Any) -> wire.Killed:
    """Signal a running job (``ref``: its request or operation ID; ``uid``: that agent's only)."""
    signum = kill_signal(args.signal)
    found = [
        (key, request_id, control)
        for key, (request_id, control) in controls.items()
        if args.ref in (key[1], request_id) and args.uid in (None, key[0])
    ]
    if not found:
        raise AirlockError(ErrorCode.NOT_FOUND, f"no running job has ID {args.ref!r}")
    if len(found) > 1:
        raise AirlockError(
            ErrorCode.CONFLICT,
            f"{len(found)} agents have a running job with ID {args.ref!r}; name one as AGENT/ID",
            {"owners": sorted({key[0] for key, _, _ in found})},
        )
    (owner, operation_id), request_id, control = found[0]
    if args.dry:  # approval journals whom it kills first
        return wire.Killed(operation_id=operation_id, request_id=request_id, agent_uid=owner)
    was = await control.kill(signum, args.by, args.reason)
    log.info(
        "runner.job.killed", operation_id=operation_id, request_id=request_id, signal=signal_name(signum), by=args.by
    )
    return wire.Killed(
        operation_id=operation_id, request_id=request_id, agent_uid=owner, signal=signal_name(signum), was=was
    )


def running(controls: Controls) -> wire.Running:
    """The commands running now (an operator's `running`, `airlock watch`)."""
    return wire.Running(
        tuple(
            wire.RunningJob(operation_id=op, request_id=request_id, **control.summary)
            for (_owner, op), (request_id, control) in list(controls.items())[:MAX_LISTED]
            if control.summary
        )
    )

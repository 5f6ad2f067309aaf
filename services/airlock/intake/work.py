"""One request as the intake drive needs it, whatever its kind (exec or a file operation).

`exec_work` and `file_work` build a `Work` from a parsed request; `Intake.drive`
takes it through journal -> approval -> runner -> journal.  A file request
takes the same path as exec, with the file spec in place of the exec spec:
``op.begin`` (new, replay, conflict, in progress), ``decide`` (the policy's
``files:`` rules, or an operator who sees the diff), the runner's ``files``
verb with the single-use ticket, ``op.complete``.  An operation that ran is
settled even when its outcome is an error (permission denied, no match): like
a non-zero exit, it is evidence, and it replays.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airlock.common.config import Config
from airlock.common.peer import Peer
from airlock.common.wire import runner as wire
from airlock.common.wire.verb import Verb
from airlock.intake.fileop_request import FileRequest
from airlock.intake.request import ExecRequest


@dataclass(frozen=True, slots=True)
class Work:
    """One request as `Intake.drive` needs it, whatever its kind (exec or file operation)."""

    request_id: str
    operation_id: str
    session: str
    digest: str  # of the spec: binds the approval ticket and keys replay
    run_as: int
    privileged: bool
    describe: dict[str, Any]  # what the audit record and operators see
    decide_request: dict[str, Any]  # what approval decides on
    has_protected: bool
    runner_verb: Verb[Any, Any]  # wire.runner.EXEC or FILES
    runner_args: wire.Exec | wire.Files  # without approval's answer, which drive adds (`wire.runner.approved`)
    runner_timeout: float | None
    thin: Callable[[dict[str, Any]], dict[str, Any]]  # the outcome as kept for replay when it is large
    join: bool = False  # an agent's sudo (issue 48): it may leave while pending, and its retry joins (drive.py)


def own_operation_id() -> str:
    """The operation of a request that names none: its own, never another request's.

    A request is answered from another request's outcome only when the client
    named the same operation ID (issue 30).  Two identical commands with
    distinct request IDs are two intents: both run.  (On the sudo-proxy
    dialect, which has no operation field, the request is its own operation;
    its id cannot be reused anyway: the replay gate refuses it.)
    """
    return f"req-{uuid.uuid4()}"


def thin_exec_outcome(evidence: dict[str, Any]) -> dict[str, Any]:
    # Large output is not kept for replay: the digests and sizes are.
    return evidence | {
        "stdout": "",
        "stages": [s | {"stderr": ""} for s in evidence.get("stages", [])],
        "output_retained": False,
    }


def _thin_file_outcome(outcome: dict[str, Any]) -> dict[str, Any]:
    # Large results are not kept for replay: their hashes and sizes are.
    return {k: v for k, v in outcome.items() if k not in ("content", "entries", "paths", "matches", "diff")} | {
        "output_retained": False
    }


def runner_budget(req: ExecRequest, config: Config) -> float:
    """How long a runner may take to answer: the job's own timeout, the kill
    grace, and a margin for its journal and approval calls.  Without a
    bound a stopped or wedged runner would hang the request for ever."""
    limits = config.limits
    job = req.spec.timeout_ms / 1000 if req.spec.timeout_ms else limits.default_timeout_seconds
    return job + limits.kill_grace_seconds + 30


def asking(req: ExecRequest | FileRequest) -> dict[str, Any]:
    """The agent's words about its request, beside its spec (`wire.approval.Asking`)."""
    return {
        "request_id": req.request_id,
        "reason": req.reason,
        "session": req.session,
        "host": req.host,
        "time": req.time,
    }


def exec_work(req: ExecRequest, peer: Peer, config: Config) -> Work:
    """An exec request as `Intake.drive` takes it."""
    spec = req.spec
    spec_dict = spec.to_dict()  # once: this is every request's path
    describe = req.describe()
    return Work(
        request_id=req.request_id,
        operation_id=req.operation_id or own_operation_id(),
        session=req.session,
        digest=spec.digest(),
        run_as=spec.run_as,
        privileged=spec.privileged,
        describe=describe,
        # The spec once (wire.approval.Decide); `wait` only when the agent said not to (sudo -n).
        decide_request={"request": asking(req), "spec": spec_dict} | ({} if req.wait else {"wait": False}),
        has_protected=bool(req.protected_env),
        runner_verb=wire.EXEC,
        runner_args=wire.Exec(
            spec=spec,
            operation_id="",  # drive's, with the ticket
            protected_env=req.protected_env,
            request_id=req.request_id,
            session=req.session,
            stream=req.stream,
            peer=wire.Requester(peer.pid, peer.uid),
        ),
        runner_timeout=runner_budget(req, config),
        thin=thin_exec_outcome,
        join=req.join,
    )


def file_work(req: FileRequest, config: Config) -> Work:
    """A file request as `Intake.drive` takes it: the same path as exec."""
    spec = req.spec
    return Work(
        request_id=req.request_id,
        operation_id=req.operation_id or own_operation_id(),
        session=req.session,
        digest=spec.digest(),
        run_as=spec.run_as,
        privileged=spec.privileged,
        describe=req.describe(),
        decide_request={"request": asking(req), "file": spec.to_dict()},
        has_protected=False,
        runner_verb=wire.FILES,
        runner_args=wire.Files(spec=spec, operation_id="", request_id=req.request_id, session=req.session),
        # The job's timeout, the kill grace and a margin for the runner's journal and approval calls.
        runner_timeout=config.limits.default_timeout_seconds + config.limits.kill_grace_seconds + 30,
        thin=_thin_file_outcome,
    )

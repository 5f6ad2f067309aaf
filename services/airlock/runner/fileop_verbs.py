"""The runner's file verbs: ``files`` (approved work) and ``files_preview`` (the operator's diff).

``files`` follows the same rules as ``exec``: the ticket is redeemed (single
use, bound to the file spec's digest and to what approval resolved, the
reviewed pre-state ``bound["file"]``) before anything is touched,
``files.started`` is durable in the journal first, and the work runs as a job
of `spawn.run_job`: a fresh exec of `runner.fileop_child` as the target identity,
with the containment, timeout, cancel and output cap of exec jobs
(``files_search`` also gets ``limits.search_cpu_seconds`` of CPU).
``files.finished`` records the outcome without content: the error code, and
for writes the before and after hashes.

``files_preview`` is asked by approval for a write or edit that waits for an
operator: it computes the unified diff the operation would make now and the
current content's sha256, and writes nothing.  It runs as the target
identity, or with ``as_requester`` as the agent that asked (approval asks so
for a privileged write to a path no rule names: an unapproved request must
not copy anything out of a file its agent cannot read).  The diff goes to
operators only; the sha256 comes back bound to the ticket.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import sys
from typing import Any

import airlock
from airlock.common import validate
from airlock.common.audit import Ids
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.fileop_spec import FileSpec
from airlock.common.server import Call
from airlock.common.spec import check_privilege
from airlock.common.wire import runner as wire
from airlock.runner import recheck
from airlock.runner.identity import Identity, resolve_identity
from airlock.runner.spawn import JobResult, JobSpec, run_job

# Fields of an outcome kept in the audit record (never content).
_AUDITED = (
    "ok",
    "error",
    "before_sha256",
    "after_sha256",
    "size_bytes",
    "created",
    "content_sha256",
    "length_bytes",
    "offset_bytes",
    "uid",
    "gid",
    "duration_ms",
)

OUTPUT_CAP = 64 * 1024 * 1024  # one operation's JSON answer at most; more is limit_exceeded
PREVIEW_TIMEOUT = 30.0
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(airlock.__file__)))
# -I: no environment, no user site, no script directory; the package is put first on
# sys.path by the runner (the system python runs it, whatever venv the runner uses).
_ENTRY = "import sys; sys.path.insert(0, sys.argv[1]); from airlock.runner.fileop_child import main; sys.exit(main())"
_REFUSALS = {"file_changed": ErrorCode.FILE_CHANGED, "limit_exceeded": ErrorCode.LIMIT_EXCEEDED}


def fileop_argv() -> tuple[str, ...]:
    return (os.path.realpath(sys.executable), "-I", "-B", "-c", _ENTRY, _PACKAGE_ROOT)


def bound_expectation(untrusted: Any) -> str | None:
    """The pre-state approval bound to the ticket (``bound["file"]["sha256"]``): "absent", a sha256, or None."""
    if untrusted is None:
        return None
    if not isinstance(untrusted, dict) or set(untrusted) != {"sha256"}:
        raise validate.bad("bound.file", "must be an object with sha256")
    value = untrusted["sha256"]
    if value != "absent" and not (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    ):
        raise validate.bad("bound.file.sha256", "must be absent or 64 lowercase hex digits")
    return str(value)


async def execute(
    spec: FileSpec,
    identity: Identity,
    *,
    timeout: float,  # noqa: ASYNC109  the operation's limit: expiring stops its process (an outcome)
    preview_only: bool = False,
    expect: str | None = None,
    cpu_seconds: int | None = None,
    operation_id: str | None = None,
    cancel: asyncio.Event | None = None,
    containment: Containment = Containment.PROCESS_GROUP,
    kill_grace_seconds: float = 1.0,
    slice: str = "airlock-jobs.slice",
    owner_uid: int | None = None,
) -> dict[str, Any]:
    """Run ``spec`` in a fresh `runner.fileop_child` process that is ``identity``; return the outcome.

    The runner must be root, or already ``identity`` (dev mode), which the
    caller checked.  Timeout and cancel end the process as they end exec jobs
    (SIGTERM, grace, SIGKILL); both are outcomes (``timeout``, ``cancelled``).
    A search that used up its CPU limit, or an answer over the output cap,
    is refused with ``limit_exceeded``.
    """
    request = {
        "spec": spec.to_dict(),
        "preview": preview_only,
        "expect": expect,
        "cpu_seconds": cpu_seconds if spec.tool == "files_search" else None,
    }
    job = JobSpec(
        operation_id=operation_id or f"files-preview-{secrets.token_hex(8)}",
        mode="exec",
        stages=(fileop_argv(),),
        identity=identity,
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
        cwd="/",
        stdin=json.dumps(request, separators=(",", ":")).encode(),
        timeout_seconds=timeout,
        deadline=None,
        max_output_bytes=OUTPUT_CAP,
        kill_grace_seconds=kill_grace_seconds,
        protected_values=(),
        containment=containment,
        slice=slice,
        owner_uid=owner_uid,
    )
    result = await run_job(job, cancel=cancel)
    return _outcome(result, timeout) | {
        "started_at": result.started_at,
        "ended_at": result.ended_at,
        "duration_ms": result.duration_ms,
        "uid": identity.uid,
        "gid": identity.gid,
    }


def _failed(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message}}


def _outcome(result: JobResult, timeout: float) -> dict[str, Any]:
    if result.cancelled:
        return _failed("cancelled", "the file operation was cancelled")
    if result.timed_out:
        return _failed("timeout", f"the file operation took more than {timeout:g}s")
    stage = result.stages[0]
    if stage.signal == signal.SIGXCPU:
        return _failed("limit_exceeded", "the file operation used up its CPU time limit and was stopped")
    if stage.signal == signal.SIGKILL:
        # Timeout and cancel are reported above: this is the kernel (the hard CPU limit, or memory).
        return _failed("limit_exceeded", "the file operation was stopped by a resource limit (SIGKILL)")
    if result.stdout_truncated:
        return _failed("limit_exceeded", f"the file operation's answer is larger than {OUTPUT_CAP} bytes")
    try:
        outcome = json.loads(result.stdout) if stage.exit_code == 0 else None
    except ValueError:
        outcome = None
    if not isinstance(outcome, dict):
        detail = stage.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return _failed(
            "io_error", f"the file operation failed (exit {stage.exit_code}, signal {stage.signal}) {detail[0]}".strip()
        )
    return outcome


class FileVerbs:
    def __init__(self, runner: Any) -> None:
        self.runner = runner  # runner.service.Runner: config, audit, approval client, _refuse, running

    def _identity(self, spec: FileSpec) -> Identity:
        check_privilege(spec.run_as, os.geteuid(), privileged=spec.privileged)
        return resolve_identity(spec.run_as)

    def _timeout(self) -> float:
        return float(self.runner.config.limits.default_timeout_seconds)

    def _job_settings(self) -> dict[str, Any]:
        config = self.runner.config
        return {
            "containment": self.runner.containment(),
            "kill_grace_seconds": config.limits.kill_grace_seconds,
            "slice": config.runner.slice,
        }

    async def files(self, call: Call, args: wire.Files) -> wire.Outcome:
        spec = args.spec
        key = (spec.uid, args.operation_id)  # operation IDs are per agent (issue 14), as for exec
        if key in self.runner.running:
            raise AirlockError(ErrorCode.OPERATION_IN_PROGRESS, "this operation is already running")
        # Registered before the first await, as for exec: a cancel that comes early is not lost.
        cancel = asyncio.Event()
        self.runner.running[key] = cancel
        try:
            return wire.Outcome(await self._files(args, cancel))
        finally:
            self.runner.running.pop(key, None)

    async def _files(self, args: wire.Files, cancel: asyncio.Event) -> dict[str, Any]:
        spec, operation_id = args.spec, args.operation_id
        ids = Ids(args.request_id, operation_id, spec.uid, args.session)
        digest = spec.digest()  # computed here, once: the ticket is bound to it (redeem checks)
        after = list(args.after)  # the request's deferred records (issue 21)
        try:
            decided = await recheck.redeem(self.runner.approval, args.ticket, digest, args.bound)
            if decided is not None and decided not in after:
                after.append(decided)
            # Redeemed: what approval bound is now what the runner enforces.
            expect = bound_expectation(args.bound.get("file"))
            identity = self._identity(spec)
        except AirlockError as exc:
            raise await self.runner._refuse(exc, ids, after) from None
        await self.runner.audit.record(
            "files.started",
            ids,
            payload={
                "digest": digest,
                "file": spec.describe(),
                "uid": identity.uid,
                "gid": identity.gid,
                "expect_sha256": expect,
            },
            after=after,
        )
        try:
            outcome = await execute(
                spec,
                identity,
                timeout=self._timeout(),
                expect=expect,
                cpu_seconds=self.runner.config.limits.search_cpu_seconds,
                operation_id=operation_id,
                cancel=cancel,
                owner_uid=spec.uid,
                **self._job_settings(),
            )
        except AirlockError as exc:
            # The scope could not be created or the interpreter not started: nothing was touched.
            raise await self.runner._refuse(exc, ids) from None
        outcome = outcome | {
            "operation_id": operation_id,
            "tool": spec.tool,
            "path": spec.path,
            "hostname": socket.gethostname(),
        }
        error = outcome.get("error") or {}
        await self.runner.audit.record(
            "files.finished",
            ids,
            payload={"tool": spec.tool, "path": spec.path} | {k: outcome[k] for k in _AUDITED if k in outcome},
            log_fields={"ok": outcome.get("ok"), "code": error.get("code")},
        )
        refusal = _REFUSALS.get(str(error.get("code")))
        if refusal is not None:
            # Not a settled outcome: nothing was written (file_changed) or nothing is returned (limit_exceeded).
            raise AirlockError(refusal, str(error.get("message")), {"tool": spec.tool, "path": spec.path})
        return outcome

    async def files_preview(self, call: Call, args: wire.Preview) -> wire.Outcome:
        spec = args.spec
        if not spec.writes:
            raise validate.bad("spec", "only writes and edits have a preview")
        if args.as_requester:
            check_privilege(spec.uid, os.geteuid(), privileged=False)
            identity = resolve_identity(spec.uid)
        else:
            identity = self._identity(spec)
        return wire.Outcome(
            await execute(
                spec, identity, timeout=min(self._timeout(), PREVIEW_TIMEOUT), preview_only=True, **self._job_settings()
            )
        )

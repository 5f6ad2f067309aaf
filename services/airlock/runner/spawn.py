"""The one place airlock starts a job's processes.

A job is one argv pipeline (or ``/bin/sh -c`` for shell mode): stages joined
by OS pipes, each running as the job's identity, in a clean environment, with
stdin from the request's bytes or /dev/null.  The runner reads only the last
stage's stdout and every stage's stderr, redacts protected values, caps each
stream and all of them together (streams.py: while reading), and enforces
timeout, deadline and cancel with the one stop of `airlock.common.child`
(SIGTERM, a grace period, then SIGKILL), whose exit description it reports
too.  Every child is always waited for.

Containment (scope.py): ``process-group``, every stage leads its own session
and process group and signals go to all of them (a process that calls
setsid() itself escapes, as in reference/001); or ``scope``, a transient
systemd scope around everything the job starts, with the stages waiting
before exec until they are inside it; or ``service`` (units.py), every stage
its own transient service started by systemd, confined by the rule's sandbox.

Its parts: the spec (jobspec.py), the binaries held by fd (binaries.py), the
pipes and output streams (streams.py), the containment chosen (containment.py)
and the scope stages' gate (gate.py); this module starts and supervises.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import structlog

from airlock.common.child import describe_exit, terminate
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.spec import check_privilege
from airlock.runner import arguments, units, unitstart
from airlock.runner.binaries import _Binary, _close_all, _is_own_identity, _open_all
from airlock.runner.containment import (
    ServiceContainment,
    _containment_for,
    systemd_is_running,
)
from airlock.runner.control import JobControl
from airlock.runner.evidence import JobResult, StageResult, sha256_hex
from airlock.runner.gate import _GATE_SHIM, _gate_payload
from airlock.runner.identity import HeldDir, open_cwd
from airlock.runner.jobspec import JobSpec, running_key
from airlock.runner.outputlog import OutputLog
from airlock.runner.scope import ProcessGroups
from airlock.runner.streams import OutputBudget, OutputCallback, _Fd, _feed, _grow_pipe, _pump, _Stream, _wait_exit

__all__ = [
    "JobResult",
    "JobSpec",
    "OutputCallback",
    "StageResult",
    "describe_exit",
    "run_job",
    "running_key",
    "systemd_is_running",
]

_DRAIN_SECONDS = 2.0  # reading output after every process we can reach is gone
_SWEEP_POLL_SECONDS = 0.02
_SWEEP_KILL_WAIT_SECONDS = 1.0


# --- the job ----------------------------------------------------------------------------


class Job:
    """The mutable runtime state of one job (the spec stays frozen)."""

    def __init__(
        self,
        spec: JobSpec,
        containment: ProcessGroups,
        binaries: Sequence[_Binary],
        on_output: OutputCallback | None,
        scripts: Sequence[arguments.Script] = (),
        log: OutputLog | None = None,
        *,
        cwd: HeldDir,
    ) -> None:
        self.spec = spec
        # The working directory check_cwd walked to, held: every stage enters this fd, never spec.cwd by name.
        self.cwd = cwd
        self.log = log  # the runner's output log of this job (outputlog.py), fed with the delivered bytes
        self.scripts = tuple(scripts)  # reviewed script bytes (runner/arguments.py), checked just now
        self.binaries = tuple(binaries)  # canonical path and open fd, one per stage
        self.executables = tuple(b.path for b in binaries)
        self.containment = containment
        self.on_output = on_output
        self.procs: list[subprocess.Popen[bytes]] = []
        self.services: list[units.StageService] = []  # service containment: one per stage
        self.fds: list[_Fd] = []
        self.streams: list[tuple[_Fd, _Stream]] = []
        # One budget for every stream of every stage (limits.max_total_output_bytes), spent while reading.
        self.budget = OutputBudget(spec.max_total_output_bytes)
        self.stdin: tuple[_Fd, bytes] | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.returncodes: list[int | None] = [None] * len(spec.stages)
        self.timed_out = False
        self.cancelled = False

    def stage_pipes(self, spec: JobSpec, index: int, last: int) -> tuple[_Fd, _Fd, _Fd]:
        """A stage's stdout and stderr pipes: stderr always captured, stdout only for the last stage
        (otherwise it feeds the next one).  Returns (read_out, write_out, write_err)."""
        read_out, write_out = self.pipe()
        read_err, write_err = self.pipe()
        if index == last:
            _grow_pipe(read_out.fd)
            self.streams.append((read_out, _Stream("stdout", index, spec, self.on_output, self.budget, self.log)))
        _grow_pipe(read_err.fd)
        self.streams.append((read_err, _Stream("stderr", index, spec, self.on_output, self.budget, self.log)))
        return read_out, write_out, write_err

    def pipe(self) -> tuple[_Fd, _Fd]:
        r, w = os.pipe()
        ends = (_Fd(r), _Fd(w))
        self.fds.extend(ends)
        return ends

    def _seal_scripts(self, stage: int, args: list[str]) -> list[int]:
        """Put this stage's scripts in sealed memfds and point ``args`` at them; returns the fds to pass."""
        fds = []
        for script in self.scripts:
            if script.stage == stage:
                held = _Fd(arguments.seal(script))
                self.fds.append(held)  # closed with the job's other fds
                args[script.index] = arguments.held_path(held.fd)
                fds.append(held.fd)
        return fds

    def spawn(self) -> list[_Fd]:
        """Start every stage; returns the gates to open (scope mode) or none."""
        spec = self.spec
        last = len(spec.stages) - 1
        if spec.stdin is None:
            next_in = _Fd(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            self.fds.append(next_in)
        else:
            next_in, writer = self.pipe()
            self.stdin = (writer, spec.stdin)
        gates: list[_Fd] = []
        ids: dict[str, Any] = {}
        # Switching ids forces fork(); a job with exactly our own credentials
        # (root jobs) can take the much cheaper vfork() path.
        if os.geteuid() == 0 and not _is_own_identity(spec.identity):  # else check_privilege made sure the uid is ours
            ids = {"user": spec.identity.uid, "group": spec.identity.gid, "extra_groups": list(spec.identity.groups)}
        for index, (argv, opened) in enumerate(zip(spec.stages, self.binaries, strict=True)):
            executable = opened.path
            read_out, write_out, write_err = self.stage_pipes(spec, index, last)
            # argv[0] is the canonical path that policy matched, not the name the
            # request gave: multi-call binaries (systemctl as `reboot`) choose
            # what to do from argv[0], and policy judged the canonical binary.
            # What is executed is the file opened and checked in _open_all, through
            # its fd (kept open across exec, so a #! script's interpreter can open
            # /proc/self/fd/N too), never the path again.
            args: list[str] = [executable, *argv[1:]]
            held = f"/proc/self/fd/{opened.fd}"
            program = held
            # A script runs from a sealed memfd of the reviewed bytes, never from its path.
            sealed = self._seal_scripts(index, args)
            pass_fds: tuple[int, ...] = (opened.fd, *sealed)
            # chdir (before setuid) through the held fd's magic link: the directory checked, not the name again.
            cwd = f"/proc/self/fd/{self.cwd.fd}"
            env: dict[str, str] = dict(spec.env)
            if self.containment.gated:
                gate_in, gate_out = self.pipe()
                gates.append(gate_out)
                pass_fds = (gate_in.fd, opened.fd, *sealed)
                program = os.path.realpath(sys.executable)
                args = [program, "-I", "-S", "-c", _GATE_SHIM, str(gate_in.fd), held, *args]
                env = {}  # the job's comes through the gate
            try:
                proc = subprocess.Popen(  # noqa: S603  the held binary through our own shim; argv is the approved spec
                    args,
                    executable=program,
                    stdin=next_in.fd,
                    stdout=write_out.fd,
                    stderr=write_err.fd,
                    cwd=cwd,
                    env=env,
                    close_fds=True,
                    pass_fds=pass_fds,
                    start_new_session=True,
                    restore_signals=True,
                    umask=spec.umask,
                    **ids,
                )
            except OSError as exc:
                raise AirlockError(
                    ErrorCode.SPAWN_FAILED,
                    f"stage {index + 1}: cannot start {argv[0]}: {exc.strerror or exc}",
                    {"stage": index, "argv0": argv[0]},
                ) from None
            self.procs.append(proc)
            # The children have their ends now; ours would hide EOF.
            next_in.close()
            write_out.close()
            write_err.close()
            if self.containment.gated:
                gate_in.close()
            # The next stage reads this one's stdout straight from the pipe.
            next_in = read_out
        return gates

    def start_io(self) -> None:
        for fd, stream in self.streams:
            os.set_blocking(fd.fd, False)
            self.tasks.append(asyncio.ensure_future(_pump(fd, stream)))
        if self.stdin is not None:
            writer, data = self.stdin
            os.set_blocking(writer.fd, False)
            self.tasks.append(asyncio.ensure_future(_feed(writer, data)))

    async def _wait_all(self) -> None:
        async def one(index: int, proc: subprocess.Popen[bytes]) -> None:
            self.returncodes[index] = await _wait_exit(proc)

        async def unit(index: int, service: units.StageService) -> None:
            self.returncodes[index] = await service.wait()

        await asyncio.gather(
            *(one(i, p) for i, p in enumerate(self.procs)), *(unit(i, s) for i, s in enumerate(self.services))
        )

    async def supervise(self, budget: float, cancel: asyncio.Event | None) -> None:
        exits = asyncio.ensure_future(self._wait_all())
        self.tasks.append(exits)
        watch: set[asyncio.Future[Any]] = {exits}
        cancelled = asyncio.ensure_future(cancel.wait()) if cancel is not None else None
        if cancelled is not None:
            watch.add(cancelled)
        try:
            await asyncio.wait(watch, timeout=budget, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if cancelled is not None:
                cancelled.cancel()
        if not exits.done():
            if cancelled is not None and cancelled.done() and not cancelled.cancelled():
                self.cancelled = True
            else:
                self.timed_out = True
            await self._terminate(exits)
        await self._sweep()
        if isinstance(self.containment, ServiceContainment):
            # Units that stopped still hold the stdio fds systemd was given: collect
            # them, so the pipes reach EOF and nothing named airlock-job-* is left.
            await self.containment.release()
        await self._drain()

    async def _terminate(self, exits: asyncio.Future[None]) -> None:
        await terminate(self.containment.signal, exits, self.spec.kill_grace_seconds)

    async def _sweep(self) -> None:
        """Stop what the stages left running in the job's groups or scope."""
        if not await self.containment.occupied():
            return
        structlog.get_logger().info("runner.job.leftovers_found", operation_id=self.spec.operation_id)
        await self.containment.signal(signal.SIGTERM)
        if await self._emptied_within(self.spec.kill_grace_seconds):
            return
        await self.containment.signal(signal.SIGKILL)
        await self._emptied_within(_SWEEP_KILL_WAIT_SECONDS)

    async def _emptied_within(self, seconds: float) -> bool:
        give_up = time.monotonic() + seconds
        while await self.containment.occupied():
            if time.monotonic() >= give_up:
                return False
            await asyncio.sleep(_SWEEP_POLL_SECONDS)
        return True

    async def _drain(self) -> None:
        pumps = [t for t in self.tasks if not t.done()]
        if pumps:
            # Every process we can reach is gone; a pipe still open belongs to
            # one that escaped (process-group mode), so stop waiting for it.
            await asyncio.wait(pumps, timeout=_DRAIN_SECONDS)

    def abort(self) -> None:
        """Whatever happened: no running stage, no task, no fd left behind."""
        if any(p.returncode is None for p in self.procs):
            for proc in self.procs:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            self.containment.signal_now(signal.SIGKILL)
            for proc in self.procs:
                proc.wait()
        if isinstance(self.containment, ServiceContainment):
            if any(s.returncode is None for s in self.services):
                self.containment.signal_now(signal.SIGKILL)
            for service in self.services:  # stop and collect without waiting, unless already released
                service.release_soon()
            self.containment.remove_env_files()
        for task in self.tasks:
            task.cancel()
        for fd in self.fds:
            fd.close()


async def run_job(
    spec: JobSpec,
    *,
    on_output: OutputCallback | None = None,
    cancel: asyncio.Event | None = None,
    log: OutputLog | None = None,
    control: JobControl | None = None,
) -> JobResult:
    """Run ``spec`` to completion and return its evidence (``log``: also kept there, outputlog.py).

    Raises AirlockError before anything starts: PRIVILEGE_UNAVAILABLE,
    SPAWN_FAILED (binary not found, cwd not enterable, scope not created),
    BINARY_CHANGED (not the file approval bound), UNSAFE_BINARY (a root job's
    binary or its interpreter chain that others could change), ARGUMENT_CHANGED
    (a bound path argument is not what approval saw) or INVALID_ARGUMENTS.
    A passed deadline or an already-set ``cancel`` returns a result with
    ``started=False`` and nothing run.
    """
    check_privilege(spec.identity.uid, os.geteuid(), privileged=False)
    view = arguments.view(spec.containment)
    # Resolved once and held (O_PATH): a rename or symlink swap after this cannot move the job elsewhere.
    cwd = open_cwd(spec.identity, spec.cwd, view)
    try:
        opened = _open_all(spec)
        try:
            # A root job's changeable path arguments: still what approval bound, or nothing runs.
            scripts = await asyncio.to_thread(arguments.check, spec.arguments, view) if spec.arguments else []
            return await _execute(
                spec, _containment_for(spec), opened, on_output, cancel, scripts, log, control, cwd=cwd
            )
        finally:
            _close_all(opened)
    finally:
        cwd.close()


async def _execute(
    spec: JobSpec,
    containment: ProcessGroups,
    binaries: Sequence[_Binary],
    on_output: OutputCallback | None,
    cancel: asyncio.Event | None,
    scripts: Sequence[arguments.Script] = (),
    output_log: OutputLog | None = None,
    control: JobControl | None = None,
    *,
    cwd: HeldDir,
) -> JobResult:
    log = structlog.get_logger().bind(operation_id=spec.operation_id)
    started_wall, started_mono = time.time(), time.monotonic()
    budget, reason = spec.timeout_seconds, "timeout"
    if spec.deadline is not None and spec.deadline - started_wall < budget:
        budget, reason = spec.deadline - started_wall, "deadline"
    job = Job(spec, containment, binaries, on_output, scripts, output_log, cwd=cwd)
    if budget <= 0 or (cancel is not None and cancel.is_set()):
        job.timed_out = budget <= 0
        job.cancelled = not job.timed_out
        return _result(job, started_wall, started_mono, reason, started=False)
    try:
        if control is not None:  # the exec tree: by the stages' units (cgroups), else by fork ancestry
            await control.begin(containment.unit_names(spec) if isinstance(containment, ServiceContainment) else ())
        if isinstance(containment, ServiceContainment):
            gates: list[_Fd] = []
            if containment.scoped:
                gates = await unitstart.scopes(job, containment)
            else:
                await unitstart.services(job, containment)
        else:
            # fork+exec blocks for as long as the child takes to exec: do it off the
            # event loop so other jobs' output keeps flowing and spawns overlap.
            spawning = asyncio.ensure_future(asyncio.to_thread(job.spawn))
            try:
                gates = await asyncio.shield(spawning)
            except asyncio.CancelledError:
                await asyncio.wait({spawning})  # abort() below must see every process
                raise
            if control is not None:
                await control.claim([p.pid for p in job.procs])
            await containment.attach([p.pid for p in job.procs])
        budget -= time.monotonic() - started_mono
        if gates and (budget <= 0 or (cancel is not None and cancel.is_set())):
            # Creating the scope took the rest of the time, or cancel came
            # meanwhile: the gates stay shut, so nothing of the job ran.
            job.timed_out = budget <= 0
            job.cancelled = not job.timed_out
            return _result(job, started_wall, started_mono, reason, started=False)
        if gates:  # inside the scope now: let them exec
            # The fork server's stages have their environment already (forker.py); the shim's come here.
            payload = b"1" if isinstance(containment, ServiceContainment) else _gate_payload(spec.env)
            for gate in gates:
                os.set_blocking(gate.fd, False)
            await asyncio.gather(*(_feed(gate, payload) for gate in gates))
        log.debug("runner.job.spawned", pids=[p.pid for p in job.procs], containment=spec.containment)
        if control is not None:
            control.started(containment)
        job.start_io()
        await job.supervise(budget, cancel)
        result = _result(job, started_wall, started_mono, reason, started=True)
    finally:
        job.abort()
        if control is not None:
            await control.end()
    log.debug(
        "runner.job.finished",
        exit_codes=[s.exit_code for s in result.stages],
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        duration_ms=result.duration_ms,
    )
    return result


def _result(job: Job, started_wall: float, started_mono: float, reason: str, *, started: bool) -> JobResult:
    spec = job.spec
    stdout, stdout_truncated, stdout_sha256 = b"", False, sha256_hex(b"")
    stderr: dict[int, tuple[bytes, bool, str]] = {}
    for _fd, stream in job.streams:
        finished = stream.finish()
        if stream.name == "stdout":
            stdout, stdout_truncated, stdout_sha256 = finished
        else:
            stderr[stream.stage] = finished
    stages = []
    for index, (argv, resolved) in enumerate(zip(spec.stages, job.executables, strict=True)):
        returncode = job.returncodes[index]
        exit_code, signum = describe_exit(returncode) if returncode is not None else (None, None)
        data, truncated, digest = stderr.get(index, (b"", False, sha256_hex(b"")))
        service = job.services[index] if index < len(job.services) else None
        stages.append(
            StageResult(
                argv,
                resolved,
                exit_code,
                signum,
                data,
                truncated,
                digest,
                cpu_usec=service.cpu_nsec // 1000 if service is not None and service.cpu_nsec is not None else None,
                memory_peak_bytes=service.memory_peak if service is not None else None,
                unit=service.name if service is not None else None,
            )
        )
    ended_wall = time.time()
    return JobResult(
        operation_id=spec.operation_id,
        mode=spec.mode,
        stages=tuple(stages),
        stdout=stdout,
        stdout_truncated=stdout_truncated,
        stdout_sha256=stdout_sha256,
        started_at=iso_utc(started_wall),
        ended_at=iso_utc(ended_wall),
        duration_ms=round((time.monotonic() - started_mono) * 1000),
        timed_out=job.timed_out,
        timeout_reason=reason if job.timed_out else None,
        cancelled=job.cancelled,
        containment=spec.containment,
        scope_unit=job.containment.unit if started else None,
        started=started,
        cwd=spec.cwd,
        uid=spec.identity.uid,
        gid=spec.identity.gid,
        total_output_truncated=job.budget.truncated,
    )

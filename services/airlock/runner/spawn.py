"""The one place airlock starts a job's processes.

A job is one argv pipeline (or ``/bin/sh -c`` for shell mode): stages joined
by OS pipes, each running as the job's identity, in a clean environment, with
stdin from the request's bytes or /dev/null.  The runner reads only the last
stage's stdout and every stage's stderr, redacts protected values, caps each
stream, and enforces timeout, deadline and cancel with the one stop of
`airlock.common.child` (SIGTERM, a grace period, then SIGKILL), whose exit
description it reports too.  Every child is always waited for.

Containment (scope.py): ``process-group``, every stage leads its own session
and process group and signals go to all of them (a process that calls
setsid() itself escapes, as in reference/001); or ``scope``, a transient
systemd scope around everything the job starts, with the stages waiting
before exec until they are inside it; or ``service`` (units.py), every stage
its own transient service started by systemd, confined by the rule's sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from airlock.common import binary, sandbox
from airlock.common.child import describe_exit, terminate
from airlock.common.codec import iso_utc
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import default_path, resolve_executable
from airlock.common.sandbox import cpu_quota_property, memory_property
from airlock.common.spec import check_privilege
from airlock.runner import units
from airlock.runner.evidence import JobResult, StageResult, sha256_hex
from airlock.runner.identity import Identity, check_cwd, check_executable, encodable
from airlock.runner.redact import Capture, StreamRedactor
from airlock.runner.scope import ProcessGroups, ScopeContainment, ScopeSettings

__all__ = [
    "JobResult",
    "JobSpec",
    "OutputCallback",
    "StageResult",
    "describe_exit",
    "run_job",
    "systemd_is_running",
]

OutputCallback = Callable[[str, int, bytes], None]

_READ_SIZE = 256 * 1024
_PIPE_SIZE = 1024 * 1024  # fewer wake-ups while draining a fast producer
_WRITE_SIZE = 64 * 1024
_DRAIN_SECONDS = 2.0  # reading output after every process we can reach is gone
_SWEEP_POLL_SECONDS = 0.02
_SWEEP_KILL_WAIT_SECONDS = 1.0
_SCOPE_BACKSTOP_SLACK_SECONDS = 10.0

# Runs in each stage of a scope job: wait at the gate until the stage is inside
# the scope, then exec the real binary with the caller's argv[0].  The gate
# also carries the job's environment: the shim itself starts with an empty one,
# because Python's locale coercion (PEP 538) would add or rewrite LC_CTYPE.
# Python ignores SIGPIPE and SIGXFSZ at start-up and exec keeps ignored signals
# ignored, so they are reset first (subprocess's restore_signals does the same).
_GATE_SHIM = """\
import os, signal, sys
gate = int(sys.argv[1])
chunks = []
while True:
    chunk = os.read(gate, 65536)
    if not chunk:
        break
    chunks.append(chunk)
os.close(gate)
data = b"".join(chunks)
if data[:1] != b"1":
    os._exit(125)
env = dict(item.split(b"=", 1) for item in data[1:].split(b"\\0") if item)
signal.signal(signal.SIGPIPE, signal.SIG_DFL)
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
try:
    os.execve(sys.argv[2], sys.argv[3:], env)
except OSError as exc:
    os.write(2, ("airlock: cannot execute %s: %s\\n" % (sys.argv[2], exc.strerror)).encode())
    os._exit(127 if exc.errno == 2 else 126)
"""


def _gate_payload(env: Mapping[str, str]) -> bytes:
    """What opens a gate: the go byte, then NAME=value entries separated by NUL."""
    return b"1" + b"\0".join(os.fsencode(f"{name}={value}") for name, value in env.items())


def _invalid(message: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, message)


def running_key(untrusted_spec: Any, operation_id: str) -> tuple[int, str]:
    """The key of a running job: operation IDs belong to their agent (issue 14), exec and files alike."""
    owner = untrusted_spec.get("uid") if isinstance(untrusted_spec, dict) else None
    return (owner if isinstance(owner, int) and not isinstance(owner, bool) else -1, operation_id)


@dataclass(frozen=True, slots=True)
class JobSpec:
    operation_id: str
    mode: Literal["exec", "shell"]
    stages: tuple[tuple[str, ...], ...]  # shell mode: (("/bin/sh", "-c", command),)
    identity: Identity
    env: Mapping[str, str]
    cwd: str
    stdin: bytes | None  # None: /dev/null
    timeout_seconds: float
    deadline: float | None  # absolute, epoch seconds
    max_output_bytes: int  # per stream
    kill_grace_seconds: float
    protected_values: tuple[str, ...]
    containment: Literal["service", "scope", "process-group"]
    slice: str = "airlock-jobs.slice"
    memory_max: str | None = None
    tasks_max: int = 0
    cpu_quota: str | None = None
    umask: int = 0o022  # the job's, not the daemon's (which may be stricter)
    # The identities approval bound (bound["binaries"], one per stage): the
    # runner executes these paths' files and nothing else.  None (tests, tools):
    # argv[0] is resolved here, on the target user's default PATH.
    binaries: tuple[Mapping[str, Any], ...] | None = None
    owner_uid: int | None = None  # who asked: operation IDs are per agent, so is the scope's name
    # Each stage's rule's sandbox as approval bound it (bound["sandbox"]); service containment only.
    sandboxes: tuple[Mapping[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("exec", "shell"):
            raise _invalid(f"mode must be exec or shell (got {self.mode!r})")
        if not self.stages or any(not stage for stage in self.stages):
            raise _invalid("a job needs at least one stage, and every stage an argv")
        if any(not isinstance(arg, str) or "\0" in arg for stage in self.stages for arg in stage):
            raise _invalid("argv entries must be strings without NUL bytes")
        strings = [arg for stage in self.stages for arg in stage] + [self.cwd, *self.env.keys(), *self.env.values()]
        if not all(encodable(text) for text in strings):
            raise _invalid("argv, cwd and environment must be encodable (no lone surrogates)")
        if self.mode == "shell" and len(self.stages) != 1:
            raise _invalid("a shell job has exactly one stage")
        if self.containment not in ("service", "scope", "process-group"):
            raise _invalid(f"containment must be service, scope or process-group (got {self.containment!r})")
        if self.sandboxes is not None and len(self.sandboxes) != len(self.stages):
            raise _invalid("a job needs one sandbox (empty: none) per stage")
        if any(self.sandboxes or ()) and self.containment != "service":
            raise AirlockError(
                ErrorCode.SPAWN_FAILED,
                "this rule's sandbox needs runner.containment: service (systemd), not " + self.containment,
            )
        if any(not k or "=" in k or "\0" in k or "\0" in v for k, v in self.env.items()):
            raise _invalid("environment names must be non-empty without '=' or NUL, values without NUL")
        if self.deadline is not None and not math.isfinite(self.deadline):
            raise _invalid(f"deadline must be a finite time (got {self.deadline})")
        if not self.timeout_seconds > 0:
            raise _invalid(f"timeout must be positive (got {self.timeout_seconds})")
        if self.max_output_bytes < 0 or self.kill_grace_seconds < 0 or self.tasks_max < 0:
            raise _invalid("output cap, kill grace and tasks_max must not be negative")
        if self.binaries is not None and len(self.binaries) != len(self.stages):
            raise _invalid("a job needs one bound binary identity per stage")


def systemd_is_running() -> bool:
    """True when systemd is PID 1 (the test sd_booted() makes)."""
    return os.path.isdir("/run/systemd/system")


# --- file descriptors owned by one job ------------------------------------------


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Fd:
    """One pipe end the job owns, closable from anywhere, exactly once.

    A task waiting on it may be cancelled after the job closed it; it then
    must not unregister a later, unrelated user of the same fd number.
    """

    __slots__ = ("fd", "watched")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.watched = False  # ever registered with the event loop

    async def wait(self, *, write: bool) -> None:
        loop = asyncio.get_running_loop()
        self.watched = True
        future: asyncio.Future[None] = loop.create_future()
        fd = self.fd
        if write:
            loop.add_writer(fd, _wake, future)
        else:
            loop.add_reader(fd, _wake, future)
        try:
            await future
        finally:
            if self.fd == fd and write:  # still ours
                loop.remove_writer(fd)
            elif self.fd == fd:
                loop.remove_reader(fd)

    def close(self) -> None:
        if self.fd < 0:
            return
        if self.watched:  # only then is there a loop to tell (spawning runs in a thread)
            loop = asyncio.get_running_loop()
            loop.remove_reader(self.fd)
            loop.remove_writer(self.fd)
        os.close(self.fd)
        self.fd = -1


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Wait for a stage to exit and reap it, without a thread (pidfd)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # a kernel before 5.3
        return await asyncio.to_thread(proc.wait)
    holder = _Fd(pidfd)
    try:
        while proc.poll() is None:
            await holder.wait(write=False)
    finally:
        holder.close()
    assert proc.returncode is not None
    return proc.returncode


# --- output streams --------------------------------------------------------------


class _Stream:
    """One captured stream: redact, then cap, then deliver."""

    __slots__ = ("_callback", "_capture", "_redactor", "name", "stage")

    def __init__(self, name: str, stage: int, spec: JobSpec, on_output: OutputCallback | None) -> None:
        self.name = name
        self.stage = stage
        self._callback = on_output
        self._redactor = StreamRedactor(spec.protected_values)
        self._capture = Capture(spec.max_output_bytes, self._deliver if on_output is not None else None)

    def _deliver(self, data: bytes) -> None:
        if self._callback is None:
            return
        try:
            self._callback(self.name, self.stage, data)
        except Exception as exc:
            # A broken listener (say, a client that went away) must not stop the
            # draining that keeps the job from blocking; the evidence is complete.
            structlog.get_logger().warning("runner.output.listener_failed", stream=self.name, error=type(exc).__name__)
            self._callback = None

    def feed(self, data: bytes) -> None:
        if not self._capture.truncated:  # past the cap the bytes are only drained
            self._capture.add(self._redactor.feed(data))

    def finish(self) -> tuple[bytes, bool, str]:
        self._capture.add(self._redactor.flush())
        data = self._capture.finish()
        return data, self._capture.truncated, sha256_hex(data)


async def _pump(fd: _Fd, stream: _Stream) -> None:
    while fd.fd >= 0:
        try:
            data = os.read(fd.fd, _READ_SIZE)
        except BlockingIOError:
            await fd.wait(write=False)
            continue
        if not data:
            break
        stream.feed(data)
    fd.close()


async def _feed(fd: _Fd, data: bytes) -> None:
    """Write all of ``data`` without blocking the loop, then close (EOF for the reader)."""
    view = memoryview(data)
    try:
        while view and fd.fd >= 0:
            try:
                written = os.write(fd.fd, view[:_WRITE_SIZE])
            except BlockingIOError:
                await fd.wait(write=True)
                continue
            view = view[written:]
    except BrokenPipeError:
        pass  # the reader is gone (a stage that does not read stdin); its business
    finally:
        fd.close()


def _scope_containment(spec: JobSpec) -> ScopeContainment:
    settings = ScopeSettings(
        slice=spec.slice,
        description=f"airlock job {ascii(spec.operation_id)[1:-1]}",  # printable ASCII for systemctl
        stop_timeout_seconds=spec.kill_grace_seconds,
        memory_max=spec.memory_max,
        tasks_max=spec.tasks_max,
        cpu_quota=spec.cpu_quota,
        # Never before our own timeout, termination and sweep have had their turn.
        runtime_max_seconds=spec.timeout_seconds + 2 * spec.kill_grace_seconds + _SCOPE_BACKSTOP_SLACK_SECONDS,
    )
    return ScopeContainment(units.unit_name(spec.operation_id, spec.owner_uid, None, suffix=".scope"), settings)


class ServiceContainment(ProcessGroups):
    """Every stage in its own transient service (units.py); systemd kills what is left."""

    def __init__(self, spec: JobSpec) -> None:
        super().__init__()
        self.limits: list[sandbox.Property] = []
        if spec.memory_max is not None:
            self.limits.append(memory_property(spec.memory_max))
        if spec.tasks_max > 0:
            self.limits.append(("TasksMax", "t", spec.tasks_max))
        if spec.cpu_quota is not None:
            self.limits.append(cpu_quota_property(spec.cpu_quota))
        # Bad settings fail before anything starts.
        self.stage_limits = [sandbox.properties(sb) for sb in spec.sandboxes or [{}] * len(spec.stages)]
        self.stages: list[units.StageService] = []
        self.env_files: list[str] = []

    async def attach(self, pids: Sequence[int]) -> None:
        pass

    async def signal(self, signum: int) -> None:
        for stage in self.stages:
            if stage.returncode is None:
                await stage.kill(signum)

    def signal_now(self, signum: int) -> None:
        for stage in self.stages:
            if stage.returncode is None:
                stage.kill_now(signum)

    async def occupied(self) -> bool:
        return False  # a stage's unit stops only once systemd killed everything in it

    async def release(self) -> None:
        for stage in self.stages:
            await stage.release()
        self.remove_env_files()

    def remove_env_files(self) -> None:
        for path in self.env_files:
            with contextlib.suppress(OSError):
                os.unlink(path)
        self.env_files.clear()


def _write_env_file(name: str, env: Mapping[str, str]) -> str:
    """A root-only file for the unit's EnvironmentFile= (never a unit property: those are world-readable)."""
    dirfd = os.open(units.ENV_DIR, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd = os.open(
            f"{name}.env", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd
        )
    finally:
        os.close(dirfd)
    with os.fdopen(fd, "wb") as f:
        f.write(units.env_file_text(env))
    return os.path.join(units.ENV_DIR, f"{name}.env")


def _containment_for(spec: JobSpec) -> ProcessGroups:
    if spec.containment == "process-group":
        return ProcessGroups()
    if not systemd_is_running():
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"{spec.containment} containment needs systemd as PID 1, which is not running"
        )
    if spec.containment == "service":
        return ServiceContainment(spec)
    return _scope_containment(spec)


# --- the job ----------------------------------------------------------------------------


def _is_own_identity(identity: Identity) -> bool:
    own_groups = set(os.getgroups()) | {os.getegid()}
    return (
        identity.uid == os.geteuid() == os.getuid()
        and identity.gid == os.getegid() == os.getgid()
        and set(identity.groups) | {identity.gid} == own_groups
    )


@dataclass(frozen=True, slots=True)
class _Binary:
    """One stage's binary, held open: its canonical path (the argv[0] the job
    sees) and the O_PATH fd that is executed (``/proc/self/fd/N``)."""

    path: str
    fd: int
    st: os.stat_result


def _stage_error(exc: AirlockError, index: int, argv0: str) -> AirlockError:
    return AirlockError(exc.code, f"stage {index + 1}: {exc.message}", exc.details | {"stage": index, "argv0": argv0})


def _open_all(spec: JobSpec) -> list[_Binary]:
    """Open every stage's binary and check it, before anything starts.

    With bound identities (the runner service) the path is approval's and the
    open file must be the file approval saw: same device and inode, and for a
    root job the same owner and mode, and root's alone (``unsafe_binary``).  A
    bare name is never looked up on the request's PATH.
    """
    trusted = spec.identity.uid == 0
    opened: list[_Binary] = []
    try:
        for index, argv in enumerate(spec.stages):
            if spec.binaries is not None:
                expected = spec.binaries[index]
                path: str | None = str(expected.get("path", ""))
            else:
                expected = None
                path = resolve_executable(argv[0], default_path(spec.identity.uid))
            if path is None:
                raise AirlockError(
                    ErrorCode.SPAWN_FAILED,
                    f"stage {index + 1}: {argv[0]}: command not found",
                    {"stage": index, "argv0": argv[0]},
                )
            try:
                fd, st = binary.open_binary(path, trusted=trusted)
                opened.append(_Binary(path, fd, st))
                if expected is not None:
                    differs = binary.mismatch(expected, binary.identity_of(path, st, privileged=trusted))
                    if differs:
                        raise AirlockError(
                            ErrorCode.BINARY_CHANGED,
                            f"{path} is not the file that was approved (changed: {', '.join(differs)})",
                            {"path": path, "changed": differs},
                        )
                check_executable(spec.identity, path, st)
            except AirlockError as exc:
                raise _stage_error(exc, index, argv[0]) from None
    except BaseException:
        _close_all(opened)
        raise
    return opened


def _close_all(opened: Sequence[_Binary]) -> None:
    for item in opened:
        with contextlib.suppress(OSError):
            os.close(item.fd)


def _grow_pipe(fd: int) -> None:
    with contextlib.suppress(OSError):  # the per-user pipe quota may say no
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)


class _Job:
    """The mutable runtime state of one job (the spec stays frozen)."""

    def __init__(
        self, spec: JobSpec, containment: ProcessGroups, binaries: Sequence[_Binary], on_output: OutputCallback | None
    ) -> None:
        self.spec = spec
        self.binaries = tuple(binaries)  # canonical path and open fd, one per stage
        self.executables = tuple(b.path for b in binaries)
        self.containment = containment
        self.on_output = on_output
        self.procs: list[subprocess.Popen[bytes]] = []
        self.services: list[units.StageService] = []  # service containment: one per stage
        self.fds: list[_Fd] = []
        self.streams: list[tuple[_Fd, _Stream]] = []
        self.stdin: tuple[_Fd, bytes] | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.returncodes: list[int | None] = [None] * len(spec.stages)
        self.timed_out = False
        self.cancelled = False

    def _stage_pipes(self, spec: JobSpec, index: int, last: int) -> tuple[_Fd, _Fd, _Fd]:
        """A stage's stdout and stderr pipes: stderr always captured, stdout only for the last stage
        (otherwise it feeds the next one).  Returns (read_out, write_out, write_err)."""
        read_out, write_out = self._pipe()
        read_err, write_err = self._pipe()
        if index == last:
            _grow_pipe(read_out.fd)
            self.streams.append((read_out, _Stream("stdout", index, spec, self.on_output)))
        _grow_pipe(read_err.fd)
        self.streams.append((read_err, _Stream("stderr", index, spec, self.on_output)))
        return read_out, write_out, write_err

    def _pipe(self) -> tuple[_Fd, _Fd]:
        r, w = os.pipe()
        ends = (_Fd(r), _Fd(w))
        self.fds.extend(ends)
        return ends

    def spawn(self) -> list[_Fd]:
        """Start every stage; returns the gates to open (scope mode) or none."""
        spec = self.spec
        last = len(spec.stages) - 1
        if spec.stdin is None:
            next_in = _Fd(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
            self.fds.append(next_in)
        else:
            next_in, writer = self._pipe()
            self.stdin = (writer, spec.stdin)
        gates: list[_Fd] = []
        ids: dict[str, Any] = {}
        # Switching ids forces fork(); a job with exactly our own credentials
        # (root jobs) can take the much cheaper vfork() path.
        if os.geteuid() == 0 and not _is_own_identity(spec.identity):  # else check_privilege made sure the uid is ours
            ids = {"user": spec.identity.uid, "group": spec.identity.gid, "extra_groups": list(spec.identity.groups)}
        for index, (argv, opened) in enumerate(zip(spec.stages, self.binaries, strict=True)):
            executable = opened.path
            read_out, write_out, write_err = self._stage_pipes(spec, index, last)
            # argv[0] is the canonical path that policy matched, not the name the
            # request gave: multi-call binaries (systemctl as `reboot`) choose
            # what to do from argv[0], and policy judged the canonical binary.
            # What is executed is the file opened and checked in _open_all, through
            # its fd (kept open across exec, so a #! script's interpreter can open
            # /proc/self/fd/N too), never the path again.
            args: list[str] = [executable, *argv[1:]]
            held = f"/proc/self/fd/{opened.fd}"
            program = held
            pass_fds: tuple[int, ...] = (opened.fd,)
            env: dict[str, str] = dict(spec.env)
            if self.containment.gated:
                gate_in, gate_out = self._pipe()
                gates.append(gate_out)
                pass_fds = (gate_in.fd, opened.fd)
                program = os.path.realpath(sys.executable)
                args = [program, "-I", "-S", "-c", _GATE_SHIM, str(gate_in.fd), held, executable, *argv[1:]]
                env = {}  # the job's comes through the gate
            try:
                proc = subprocess.Popen(  # noqa: S603  the held binary through our own shim; argv is the approved spec
                    args,
                    executable=program,
                    stdin=next_in.fd,
                    stdout=write_out.fd,
                    stderr=write_err.fd,
                    cwd=spec.cwd,
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

    async def spawn_units(self, containment: ServiceContainment) -> None:
        """Start every stage as its own transient service, stdio passed as fds."""
        spec = self.spec
        last = len(spec.stages) - 1
        next_in: _Fd | None = None
        if spec.stdin is not None:
            next_in, writer = self._pipe()
            self.stdin = (writer, spec.stdin)
        trusted = spec.identity.uid == 0
        python = units.python_executable()
        owner = spec.owner_uid
        for index, (argv, opened) in enumerate(zip(spec.stages, self.binaries, strict=True)):
            read_out, write_out, write_err = self._stage_pipes(spec, index, last)
            name = units.unit_name(spec.operation_id, owner, index if last > 0 else None)
            containment.env_files.append(_write_env_file(name, spec.env))
            stage = units.StageUnit(
                name=name,
                description=f"airlock job {ascii(spec.operation_id)[1:-1]}" + (f" stage {index + 1}" if last else ""),
                slice=spec.slice,
                python=python,
                path=opened.path,
                dev=opened.st.st_dev,
                ino=opened.st.st_ino,
                owner=opened.st.st_uid if trusted else None,
                mode=stat.S_IMODE(opened.st.st_mode) if trusted else None,
                argv=(opened.path, *argv[1:]),
                uid=spec.identity.uid,
                gid=spec.identity.gid,
                groups=spec.identity.groups,
                cwd=spec.cwd,
                umask=spec.umask,
                env_file=containment.env_files[-1],
                stop_timeout_seconds=spec.kill_grace_seconds,
                runtime_max_seconds=spec.timeout_seconds + 2 * spec.kill_grace_seconds + _SCOPE_BACKSTOP_SLACK_SECONDS,
                limits=(*containment.limits, *containment.stage_limits[index]),
            )
            try:
                service = await units.start_stage(
                    stage, (next_in.fd if next_in is not None else None, write_out.fd, write_err.fd)
                )
            except AirlockError as exc:
                raise AirlockError(
                    exc.code, f"stage {index + 1}: {exc.message}", exc.details | {"stage": index}
                ) from None
            containment.stages.append(service)
            self.services.append(service)
            if containment.unit is None:
                containment.unit = name
            if next_in is not None:
                next_in.close()
            write_out.close()
            write_err.close()
            next_in = read_out

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
            for service in self.services:  # stop and collect without waiting
                for method in ("StopUnit", "ResetFailedUnit", "UnrefUnit"):
                    args = (service.name, "replace") if method == "StopUnit" else (service.name,)
                    units._executor.submit(units._call, method, *args)
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
) -> JobResult:
    """Run ``spec`` to completion and return its evidence.

    Raises AirlockError before anything starts: PRIVILEGE_UNAVAILABLE,
    SPAWN_FAILED (binary not found, cwd not enterable, scope not created),
    BINARY_CHANGED (not the file approval bound), UNSAFE_BINARY (a root job's
    binary that others could change) or INVALID_ARGUMENTS.  A passed deadline or an already-set ``cancel`` returns
    a result with ``started=False`` and nothing run.
    """
    check_privilege(spec.identity.uid, os.geteuid(), privileged=False)
    check_cwd(spec.identity, spec.cwd)
    opened = _open_all(spec)
    try:
        return await _execute(spec, _containment_for(spec), opened, on_output, cancel)
    finally:
        _close_all(opened)


async def _execute(
    spec: JobSpec,
    containment: ProcessGroups,
    binaries: Sequence[_Binary],
    on_output: OutputCallback | None,
    cancel: asyncio.Event | None,
) -> JobResult:
    log = structlog.get_logger().bind(operation_id=spec.operation_id)
    started_wall, started_mono = time.time(), time.monotonic()
    budget, reason = spec.timeout_seconds, "timeout"
    if spec.deadline is not None and spec.deadline - started_wall < budget:
        budget, reason = spec.deadline - started_wall, "deadline"
    job = _Job(spec, containment, binaries, on_output)
    if budget <= 0 or (cancel is not None and cancel.is_set()):
        job.timed_out = budget <= 0
        job.cancelled = not job.timed_out
        return _result(job, started_wall, started_mono, reason, started=False)
    try:
        if isinstance(containment, ServiceContainment):
            gates: list[_Fd] = []
            await job.spawn_units(containment)
        else:
            # fork+exec blocks for as long as the child takes to exec: do it off the
            # event loop so other jobs' output keeps flowing and spawns overlap.
            spawning = asyncio.ensure_future(asyncio.to_thread(job.spawn))
            try:
                gates = await asyncio.shield(spawning)
            except asyncio.CancelledError:
                await asyncio.wait({spawning})  # abort() below must see every process
                raise
            await containment.attach([p.pid for p in job.procs])
        budget -= time.monotonic() - started_mono
        if gates and (budget <= 0 or (cancel is not None and cancel.is_set())):
            # Creating the scope took the rest of the time, or cancel came
            # meanwhile: the gates stay shut, so nothing of the job ran.
            job.timed_out = budget <= 0
            job.cancelled = not job.timed_out
            return _result(job, started_wall, started_mono, reason, started=False)
        if gates:  # inside the scope now: let them exec
            payload = _gate_payload(spec.env)
            for gate in gates:
                os.set_blocking(gate.fd, False)
            await asyncio.gather(*(_feed(gate, payload) for gate in gates))
        log.debug("runner.job.spawned", pids=[p.pid for p in job.procs], containment=spec.containment)
        job.start_io()
        await job.supervise(budget, cancel)
        result = _result(job, started_wall, started_mono, reason, started=True)
    finally:
        job.abort()
    log.debug(
        "runner.job.finished",
        exit_codes=[s.exit_code for s in result.stages],
        timed_out=result.timed_out,
        cancelled=result.cancelled,
        duration_ms=result.duration_ms,
    )
    return result


def _result(job: _Job, started_wall: float, started_mono: float, reason: str, *, started: bool) -> JobResult:
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
    )

"""Containment ``service``: every stage of a job is its own transient systemd service.

The runner asks systemd (``StartTransientUnit`` over D-Bus, through
python3-dbus: busctl 252 cannot pass file descriptors) for
``airlock-job-<operation>.service`` in the jobs slice.  The unit gets the
job's identity (``User=``, ``Group=``, ``SupplementaryGroups=``), working
directory, umask, stdin/stdout/stderr as file descriptors, the kill policy,
a ``RuntimeMaxSec=`` backstop, and the rule's ``sandbox:`` (bound to the
ticket) as properties.  Jobs therefore no longer inherit the runner's own
sandbox: without ``sandbox:`` a root job is a full root job, as with sudo.

What runs: systemd executes ``ExecStart`` by path, so the unit's
``ExecStart`` is the exec helper below (``python3 -I -S -c HELPER``), not the
job's binary.  Inside the unit, the helper opens the approved canonical path
again from ``/`` one component at a time with ``O_NOFOLLOW``, compares the
file's device, inode (and for root jobs owner and mode) with the identity the
runner checked against the ticket's ``bound["binaries"]`` and executes that
fd (``execveat``).  A binary swapped after the runner's check is refused
(exit 126, nothing of the job runs).  See docs/security.md.

The environment is not a unit property (``systemctl show`` is readable by
every local user and the environment may carry protected values): the runner
writes it, hex-encoded in one variable, to a root-only ``EnvironmentFile=``
that systemd reads while starting the unit; the helper decodes it and
executes the job with exactly that environment.

Waiting: the unit holds a reference (``AddRef=``) for the runner's bus
connection, so it stays loaded after it stopped until the runner has read
its exit status and CPU time (and is collected if the runner dies).  Memory
peak is the unit cgroup's ``memory.peak`` (systemd 252 has no
``MemoryPeak`` property), sampled while the unit runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.sandbox import Property

_DEST = "org.freedesktop.systemd1"
_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_UNIT = "org.freedesktop.systemd1.Unit"
_SERVICE = "org.freedesktop.systemd1.Service"
_PROPS = "org.freedesktop.DBus.Properties"
_UNIT_NAME_MAX = 255
_UNIT_PREFIX = "airlock-job-"
_KEEP = re.compile(r"[A-Za-z0-9.-]")
_CALL_TIMEOUT_SECONDS = 10.0
_POLL_FIRST_SECONDS = 0.002
_POLL_MAX_SECONDS = 0.05
# While the main process is held by pidfd, the unit is still read this often (a bound, not the wake-up).
_WATCH_SECONDS = 1.0
_GONE_TIMEOUT_SECONDS = 10.0
# Where the runner writes each job's environment file (the runner unit's RuntimeDirectory=).
ENV_DIR = "/run/airlock-runner"
HELPER_EXIT_CHANGED = 126

# Runs as ExecStart of every job unit (python3 -I -S -c): argv is
# [path, dev, ino, uid, mode, argv0, args...]; uid and mode are "-" for
# unprivileged jobs.  The environment arrives hex-encoded in AIRLOCK_JOB_ENV;
# reviewed scripts (index:sha256:root-only copy, hex-encoded) in AIRLOCK_JOB_SCRIPTS:
# each is read, checked and sealed into a memfd that replaces argv[index].
# Its imports are the cheapest that do the job (each job's start pays for them):
# _stat and _signal are built in, where stat and signal would import enum and more;
# fcntl and hashlib only for a job with reviewed scripts.
HELPER = """\
import os, sys, _signal, _stat
path, dev, ino, uid, mode = sys.argv[1:6]
def refuse(why):
    os.write(2, ("airlock: %s: %s since it was approved; not executed\\n" % (path, why)).encode())
    os._exit(126)
parts = [p for p in path.split("/") if p]
if not path.startswith("/") or not parts or any(p in (".", "..") for p in parts):
    refuse("is not a canonical path")
fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
try:
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        flags = os.O_PATH | os.O_NOFOLLOW | (0 if last else os.O_DIRECTORY)
        nfd = os.open(part, flags, dir_fd=fd)
        os.close(fd)
        fd = nfd
except OSError as exc:
    refuse("cannot be opened without following a symlink (%s)" % exc.strerror)
st = os.fstat(fd)
if not _stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (int(dev), int(ino)):
    refuse("is not the file the runner checked")
if uid != "-" and (st.st_uid, _stat.S_IMODE(st.st_mode)) != (int(uid), int(mode)):
    refuse("changed owner or mode")
data = bytes.fromhex(os.environ.get("AIRLOCK_JOB_ENV", ""))
env = dict(item.split(b"=", 1) for item in data.split(b"\\0") if item)
if os.environ.get("CREDENTIALS_DIRECTORY"):  # the rule's credentials (LoadCredential=, runner/credentials.py)
    env[b"CREDENTIALS_DIRECTORY"] = os.environ["CREDENTIALS_DIRECTORY"].encode()
args = sys.argv[6:]
for item in bytes.fromhex(os.environ.get("AIRLOCK_JOB_SCRIPTS", "")).decode().split(";"):
    if not item:
        continue
    import fcntl, hashlib
    index, digest, copy = item.split(":", 2)
    sfd = os.open(copy, os.O_RDONLY | os.O_NOFOLLOW)
    chunks = []
    while True:
        chunk = os.read(sfd, 1 << 20)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(sfd)
    script = b"".join(chunks)
    if hashlib.sha256(script).hexdigest() != digest:
        refuse("the script copy is not the reviewed script")
    mfd = os.memfd_create("airlock-script", os.MFD_ALLOW_SEALING)
    view = memoryview(script)
    while view:
        view = view[os.write(mfd, view):]
    seals = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
    fcntl.fcntl(mfd, fcntl.F_ADD_SEALS, seals)
    args[int(index)] = "/proc/self/fd/%d" % mfd
_signal.signal(_signal.SIGPIPE, _signal.SIG_DFL)
_signal.signal(_signal.SIGXFSZ, _signal.SIG_DFL)
os.set_inheritable(fd, True)
try:
    os.execve("/proc/self/fd/%d" % fd, args, env)
except OSError as exc:
    os.write(2, ("airlock: cannot execute %s: %s\\n" % (path, exc.strerror)).encode())
    os._exit(127 if exc.errno == 2 else 126)
"""


def _escape(text: str) -> str:
    """Injective: ``[A-Za-z0-9.-]`` stay, every other UTF-8 byte becomes ``_xx``."""
    return "".join(ch if _KEEP.fullmatch(ch) else "".join(f"_{b:02x}" for b in ch.encode()) for ch in text)


def unit_name(operation_id: str, owner_uid: int | None, stage: int | None, suffix: str = ".service") -> str:
    """``airlock-job-<operation>.u<uid>[.s<stage>].service``; distinct keys never share a name.

    ``.u`` with no digits when there is no owner (tools and tests).

    The operation ID is escaped injectively (``_`` itself is escaped, so the
    escaped text has no ``_`` other than escapes) and the owner and stage are
    appended with separators the escaped ID cannot end in ambiguously (they
    are read from the end and are digits only).  A name past systemd's 255
    characters becomes a prefix of it plus ``:`` and the SHA-256 of the full
    name; ``:`` never occurs in a short name.
    """
    body = _escape(operation_id) + f".u{'' if owner_uid is None else owner_uid}"  # always there: parsed from the end
    if stage is not None:
        body += f".s{stage}"
    name = f"{_UNIT_PREFIX}{body}{suffix}"
    if len(name) <= _UNIT_NAME_MAX:
        return name
    digest = hashlib.sha256(body.encode()).hexdigest()
    room = _UNIT_NAME_MAX - len(_UNIT_PREFIX) - len(suffix) - len(digest) - 1
    return f"{_UNIT_PREFIX}{body[:room]}:{digest}{suffix}"


# --- the unit's properties (pure) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageUnit:
    """What one stage's unit needs besides its stdio fds."""

    name: str
    description: str
    slice: str
    python: str
    path: str  # canonical binary
    dev: int
    ino: int
    owner: int | None  # root jobs: the binary's owner and mode, checked again in the unit
    mode: int | None
    argv: tuple[str, ...]  # argv[0] is the canonical path
    uid: int
    gid: int
    groups: tuple[int, ...]
    cwd: str
    umask: int
    env_file: str
    stop_timeout_seconds: float
    runtime_max_seconds: float
    limits: tuple[Property, ...] = ()  # runner.memory_max etc., then the rule's sandbox


def helper_argv(unit: StageUnit) -> list[str]:
    owner = "-" if unit.owner is None else str(unit.owner)
    mode = "-" if unit.mode is None else str(unit.mode)
    return [unit.python, "-I", "-S", "-c", HELPER, unit.path, str(unit.dev), str(unit.ino), owner, mode, *unit.argv]


def unit_properties(unit: StageUnit) -> list[Property]:
    """(name, D-Bus signature, value) of a stage's unit, stdio excluded."""
    props: list[Property] = [
        ("Description", "s", unit.description),
        ("Slice", "s", unit.slice),
        ("Type", "s", "exec"),
        ("ExecStart", "a(sasb)", [(unit.python, helper_argv(unit), False)]),
        ("EnvironmentFiles", "a(sb)", [(unit.env_file, False)]),
        ("WorkingDirectory", "s", unit.cwd),
        ("UMask", "u", unit.umask),
        ("KillMode", "s", "control-group"),
        ("TimeoutStopUSec", "t", max(0, round(unit.stop_timeout_seconds * 1_000_000))),
        ("SendSIGKILL", "b", True),
        ("RuntimeMaxUSec", "t", max(1, round(unit.runtime_max_seconds * 1_000_000))),
        # Kept loaded for the runner's connection until it read the result; then collected.
        ("AddRef", "b", True),
        ("CollectMode", "s", "inactive-or-failed"),
        ("CPUAccounting", "b", True),
        ("MemoryAccounting", "b", True),
    ]
    if unit.uid != 0:
        props += [
            ("User", "s", str(unit.uid)),
            ("Group", "s", str(unit.gid)),
            ("SupplementaryGroups", "as", [str(g) for g in unit.groups if g != unit.gid]),
        ]
    props += list(unit.limits)
    return props


@dataclass(frozen=True, slots=True)
class ScriptCopy:
    """A reviewed script for the helper: the argv index it replaces, its sha256, the root-only copy."""

    index: int
    sha256: str
    path: str


def env_file_text(env: Mapping[str, str], scripts: Sequence[ScriptCopy] = ()) -> bytes:
    payload = b"\0".join(os.fsencode(f"{k}={v}") for k, v in env.items())
    text = b"AIRLOCK_JOB_ENV=" + payload.hex().encode() + b"\n"
    if scripts:
        listed = ";".join(f"{s.index}:{s.sha256}:{s.path}" for s in scripts)
        text += b"AIRLOCK_JOB_SCRIPTS=" + os.fsencode(listed).hex().encode() + b"\n"
    return text


def returncode_of(code: int, status: int) -> int:
    """A Popen-style return code from ExecMainCode/ExecMainStatus (CLD_EXITED=1, KILLED=2, DUMPED=3)."""
    if code in (2, 3):
        return -status
    return status


# --- talking to systemd -----------------------------------------------------------------
#
# Every call goes through one private connection and one manager proxy, and no proxy is
# ever introspected: a fresh proxy's first call fetches and parses systemd's
# introspection XML (about 1 ms for the manager, 1.5 ms for a unit), which used to be
# paid on every call.  Signatures are therefore given with each call.

_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="airlock-dbus")
_bus: Any = None
_manager_proxy: Any = None


def _dbus() -> Any:
    try:
        import dbus  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, "service containment needs python3-dbus, which is not installed"
        ) from None
    return dbus


def _manager() -> Any:
    global _bus, _manager_proxy
    dbus = _dbus()
    if _bus is None:
        _bus = dbus.SystemBus(private=True)
    if _manager_proxy is None:
        _manager_proxy = dbus.Interface(_bus.get_object(_DEST, _PATH, introspect=False), _MANAGER)
    return _manager_proxy


def _variant(dbus: Any, signature: str, value: Any) -> Any:
    if signature == "s":
        return dbus.String(value)
    if signature == "b":
        return dbus.Boolean(value)
    if signature == "u":
        return dbus.UInt32(value)
    if signature == "t":
        return dbus.UInt64(value)
    if signature == "h":
        return dbus.types.UnixFd(value)
    if signature.startswith("a"):
        return dbus.Array(value, signature=signature[1:])
    raise ValueError(signature)


def _start(name: str, props: Sequence[Property], stdio: tuple[int | None, int, int]) -> None:
    dbus = _dbus()
    manager = _manager()
    stdin, stdout, stderr = stdio
    wire = [(key, _variant(dbus, sig, value)) for key, sig, value in props]
    if stdin is None:
        wire.append(("StandardInput", dbus.String("null")))
    else:
        wire.append(("StandardInputFileDescriptor", dbus.types.UnixFd(stdin)))
    wire.append(("StandardOutputFileDescriptor", dbus.types.UnixFd(stdout)))
    wire.append(("StandardErrorFileDescriptor", dbus.types.UnixFd(stderr)))
    try:
        manager.StartTransientUnit(
            name,
            "fail",
            dbus.Array(wire, signature="(sv)"),
            dbus.Array([], signature="(sa(sv))"),
            signature="ssa(sv)a(sa(sv))",
            timeout=_CALL_TIMEOUT_SECONDS,
        )
    except dbus.DBusException as exc:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"systemd refused job unit {name}: {exc.get_dbus_message()}"
        ) from None
    finally:
        del wire  # UnixFd holds duplicates: drop them now, or the pipes never see EOF


@dataclass(frozen=True, slots=True)
class UnitState:
    """A unit's state; the exit fields and CPU time are read only once it is ``final``."""

    active: str
    job: int
    code: int
    status: int
    cgroup: str
    cpu_nsec: int | None
    main_pid: int = 0

    @property
    def final(self) -> bool:
        return self.active in ("inactive", "failed") and self.job == 0


_GONE = ("org.freedesktop.systemd1.NoSuchUnit", "org.freedesktop.DBus.Error.UnknownObject")


def _state(name: str) -> UnitState | None:
    """The unit's state, or None once systemd collected it (4 to 6 small calls)."""
    dbus = _dbus()
    manager = _manager()
    try:
        path = manager.GetUnit(name, signature="s", timeout=_CALL_TIMEOUT_SECONDS)
        props = dbus.Interface(_bus.get_object(_DEST, path, introspect=False), _PROPS)

        def get(iface: str, prop: str) -> Any:
            return props.Get(iface, prop, signature="ss", timeout=_CALL_TIMEOUT_SECONDS)

        # The unit's ActiveState and Job in one snapshot: read one by one they could
        # say "inactive" while the start job was queued and "no job" once it had run,
        # and take a running job for one that never started (seen under load).  Once
        # the snapshot says inactive with no job, the exit fields read after it are final.
        unit = props.GetAll(_UNIT, signature="s", timeout=_CALL_TIMEOUT_SECONDS)
        active, job = str(unit["ActiveState"]), int(unit["Job"][0])
        cgroup = str(get(_SERVICE, "ControlGroup"))
        if not (active in ("inactive", "failed") and job == 0):
            return UnitState(active, job, 0, 0, cgroup, None, int(get(_SERVICE, "MainPID")))
        cpu = int(get(_SERVICE, "CPUUsageNSec"))
        return UnitState(
            active=active,
            job=job,
            code=int(get(_SERVICE, "ExecMainCode")),
            status=int(get(_SERVICE, "ExecMainStatus")),
            cgroup=cgroup,
            cpu_nsec=None if cpu == 2**64 - 1 else cpu,
        )
    except dbus.DBusException as exc:
        if exc.get_dbus_name() in _GONE:
            return None
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot read job unit {name}: {exc.get_dbus_message()}") from None


def _main_pid(name: str) -> int:
    """The unit's main PID (0: none, or the unit is gone)."""
    dbus = _dbus()
    try:
        path = _manager().GetUnit(name, signature="s", timeout=_CALL_TIMEOUT_SECONDS)
        props = dbus.Interface(_bus.get_object(_DEST, path, introspect=False), _PROPS)
        return int(props.Get(_SERVICE, "MainPID", signature="ss", timeout=_CALL_TIMEOUT_SECONDS))
    except dbus.DBusException as exc:
        if exc.get_dbus_name() in _GONE:
            return 0
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot read job unit {name}: {exc.get_dbus_message()}") from None


def _exists(name: str) -> bool:
    dbus = _dbus()
    try:
        _manager().GetUnit(name, signature="s", timeout=_CALL_TIMEOUT_SECONDS)
    except dbus.DBusException as exc:
        if exc.get_dbus_name() in _GONE:
            return False
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot read job unit {name}: {exc.get_dbus_message()}") from None
    return True


_SIGNATURES = {"KillUnit": "ssi", "StopUnit": "ss", "ResetFailedUnit": "s", "UnrefUnit": "s"}


def _call(method: str, *args: Any) -> None:
    dbus = _dbus()
    try:
        getattr(_manager(), method)(*args, signature=_SIGNATURES[method], timeout=_CALL_TIMEOUT_SECONDS)
    except dbus.DBusException as exc:
        if exc.get_dbus_name() not in _GONE:
            structlog.get_logger().warning("runner.unit.call_failed", method=method, error=exc.get_dbus_message())


async def _run(fn: Any, *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_executor, fn, *args)


async def _readable(fd: int, within: float) -> bool:
    """True once ``fd`` polls readable (a pidfd: its process exited), False after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, within)
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
    return True


def _peak(cgroup: str) -> int | None:
    if not cgroup:
        return None
    try:
        with open(f"/sys/fs/cgroup{cgroup}/memory.peak", encoding="ascii") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


class StageService:
    """One stage's transient service, once started: wait, signal, read back, release."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.returncode: int | None = None
        self.cpu_nsec: int | None = None
        self.memory_peak: int | None = None
        self.failed = False
        self.released = False

    async def wait(self) -> int:
        """Until the unit stopped (main process exited, leftovers killed by systemd).

        Not by polling while the job runs: once the unit has a main process (the exec
        helper, then the job it became), the runner holds it by pidfd and reads the
        unit again when it exits, or every `_WATCH_SECONDS` as a bound.  The unit's own
        state stays the answer (exit status, CPU time, leftovers killed): from the main
        process's exit on, and wherever there is no pidfd, it is polled with backoff.
        """
        delay = _POLL_FIRST_SECONDS
        held: int | None = None
        watched = False  # a main process was held (once: after its exit, only the unit tells)
        try:
            while True:
                state = await _run(_state, self.name)
                if state is None:  # collected before we read it: should not happen with AddRef
                    self.returncode = self.returncode if self.returncode is not None else 255
                    return self.returncode
                self._sample(state.cgroup)
                if state.final:
                    # ExecMainCode 0: systemd never forked it (say, a sandbox setting it could not apply).
                    self.returncode = returncode_of(state.code, state.status) if state.code else 127
                    self.cpu_nsec = state.cpu_nsec
                    self.failed = state.active == "failed"
                    return self.returncode
                if not watched and state.main_pid > 0:
                    watched = True
                    held = await self._hold(state.main_pid)
                if held is not None:
                    if await _readable(held, _WATCH_SECONDS):
                        self._sample(state.cgroup)  # the cgroup may still be there: its peak, as late as we can
                        os.close(held)
                        held = None
                        delay = _POLL_FIRST_SECONDS
                    continue
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, _POLL_MAX_SECONDS)
        finally:
            if held is not None:
                os.close(held)

    async def _hold(self, pid: int) -> int | None:
        """A pidfd of the unit's main process, or None (then the unit is polled).

        Opened first, then the unit asked again: if it still names ``pid`` as its main
        process, the pidfd is that process (systemd forgets a main PID only when it
        reaps it, and a PID is reused only after that).
        """
        try:
            fd = os.pidfd_open(pid)
        except OSError:  # gone already, or a kernel before 5.3
            return None
        try:
            if await _run(_main_pid, self.name) == pid:
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        return None

    def _sample(self, cgroup: str) -> None:
        peak = _peak(cgroup)
        if peak is not None:
            self.memory_peak = max(peak, self.memory_peak or 0)

    async def kill(self, signum: int) -> None:
        await _run(_call, "KillUnit", self.name, "all", int(signum))

    def kill_now(self, signum: int) -> None:
        with contextlib.suppress(Exception):
            _executor.submit(_call, "KillUnit", self.name, "all", int(signum)).result(_CALL_TIMEOUT_SECONDS)

    def _releasing(self) -> list[tuple[str, ...]]:
        """The calls that let systemd collect the unit: a stopped one needs only its reference dropped."""
        self.released = True
        calls: list[tuple[str, ...]] = []
        if self.returncode is None:  # still running, or we never saw it stop
            calls.append(("StopUnit", self.name, "replace"))
        if self.returncode is None or self.failed:
            calls.append(("ResetFailedUnit", self.name))
        calls.append(("UnrefUnit", self.name))
        return calls

    async def release(self) -> None:
        """Stop (if still running) and let systemd collect it: nothing named airlock-job-* stays."""
        if self.released:
            return
        for call in self._releasing():
            await _run(_call, *call)
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _GONE_TIMEOUT_SECONDS
        delay = _POLL_FIRST_SECONDS
        # systemd collects an unreferenced stopped unit before it reads its next message,
        # so the first look usually finds it gone; a stop job takes longer.
        while await _run(_exists, self.name):
            if loop.time() > give_up:
                structlog.get_logger().warning("runner.unit.not_collected", unit=self.name)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, _POLL_MAX_SECONDS)

    def release_soon(self) -> None:
        """`release` without waiting (the job is being abandoned); nothing if already released."""
        if not self.released:
            for call in self._releasing():
                _executor.submit(_call, *call)


async def start_stage(unit: StageUnit, stdio: tuple[int | None, int, int]) -> StageService:
    await _run(_start, unit.name, unit_properties(unit), stdio)
    return StageService(unit.name)


def python_executable() -> str:
    return os.path.realpath(sys.executable)

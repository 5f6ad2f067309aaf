"""Containment ``service``: every stage of a job is its own transient systemd service.

The runner asks systemd (``StartTransientUnit`` over D-Bus, through
python3-dbus: busctl 252 cannot pass file descriptors) for
``airlock-job-<operation>.service`` in the jobs slice, with the properties
stageunit.py makes and stdin/stdout/stderr as file descriptors, then waits
for it, signals it and reads back its exit status and CPU time.

Waiting: the unit holds a reference (``AddRef=``) for the runner's bus
connection, so it stays loaded after it stopped until the runner has read
its exit status and CPU time (and is collected if the runner dies).  The
runner holds the unit's main process by pidfd and reads the unit when it
exits (StageService.wait).  Memory peak is the unit cgroup's
``memory.peak`` (systemd 252 has no ``MemoryPeak`` property), sampled while
the unit runs and as its main process exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.sandbox import Property
from airlock.runner.exechelper import HELPER, HELPER_EXIT_CHANGED
from airlock.runner.stageunit import (
    ENV_DIR,
    ScriptCopy,
    StageUnit,
    env_file_text,
    helper_argv,
    python_executable,
    returncode_of,
    unit_name,
    unit_properties,
)

__all__ = [  # the unit's definition lives in stageunit.py; its callers know it by this module
    "ENV_DIR",
    "HELPER",
    "HELPER_EXIT_CHANGED",
    "ScriptCopy",
    "StageService",
    "StageUnit",
    "env_file_text",
    "helper_argv",
    "python_executable",
    "returncode_of",
    "start_stage",
    "unit_name",
    "unit_properties",
]

_DEST = "org.freedesktop.systemd1"
_PATH = "/org/freedesktop/systemd1"
_UNIT_PATHS = "/org/freedesktop/systemd1/unit/"
_MANAGER = "org.freedesktop.systemd1.Manager"
_UNIT = "org.freedesktop.systemd1.Unit"
_SERVICE = "org.freedesktop.systemd1.Service"
_PROPS = "org.freedesktop.DBus.Properties"
_CALL_TIMEOUT_SECONDS = 10.0
_POLL_FIRST_SECONDS = 0.002
_POLL_MAX_SECONDS = 0.05
# While the main process is held by pidfd, the unit is still read this often (a bound, not the wake-up).
_WATCH_SECONDS = 1.0
_GONE_TIMEOUT_SECONDS = 10.0


# --- talking to systemd -----------------------------------------------------------------
#
# Every call is one message on one private connection (``call_blocking``), never through
# a proxy object: a fresh proxy asks the bus for systemd's unique name and, on its first
# call, fetches and parses systemd's introspection XML (about 1 ms for the manager,
# 1.5 ms for a unit), which used to be paid on every call.  Signatures go with each call.

_executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="airlock-dbus")
_bus: Any = None


def _dbus() -> Any:
    try:
        import dbus  # type: ignore[import-not-found,import-untyped,unused-ignore]
    except ImportError:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, "service containment needs python3-dbus, which is not installed"
        ) from None
    return dbus


def _connected() -> Any:
    global _bus
    if _bus is None:
        _bus = _dbus().SystemBus(private=True)
    return _bus


def warm() -> None:
    """Import python3-dbus and connect to the system bus now, on the D-Bus thread, not in the first
    job after a cold start (about 40 ms there).  A failure is left for that job to meet and report."""
    _executor.submit(_connected).add_done_callback(lambda done: done.exception())


def _invoke(path: str, interface: str, method: str, signature: str, *args: Any) -> Any:
    """One method call to systemd and its reply (raises dbus.DBusException)."""
    return _connected().call_blocking(_DEST, path, interface, method, signature, args, timeout=_CALL_TIMEOUT_SECONDS)


def _manage(method: str, signature: str, *args: Any) -> Any:
    return _invoke(_PATH, _MANAGER, method, signature, *args)


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
    stdin, stdout, stderr = stdio
    wire = [(key, _variant(dbus, sig, value)) for key, sig, value in props]
    if stdin is None:
        wire.append(("StandardInput", dbus.String("null")))
    else:
        wire.append(("StandardInputFileDescriptor", dbus.types.UnixFd(stdin)))
    wire.append(("StandardOutputFileDescriptor", dbus.types.UnixFd(stdout)))
    wire.append(("StandardErrorFileDescriptor", dbus.types.UnixFd(stderr)))
    try:
        _manage(
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            name,
            "fail",
            dbus.Array(wire, signature="(sv)"),
            dbus.Array([], signature="(sa(sv))"),
        )
    except dbus.DBusException as exc:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"systemd refused job unit {name}: {exc.get_dbus_message()}"
        ) from None
    finally:
        del wire  # UnixFd holds duplicates: drop them now, or the pipes never see EOF


@dataclass(frozen=True, slots=True)
class UnitState:
    """A unit's state; the exit fields and CPU time are read only once it is ``final``.

    ``active`` is "" when it was not read: the unit had a main process, so it runs.
    """

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


def _unit_path(name: str) -> str:
    """The unit's object path, as systemd names it (bus_label_escape: ``-`` becomes ``_2d``).

    Read only between its start and its release: the runner's reference keeps it
    loaded (a path of a unit that is not loaded would make systemd load a stub).
    """
    return _UNIT_PATHS + "".join(c if c.isascii() and c.isalnum() else f"_{ord(c):02x}" for c in name)


def _state(name: str, cgroup: str | None = None, main: bool = True) -> UnitState | None:
    """The unit's state (1 to 6 small calls), or None if systemd does not know it.

    ``cgroup``: the unit's control group as read before (it does not change), or None;
    ``main``: ask for a main process first (not once the one the runner held exited).
    """
    dbus = _dbus()
    path = _unit_path(name)

    def get(iface: str, prop: str) -> Any:
        return _invoke(path, _PROPS, "Get", "ss", iface, prop)

    try:
        main_pid = int(get(_SERVICE, "MainPID")) if main else 0
        if not cgroup:
            cgroup = str(get(_SERVICE, "ControlGroup"))
        if main_pid > 0:  # systemd forgets a main PID when it reaps it: running
            return UnitState("", 0, 0, 0, cgroup, None, main_pid)
        # The unit's ActiveState and Job in one snapshot: read one by one they could
        # say "inactive" while the start job was queued and "no job" once it had run,
        # and take a running job for one that never started (seen under load).  Once
        # the snapshot says inactive with no job, the exit fields read after it are final.
        unit = _invoke(path, _PROPS, "GetAll", "s", _UNIT)
        active, job = str(unit["ActiveState"]), int(unit["Job"][0])
        if not (active in ("inactive", "failed") and job == 0):
            return UnitState(active, job, 0, 0, cgroup, None)
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
    """The unit's main PID (0: none, or systemd does not know the unit)."""
    dbus = _dbus()
    try:
        return int(_invoke(_unit_path(name), _PROPS, "Get", "ss", _SERVICE, "MainPID"))
    except dbus.DBusException as exc:
        if exc.get_dbus_name() in _GONE:
            return 0
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot read job unit {name}: {exc.get_dbus_message()}") from None


def _exists(name: str) -> bool:
    dbus = _dbus()
    try:
        _manage("GetUnit", "s", name)
    except dbus.DBusException as exc:
        if exc.get_dbus_name() in _GONE:
            return False
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot read job unit {name}: {exc.get_dbus_message()}") from None
    return True


_SIGNATURES = {"KillUnit": "ssi", "StopUnit": "ss", "ResetFailedUnit": "s", "UnrefUnit": "s"}


def _call(method: str, *args: Any) -> None:
    dbus = _dbus()
    try:
        _manage(method, _SIGNATURES[method], *args)
    except dbus.DBusException as exc:
        if exc.get_dbus_name() not in _GONE:
            structlog.get_logger().warning("runner.unit.call_failed", method=method, error=exc.get_dbus_message())


def _state_held(name: str, cgroup: str | None) -> tuple[UnitState | None, int | None]:
    """`_state`, and while the unit has a main process, a pidfd of it (or None: then it is polled).

    Opened first, then the unit asked again: if it still names that PID as its main
    process, the pidfd is that process (systemd forgets a main PID only when it reaps
    it, and a PID is reused only after that).
    """
    state = _state(name, cgroup)
    if state is None or state.main_pid <= 0:
        return state, None
    try:
        fd = os.pidfd_open(state.main_pid)
    except OSError:  # gone already, or a kernel before 5.3
        return state, None
    try:
        if _main_pid(name) == state.main_pid:
            return state, fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return state, None


async def _run_held(name: str, cgroup: str | None) -> tuple[UnitState | None, int | None]:
    """`_state_held` on the D-Bus thread; a pidfd it opens for a caller cancelled meanwhile is closed."""
    future = asyncio.get_running_loop().run_in_executor(_executor, _state_held, name, cgroup)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        future.add_done_callback(_close_held)
        raise


def _close_held(future: asyncio.Future[tuple[UnitState | None, int | None]]) -> None:
    if not future.cancelled() and future.exception() is None:
        fd = future.result()[1]
        if fd is not None:
            os.close(fd)


def _send_then_exists(calls: Sequence[tuple[str, ...]], name: str) -> bool:
    for call in calls:
        _call(*call)
    return _exists(name)


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
        self.cgroup: str | None = None  # read once, then passed to every later read

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
        watched = False  # a main process was seen (held once: after its exit, only the unit tells)
        try:
            while True:
                if watched:
                    state = await _run(_state, self.name, self.cgroup, False)
                else:
                    state, held = await _run_held(self.name, self.cgroup)
                if state is None:  # collected before we read it: should not happen with AddRef
                    self.returncode = self.returncode if self.returncode is not None else 255
                    return self.returncode
                self.cgroup = state.cgroup or None
                self._sample(state.cgroup)
                if state.final:
                    # ExecMainCode 0: systemd never forked it (say, a sandbox setting it could not apply).
                    self.returncode = returncode_of(state.code, state.status) if state.code else 127
                    self.cpu_nsec = state.cpu_nsec
                    self.failed = state.active == "failed"
                    return self.returncode
                watched = watched or state.main_pid > 0
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
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _GONE_TIMEOUT_SECONDS
        delay = _POLL_FIRST_SECONDS
        # One trip to the D-Bus thread for the calls and the first look: an unreferenced
        # stopped unit is usually collected by then; a stop job takes longer.
        there = await _run(_send_then_exists, self._releasing(), self.name)
        self.released = True  # only now: cancelled before the calls ran, the job's clean-up sends them
        while there:
            if loop.time() > give_up:
                structlog.get_logger().warning("runner.unit.not_collected", unit=self.name)
                return
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, _POLL_MAX_SECONDS)
            there = await _run(_exists, self.name)

    def release_soon(self) -> None:
        """`release` without waiting (the job is being abandoned); nothing if already released."""
        if not self.released:
            self.released = True
            for call in self._releasing():
                _executor.submit(_call, *call)


async def start_stage(unit: StageUnit, stdio: tuple[int | None, int, int]) -> StageService:
    await _run(_start, unit.name, unit_properties(unit), stdio)
    return StageService(unit.name)


# --- for forker.py's scopes ---------------------------------------------------------------


def start_unit(name: str, props: Sequence[Property]) -> None:
    """StartTransientUnit with ``props`` as they are (no stdio added); on the D-Bus thread (`in_thread`)."""
    dbus = _dbus()
    wire = [(key, _variant(dbus, sig, value)) for key, sig, value in props]
    try:
        _manage(
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            name,
            "fail",
            dbus.Array(wire, signature="(sv)"),
            dbus.Array([], signature="(sa(sv))"),
        )
    except dbus.DBusException as exc:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"systemd refused unit {name}: {exc.get_dbus_message()}") from None
    finally:
        del wire  # UnixFd holds duplicates: drop them now


def scope_cpu(name: str) -> int | None:
    """A scope's CPUUsageNSec (None: not known); on the D-Bus thread."""
    dbus = _dbus()
    try:
        cpu = int(_invoke(_unit_path(name), _PROPS, "Get", "ss", "org.freedesktop.systemd1.Scope", "CPUUsageNSec"))
    except dbus.DBusException:
        return None
    return None if cpu == 2**64 - 1 else cpu


async def in_thread(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on the D-Bus thread, where every call to systemd is made."""
    return await _run(fn, *args)

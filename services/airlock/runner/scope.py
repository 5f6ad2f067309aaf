"""Containment: the job's process groups, or a transient systemd scope unit.

`ProcessGroups`: every stage leads its own session and process group; the
job's signals go to all of them.  A process that calls setsid() itself
leaves them and escapes (the limit reference/001 states).

`ScopeContainment` (only when systemd is PID 1) adds a scope around the job.

The spawner starts every stage blocked before exec, then `start_scope` asks
systemd (StartTransientUnit over D-Bus, through busctl: no Python D-Bus
dependency) to create ``airlock-job-<operation>.u<uid>.scope`` (named by
`airlock.runner.units.unit_name`, as the service units are) in the jobs slice with
those PIDs, and waits until the kernel shows each of them in the scope's
cgroup.  Only then are the stages released, so nothing the job forks can be
born outside the scope.  Timeout and cancel signal the whole unit
(KillUnit), which reaches processes that left the job's process groups.

Everything that builds arguments is pure and unit-tested; what talks to
systemd is kept to a few short coroutines exercised by the system tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from airlock.common import child
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.resolve import ROOT_PATH, resolve_executable
from airlock.common.sandbox import cpu_quota_property, memory_property
from airlock.runner.execwatch import cgroup_of

_DEST = "org.freedesktop.systemd1"
_PATH = "/org/freedesktop/systemd1"
_MANAGER = "org.freedesktop.systemd1.Manager"
_BUSCTL_TIMEOUT_SECONDS = 10.0
_ATTACH_TIMEOUT_SECONDS = 5.0
_POLL_SECONDS = 0.01


@dataclass(frozen=True, slots=True)
class ScopeSettings:
    slice: str
    description: str
    stop_timeout_seconds: float
    memory_max: str | None = None
    tasks_max: int = 0
    cpu_quota: str | None = None
    # A backstop for a runner that dies mid-job: systemd ends the scope itself.
    runtime_max_seconds: float | None = None


def scope_properties(
    pids: Sequence[int], settings: ScopeSettings
) -> list[tuple[str, str, list[int] | int | str | bool]]:
    """The unit properties of a job scope, as (name, D-Bus signature, value)."""
    props: list[tuple[str, str, list[int] | int | str | bool]] = [
        ("Description", "s", settings.description),
        ("Slice", "s", settings.slice),
        ("PIDs", "au", list(pids)),
        # Scope stop (e.g. at shutdown) escalates to SIGKILL after our grace.
        ("TimeoutStopUSec", "t", max(0, round(settings.stop_timeout_seconds * 1_000_000))),
        ("SendSIGKILL", "b", True),
        # A killed job must not leave a failed unit behind to block the name.
        ("CollectMode", "s", "inactive-or-failed"),
    ]
    if settings.runtime_max_seconds is not None:
        props.append(("RuntimeMaxUSec", "t", max(1, round(settings.runtime_max_seconds * 1_000_000))))
    if settings.memory_max is not None:
        props.append(memory_property(settings.memory_max))
    if settings.tasks_max > 0:
        props.append(("TasksMax", "t", settings.tasks_max))
    if settings.cpu_quota is not None:
        props.append(cpu_quota_property(settings.cpu_quota))
    return props


def _busctl_value(signature: str, value: list[int] | int | str | bool) -> list[str]:
    if signature == "b":
        return ["true" if value else "false"]
    if isinstance(value, list):
        return [str(len(value)), *(str(v) for v in value)]
    return [str(value)]


def start_transient_unit_args(unit: str, pids: Sequence[int], settings: ScopeSettings) -> list[str]:
    """busctl's arguments (after the program name) for StartTransientUnit."""
    props = scope_properties(pids, settings)
    args = ["--system", "--quiet", "call", _DEST, _PATH, _MANAGER, "StartTransientUnit", "ssa(sv)a(sa(sv))"]
    args += [unit, "fail", str(len(props))]
    for name, signature, value in props:
        args += [name, signature, *_busctl_value(signature, value)]
    args.append("0")  # no auxiliary units
    return args


def kill_unit_args(unit: str, signum: int) -> list[str]:
    """busctl's arguments for KillUnit(unit, "all", signum)."""
    return ["--system", "--quiet", "call", _DEST, _PATH, _MANAGER, "KillUnit", "ssi", unit, "all", str(int(signum))]


async def _busctl(args: list[str]) -> None:
    method = args[6]  # after --system --quiet call DEST PATH INTERFACE
    busctl = resolve_executable("busctl", ROOT_PATH)
    if busctl is None:
        raise AirlockError(ErrorCode.SPAWN_FAILED, "scope containment needs busctl, which was not found")
    done = await child.run(
        [busctl, *args], env=child.environment(), timeout=_BUSCTL_TIMEOUT_SECONDS, capture_stdout=False
    )
    if done.timed_out:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"busctl {method} timed out")
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip() or done.text()
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"busctl {method} failed: {message}")


@dataclass(frozen=True, slots=True)
class Scope:
    """A created job scope: its unit name and cgroup directory."""

    unit: str
    cgroup_dir: str

    def populated(self) -> bool:
        """Whether any process is left in the scope's cgroup."""
        try:
            with open(os.path.join(self.cgroup_dir, "cgroup.events"), encoding="utf-8") as f:
                return any(line.strip() == "populated 1" for line in f)
        except OSError:
            return False  # systemd already removed the empty scope

    async def kill(self, signum: int) -> None:
        """Signal every process in the scope; falls back to the cgroup's own list."""
        try:
            await _busctl(kill_unit_args(self.unit, signum))
        except AirlockError as exc:
            structlog.get_logger().warning("runner.scope.kill_failed", unit=self.unit, error=exc.message)
            self.kill_direct(signum)

    def kill_direct(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            try:  # atomic against forks, unlike walking cgroup.procs
                with open(os.path.join(self.cgroup_dir, "cgroup.kill"), "w", encoding="ascii") as f:
                    f.write("1")
                return
            except OSError:
                pass
        try:
            with open(os.path.join(self.cgroup_dir, "cgroup.procs"), encoding="ascii") as f:
                pids = [int(line) for line in f if line.strip()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signum)
            except OSError:
                pass


async def start_scope(unit: str, pids: Sequence[int], settings: ScopeSettings) -> Scope:
    """Create the scope holding ``pids`` and wait until all of them are in it."""
    await _busctl(start_transient_unit_args(unit, pids, settings))
    # StartTransientUnit only queues a job; the PIDs move when it runs.
    give_up = time.monotonic() + _ATTACH_TIMEOUT_SECONDS
    suffix = "/" + unit
    cgroup: str | None = None
    waiting = list(pids)
    while waiting:
        path = cgroup_of(waiting[0])
        if path is not None and path.endswith(suffix):
            cgroup = path
            waiting.pop(0)
            continue
        if path is None:
            raise AirlockError(ErrorCode.SPAWN_FAILED, f"process {waiting[0]} vanished before joining {unit}")
        if time.monotonic() > give_up:
            raise AirlockError(
                ErrorCode.SPAWN_FAILED, f"processes did not join {unit} within {_ATTACH_TIMEOUT_SECONDS:g}s"
            )
        await asyncio.sleep(_POLL_SECONDS)
    if cgroup is None:
        raise AirlockError(ErrorCode.SPAWN_FAILED, f"scope {unit} has no processes")
    scope = Scope(unit=unit, cgroup_dir="/sys/fs/cgroup" + cgroup)
    structlog.get_logger().debug("runner.scope.created", unit=unit, pids=list(pids))
    return scope


# --- the two containments the spawner uses ------------------------------------


class ProcessGroups:
    """Every stage leads its own session and process group; signal them all."""

    gated = False

    def __init__(self) -> None:
        self.pgids: list[int] = []
        self.unit: str | None = None

    async def attach(self, pids: Sequence[int]) -> None:
        self.pgids = list(pids)  # start_new_session: pgid == pid

    async def signal(self, signum: int) -> None:
        self.signal_now(signum)

    def signal_now(self, signum: int) -> None:
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signum)

    async def occupied(self) -> bool:
        live = []
        for pgid in self.pgids:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                continue
            except PermissionError:
                pass  # someone in it we may not signal: still occupied
            live.append(pgid)
        # kill(0) also succeeds for zombies, and orphans are reaped by init, not
        # us (promptly by systemd, slowly by some container inits): look closer.
        return bool(live) and _running_in_groups(live)


def _running_in_groups(pgids: Sequence[int]) -> bool:
    """Whether a process that is not a zombie is in one of these process groups."""
    wanted = set(pgids)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # After the command: state, ppid, pgrp.
        if len(fields) > 2 and int(fields[2]) in wanted and fields[0] not in (b"Z", b"X"):
            return True
    return False


class ScopeContainment(ProcessGroups):
    """Process groups, plus a transient systemd scope around the whole job.

    ``gated``: the spawner starts stages blocked before exec and opens their
    gates only after `attach` has put them in the scope.
    """

    gated = True

    def __init__(self, unit: str, settings: ScopeSettings) -> None:
        super().__init__()
        self.unit = unit
        self._settings = settings
        scope_properties([], settings)  # bad limits fail before anything starts
        self.created: Scope | None = None

    async def attach(self, pids: Sequence[int]) -> None:
        await super().attach(pids)
        self.created = await start_scope(self._unit(), pids, self._settings)

    def _unit(self) -> str:
        assert self.unit is not None  # set in __init__; typed optional by the base class
        return self.unit

    async def signal(self, signum: int) -> None:
        if self.created is not None:
            await self.created.kill(signum)
        super().signal_now(signum)

    def signal_now(self, signum: int) -> None:
        if self.created is not None:
            self.created.kill_direct(signum)
        super().signal_now(signum)

    async def occupied(self) -> bool:
        return (self.created is not None and self.created.populated()) or await super().occupied()

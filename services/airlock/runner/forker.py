"""The runner's side of the fork server (forkserver.py): scope jobs at systemd's own cost.

In service containment, a job stage whose rule needs no service-only
sandbox property (no ``sandbox:``, no credentials) does not need a
transient service: it runs as ``systemd-run --scope`` runs a command.  The
fork server (a transient service this module starts once, unsandboxed)
forks the stage as the job's identity and holds it at a gate; the runner
asks systemd for ``airlock-job-<operation>.u<uid>[.s<stage>].scope`` with
that PID, waits until the kernel shows the PID in the scope's cgroup, and
only then opens the gate: nothing the job runs or forks is ever outside
its scope.  The scope carries the same limits, kill policy and backstop as
a stage's service (units.py), and the same exec-tree and kill paths apply
(KillUnit, the cgroup).

Why not the runner itself: its own sandbox (no capabilities, no network,
a read-only system) would be the job's.  Why not a service per stage:
systemd forks, sets up and reports a service at about twice the cost of a
scope, and the stage's program then needs an exec helper in front of it
to check the file the runner checked (stageunit.py); here the fork server
executes the runner's own held fd of that file (``/proc/self/fd/3``).
"""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.sandbox import Property
from airlock.runner import units
from airlock.runner.execwatch import cgroup_of

_MAX_REPLY = 4096
_START_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Spawn:
    """What the fork server needs to start one stage (besides its fds)."""

    argv: tuple[str, ...]  # argv[0] is the canonical path
    env: dict[str, str]
    uid: int
    gid: int
    groups: tuple[int, ...]
    cwd: str  # for messages: the stage enters the held directory fd sent beside it
    umask: int
    extra_argv: tuple[int, ...] = ()  # the argv entries the extra fds (sealed scripts) replace, in order

    def payload(self, tag: int, stdin: bool) -> bytes:
        return json.dumps(
            {
                "tag": tag,
                "argv": list(self.argv),
                "env": self.env,
                "uid": self.uid,
                "gid": self.gid,
                "groups": list(self.groups),
                "cwd": self.cwd,
                "umask": self.umask,
                "extra_argv": list(self.extra_argv),
                "stdin": stdin,
            }
        ).encode()


@dataclass(slots=True)
class Child:
    """A forked stage waiting at its gate: its pid, the gate's write end, and its exit to come."""

    pid: int
    gate: int
    exited: asyncio.Future[int] = field(repr=False)  # the wait status


class ForkServer:
    """One connection to the fork server: requests out, replies dispatched by tag."""

    def __init__(self, sock: socket.socket, unit: str) -> None:
        self.sock = sock
        self.unit = unit
        self._tag = 0
        self._spawning: dict[int, asyncio.Future[tuple[int, int]]] = {}
        self._exits: dict[int, asyncio.Future[int]] = {}
        self.closed = False
        sock.setblocking(False)
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        while True:
            fds = array.array("i")
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(_MAX_REPLY, socket.CMSG_SPACE(fds.itemsize))
            except BlockingIOError:
                return
            except OSError as exc:
                self._lost(str(exc))
                return
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            if not data:
                self._lost("the fork server closed its end")
                return
            self._dispatch(json.loads(data), list(fds))

    def _dispatch(self, reply: dict[str, Any], fds: list[int]) -> None:
        if "spawned" in reply:
            future = self._spawning.pop(reply["spawned"], None)
            if future is not None and not future.done() and fds:
                future.set_result((int(reply["pid"]), fds[0]))
                return
        elif "failed" in reply:
            future = self._spawning.pop(reply["failed"], None)
            if future is not None and not future.done():
                future.set_exception(AirlockError(ErrorCode.SPAWN_FAILED, f"fork server: {reply.get('error')}"))
        elif "exited" in reply:
            waiting = self._exits.pop(reply["exited"], None)
            if waiting is not None and not waiting.done():
                waiting.set_result(int(reply["status"]))
        for fd in fds:  # a gate nobody waits for any more: closing it ends that child unexecuted
            os.close(fd)

    def _lost(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        structlog.get_logger().warning("runner.forker.lost", unit=self.unit, error=why)
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()
        error = AirlockError(ErrorCode.SPAWN_FAILED, f"the fork server is gone: {why}")
        futures: list[asyncio.Future[Any]] = [*self._spawning.values(), *self._exits.values()]
        for future in futures:
            if not future.done():
                future.set_exception(error)
        self._spawning.clear()
        self._exits.clear()

    async def spawn(
        self, spawn: Spawn, stdin: int | None, stdout: int, stderr: int, exe: int, extra: Sequence[int], cwd: int
    ) -> Child:
        """Fork one stage at its gate; its exit status comes later through ``Child.exited``.

        ``cwd``: the working directory the runner walked to and checked, held open; the stage
        ``fchdir``s to it (never ``spawn.cwd`` by name).
        """
        if self.closed:
            raise AirlockError(ErrorCode.SPAWN_FAILED, "the fork server is gone")
        self._tag += 1
        tag = self._tag
        loop = asyncio.get_running_loop()
        spawned: asyncio.Future[tuple[int, int]] = loop.create_future()
        exited: asyncio.Future[int] = loop.create_future()
        self._spawning[tag], self._exits[tag] = spawned, exited
        spec = os.memfd_create("airlock-spawn", os.MFD_CLOEXEC)
        try:
            os.write(spec, spawn.payload(tag, stdin is not None))
            os.lseek(spec, 0, os.SEEK_SET)
            fds = [spec, cwd, stdout, stderr, exe, *extra, *([stdin] if stdin is not None else [])]
            self.sock.sendmsg([b"spawn"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        except OSError as exc:
            self._spawning.pop(tag, None)
            self._exits.pop(tag, None)
            raise AirlockError(ErrorCode.SPAWN_FAILED, f"cannot reach the fork server: {exc.strerror}") from None
        finally:
            os.close(spec)
        pid, gate = await spawned
        return Child(pid, gate, exited)


_server: ForkServer | None = None
_starting: asyncio.Lock | None = None


async def server(start: Any) -> ForkServer:
    """The fork server, started on first use (``start(name, fd)`` asks systemd for its unit)."""
    global _server, _starting
    if _server is not None and not _server.closed:
        return _server
    if _starting is None:
        _starting = asyncio.Lock()
    async with _starting:
        if _server is not None and not _server.closed:
            return _server
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        name = f"airlock-forker-{os.getpid()}-{int.from_bytes(os.urandom(4), 'big'):08x}.service"
        try:
            await asyncio.wait_for(start(name, theirs.fileno()), _START_TIMEOUT_SECONDS)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        _server = ForkServer(ours, name)
        structlog.get_logger().info("runner.forker.started", unit=name)
        return _server


_warming: asyncio.Future[ForkServer] | None = None


def warm() -> None:
    """Start the fork server now, beside the runner's own start, not in the first job (a Python start,
    about 20 ms, that a cold start would otherwise wait for).  A failure is left for that job to meet."""
    global _warming
    _warming = asyncio.ensure_future(server(start_unit))
    _warming.add_done_callback(lambda done: done.cancelled() or done.exception())


def script_path() -> str:
    """The fork server's file (forkserver.py), which its unit runs by path."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "forkserver.py")


# --- the units: the fork server's service, and a scope per stage ---------------------------------

_MOVE_POLL_FIRST_SECONDS = 0.0005
_MOVE_POLL_MAX_SECONDS = 0.05
_MOVE_TIMEOUT_SECONDS = 5.0


def forker_properties(python: str, script: str, fd: int) -> list[Property]:
    """The fork server's transient service: systemd's defaults, no sandbox (its children are full jobs)."""
    return [
        ("Description", "s", "airlock runner's fork server (jobs in scopes)"),
        ("ExecStart", "a(sasb)", [(python, [python, "-I", "-S", script], False)]),
        ("StandardInputFileDescriptor", "h", fd),
        ("StandardOutput", "s", "journal"),
        ("StandardError", "s", "journal"),
        # What it forked and systemd has not moved to a scope yet dies with it.
        ("KillMode", "s", "control-group"),
        ("CollectMode", "s", "inactive-or-failed"),
    ]


async def start_unit(name: str, fd: int) -> None:
    """Ask systemd for the fork server's unit, its fd 0 being ``fd``."""
    await units.in_thread(units.start_unit, name, forker_properties(units.python_executable(), script_path(), fd))


def scope_stage_properties(
    description: str, slice_: str, pid: int, stop_timeout: float, runtime_max: float
) -> list[Property]:
    """A scope stage's unit: the same kill policy, backstop, accounting and reference as a stage's service."""
    return [
        ("Description", "s", description),
        ("Slice", "s", slice_),
        ("PIDs", "au", [pid]),
        ("TimeoutStopUSec", "t", max(0, round(stop_timeout * 1_000_000))),
        ("SendSIGKILL", "b", True),
        ("RuntimeMaxUSec", "t", max(1, round(runtime_max * 1_000_000))),
        ("AddRef", "b", True),
        ("CollectMode", "s", "inactive-or-failed"),
        ("CPUAccounting", "b", True),
        ("MemoryAccounting", "b", True),
    ]


def _unified_root() -> str:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a
    hybrid host (its v1 controllers at /sys/fs/cgroup); ``cgroup.controllers`` is in a v2 root only."""
    return "/sys/fs/cgroup" if os.path.exists("/sys/fs/cgroup/cgroup.controllers") else "/sys/fs/cgroup/unified"


class StageScope(units.StageService):
    """One stage in its own transient scope: forked by the fork server, waited for through it.

    Killed, released and collected as a stage's service is (KillUnit, UnrefUnit: units.py).
    """

    def __init__(self, name: str, exited: asyncio.Future[int]) -> None:
        super().__init__(name)
        self._exited = exited

    async def start(self, pid: int, props: Sequence[Property]) -> None:
        """Create the scope holding ``pid`` and wait until the kernel shows it there (then the gate opens)."""
        await units.in_thread(units.start_unit, self.name, props)
        # StartTransientUnit only queues systemd's job; the PID moves when it runs (about a millisecond).
        loop = asyncio.get_running_loop()
        give_up = loop.time() + _MOVE_TIMEOUT_SECONDS
        delay = _MOVE_POLL_FIRST_SECONDS
        suffix = "/" + self.name
        while True:
            cgroup = cgroup_of(pid)
            if cgroup is None:
                raise AirlockError(ErrorCode.SPAWN_FAILED, f"process {pid} vanished before joining {self.name}")
            if cgroup.endswith(suffix):
                self.cgroup = cgroup
                return
            if loop.time() > give_up:
                raise AirlockError(
                    ErrorCode.SPAWN_FAILED, f"process {pid} did not join {self.name} within {_MOVE_TIMEOUT_SECONDS:g}s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, _MOVE_POLL_MAX_SECONDS)

    def occupied(self) -> bool:
        """Whether anything is left in the scope (a scope, unlike a service, outlives its first process)."""
        if not self.cgroup:
            return False
        try:
            with open(f"{_unified_root()}{self.cgroup}/cgroup.events", encoding="ascii") as f:
                return any(line.strip() == "populated 1" for line in f)
        except OSError:  # ENOENT once removed, ENODEV while systemd removes it: either way it was empty
            return False

    async def wait(self) -> int:
        status = await self._exited
        if self.cgroup:
            self._sample(self.cgroup)  # the cgroup's memory peak, while it may still be there
        self.returncode = os.waitstatus_to_exitcode(status)
        self.cpu_nsec = await units.in_thread(units.scope_cpu, self.name)
        return self.returncode

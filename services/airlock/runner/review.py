"""Running the reviewer (issue 34): approval asks, the runner starts it, sandboxed, as its own user.

approval runs as an unprivileged user and cannot start a process as another
one; the runner is root and already starts sandboxed children.  So approval
sends the request's statement (approval/reviewer.py, no protected value in
it) over its existing door (the ``review`` verb, approval's uid only) and the
runner runs the command *its own* configuration names
(``approval.reviewer_command``): a compromised approval can have the reviewer
asked, never have anything else run.

How it runs:

- the program must be root's alone (file and every directory above it, as a
  root job's binary: common/binary.py), so its user cannot rewrite it; what
  runs is the file that check opened, never the path again: the child
  executes the held fd (``/proc/self/fd/N``), the unit runs a job unit's exec
  helper (runner/exechelper.py), which reopens the path symlink-free and
  refuses unless it is the same file (device, inode, owner, mode);
- as ``approval.reviewer_user`` (never root: a missing user or uid 0 means
  there is no reviewer, and people are asked), no supplementary groups,
  ``/`` as working directory, an environment of ``PATH`` and ``LANG`` only;
- where the runner's jobs get systemd units (``runner.containment`` service
  or scope, or auto with systemd as PID 1 and a root runner): a transient service ``airlock-reviewer-<n>.service``
  with a tight sandbox (`properties`: read-only system, no /home, private
  /tmp and devices, no capabilities, no new privileges, airlock's sockets,
  state and config out of sight, no network unless
  ``approval.reviewer_network``, memory and task caps); systemd kills its
  whole cgroup at the deadline;
- otherwise (``process-group``: ``airlock dev up``, containers): a child started through a
  small helper that, still root, leaves the network (a new, empty network
  namespace) and sets resource limits, then drops to the user, sets
  no-new-privileges and executes the program;
- the statement arrives on stdin (a sealed memfd); at most
  ``MAX_STDOUT`` bytes of stdout and ``MAX_STDERR`` of stderr are kept (the
  rest is read and dropped), and ``approval.reviewer_timeout_seconds`` bounds
  the whole run: then it is killed and reported ``timed_out``.

The runner does not interpret the answer: approval does (`read_answer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import pwd
import signal
import stat
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from airlock.common import binary
from airlock.common.child import environment, terminate
from airlock.common.codec import canonical_json
from airlock.common.config import Config
from airlock.common.containment import systemd_is_running
from airlock.common.errors import AirlockError
from airlock.common.sandbox import Property
from airlock.runner import exechelper, stageunit, units

MAX_STDOUT = 4096
MAX_STDERR = 2048
# Runs at once; one more waits for a slot (within its deadline).
CONCURRENT = 4
GRACE_SECONDS = 1.0
_MEMORY_MAX = 512 * 1024 * 1024
_TASKS_MAX = 64
# What the reviewer must never see or reach, whatever the host's layout.
HIDDEN = ("-/run/airlock", "-/run/airlock-runner", "-/var/lib/airlock", "-/etc/airlock", "-/var/lib/airlock-notify")
_names = itertools.count(1)
# The reviewer's whole environment on either path: the child's helper below, and the unit's exec
# helper in the job units' encoding (stageunit.env_file_text).
ENVIRONMENT = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
_slots = asyncio.Semaphore(CONCURRENT)

# The fallback's helper (python3 -I -S -c): argv is [uid, gid, network, nproc, cpu, fd, program, args...];
# fd is the program as the runner opened and checked it (inherited), executed as such.
HELPER = f"""\
import ctypes, os, resource, sys
uid, gid, network, nproc, cpu = (int(v) for v in sys.argv[1:6])
libc = ctypes.CDLL(None, use_errno=True)
if not network and libc.unshare(0x40000000) != 0:
    os._exit(125)
for limit, value in ((resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, nproc), (resource.RLIMIT_CPU, cpu),
                     (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_FSIZE, 1 << 20), (resource.RLIMIT_AS, 1 << 30)):
    resource.setrlimit(limit, (value, value))
os.setgroups([])
os.setgid(gid)
os.setuid(uid)
if libc.prctl(38, 1, 0, 0, 0) != 0:
    os._exit(125)
os.execve("/proc/self/fd/%d" % int(sys.argv[6]), sys.argv[7:], {ENVIRONMENT!r})
"""


def identity(config: Config) -> tuple[int, int] | str:
    """The reviewer's (uid, gid), or why there is none to run."""
    name = config.approval.reviewer_user
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError):
        return f"no user {name!r} (approval.reviewer_user)"
    if entry.pw_uid == 0:
        return "approval.reviewer_user is root: a reviewer never runs as root"
    if os.geteuid() != 0 and entry.pw_uid != os.geteuid():
        return "the runner is not root, so it cannot start the reviewer as approval.reviewer_user"
    return entry.pw_uid, entry.pw_gid


def properties(config: Config, uid: int, gid: int, program: os.stat_result) -> list[Property]:
    """The transient service's settings (systemd path): what the module docstring promises.

    ``program``: the ``fstat`` of the reviewer as the runner opened and checked it; the unit's
    exec helper runs it only if the path still leads to that very file.
    """
    command = config.approval.reviewer_command
    helper = [
        units.python_executable(),
        "-I",
        "-S",
        "-c",
        exechelper.HELPER,
        command[0],
        str(program.st_dev),
        str(program.st_ino),
        str(program.st_uid),
        str(stat.S_IMODE(program.st_mode)),
        "-",  # WorkingDirectory=/ below, fixed by the runner: no agent names it
        *command,
    ]
    runtime = config.approval.reviewer_timeout_seconds + 2 * GRACE_SECONDS
    props: list[Property] = [
        ("Description", "s", "airlock reviewer"),
        ("Type", "s", "exec"),
        ("ExecStart", "a(sasb)", [(helper[0], helper, False)]),
        ("Environment", "as", [stageunit.env_file_text(ENVIRONMENT).decode().strip()]),
        ("User", "s", str(uid)),
        ("Group", "s", str(gid)),
        ("SupplementaryGroups", "as", []),
        ("WorkingDirectory", "s", "/"),
        ("UMask", "u", 0o077),
        ("KillMode", "s", "control-group"),
        ("SendSIGKILL", "b", True),
        ("TimeoutStopUSec", "t", round(GRACE_SECONDS * 1_000_000)),
        ("RuntimeMaxUSec", "t", round(runtime * 1_000_000)),
        ("AddRef", "b", True),
        ("CollectMode", "s", "inactive-or-failed"),
        ("NoNewPrivileges", "b", True),
        ("CapabilityBoundingSet", "t", 0),
        ("AmbientCapabilities", "t", 0),
        ("ProtectSystem", "s", "strict"),
        ("ProtectHome", "s", "yes"),
        ("PrivateTmp", "b", True),
        ("PrivateDevices", "b", True),
        ("ProtectKernelTunables", "b", True),
        ("ProtectKernelModules", "b", True),
        ("ProtectKernelLogs", "b", True),
        ("ProtectControlGroups", "b", True),
        ("ProtectClock", "b", True),
        ("ProtectHostname", "b", True),
        ("ProtectProc", "s", "invisible"),
        ("ProcSubset", "s", "pid"),
        ("RestrictSUIDSGID", "b", True),
        ("RestrictRealtime", "b", True),
        ("LockPersonality", "b", True),
        ("InaccessiblePaths", "as", list(HIDDEN)),
        ("MemoryMax", "t", _MEMORY_MAX),
        ("TasksMax", "t", _TASKS_MAX),
        ("LimitCORE", "t", 0),
    ]
    if not config.approval.reviewer_network:
        props.append(("PrivateNetwork", "b", True))
    return props


def helper_argv(config: Config, uid: int, gid: int, fd: int) -> list[str]:
    cpu = int(config.approval.reviewer_timeout_seconds) + 1
    network = "1" if config.approval.reviewer_network else "0"
    return [
        units.python_executable(),
        "-I",
        "-S",
        "-c",
        HELPER,
        str(uid),
        str(gid),
        network,
        str(_TASKS_MAX),
        str(cpu),
        str(fd),
        *config.approval.reviewer_command,
    ]


async def review(config: Config, statement: Mapping[str, Any], *, systemd: bool) -> dict[str, Any]:
    """Run the reviewer once on ``statement``: ``{"ran": False, "why"}`` or what it said and how it ended.

    ``systemd``: as a transient service (the runner's jobs get systemd units:
    containment service or scope), else as a confined child (process-group).
    """
    command = config.approval.reviewer_command
    if not command:
        return {"ran": False, "why": "no reviewer is configured (approval.reviewer_command)"}
    who = identity(config)
    if isinstance(who, str):
        return {"ran": False, "why": who}
    try:
        program = binary.open_binary(command[0], trusted=True)  # held until it ran: what runs is this file
    except AirlockError as exc:
        return {"ran": False, "why": f"{exc.code.value}: {exc.message}"}
    try:
        return await _review(config, who, statement, systemd, program)
    finally:
        os.close(program[0])


async def _review(
    config: Config,
    who: tuple[int, int],
    statement: Mapping[str, Any],
    systemd: bool,
    program: tuple[int, os.stat_result],
) -> dict[str, Any]:
    data = canonical_json(dict(statement)) + b"\n"
    deadline = asyncio.get_running_loop().time() + config.approval.reviewer_timeout_seconds
    try:
        await asyncio.wait_for(_slots.acquire(), config.approval.reviewer_timeout_seconds)
    except TimeoutError:
        return {"ran": True, "timed_out": True, "exit_code": None, "stdout": "", "stderr": "", "truncated": False}
    try:
        stdin = _memfd(data)
        try:
            if systemd and systemd_is_running() and os.geteuid() == 0:
                return await _as_service(config, who, stdin, deadline, program[1])
            return await _as_child(config, who, stdin, deadline, program[0])
        finally:
            os.close(stdin)
    finally:
        _slots.release()


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("airlock-review", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    os.write(fd, data)  # a memfd takes it all at once
    import fcntl

    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


async def _bounded(reader: asyncio.StreamReader, keep: int) -> tuple[bytes, bool]:
    """Everything the stream says until EOF, of which the first ``keep`` bytes are kept."""
    kept = bytearray()
    more = False
    while chunk := await reader.read(65536):
        room = keep - len(kept)
        kept += chunk[: max(0, room)]
        more = more or len(chunk) > room
    return bytes(kept), more


def _report(code: int | None, out: tuple[bytes, bool], err: tuple[bytes, bool], timed_out: bool) -> dict[str, Any]:
    return {
        "ran": True,
        "timed_out": timed_out,
        "exit_code": code,
        "stdout": out[0].decode("utf-8", "replace"),
        "truncated": out[1],
        "stderr": err[0].decode("utf-8", "replace"),
    }


async def _as_child(config: Config, who: tuple[int, int], stdin: int, deadline: float, fd: int) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *helper_argv(config, *who, fd),
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment(),
        cwd="/",
        close_fds=True,
        pass_fds=(fd,),
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    reading = asyncio.gather(_bounded(proc.stdout, MAX_STDOUT), _bounded(proc.stderr, MAX_STDERR), proc.wait())

    async def send(signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signum)

    async def wait() -> None:
        await proc.wait()

    exited = asyncio.ensure_future(wait())
    try:
        out, err, code = await asyncio.wait_for(asyncio.shield(reading), _left(deadline))
    except TimeoutError:
        await terminate(send, exited, GRACE_SECONDS)
        reading.cancel()
        with contextlib.suppress(BaseException):
            await reading
        return _report(None, (b"", False), (b"", False), True)
    except asyncio.CancelledError:
        await send(signal.SIGKILL)
        reading.cancel()  # an escaped grandchild may hold the pipes open: never leave the reads waiting
        await proc.wait()
        raise
    finally:
        exited.cancel()
    return _report(code, out, err, False)


async def _as_service(
    config: Config, who: tuple[int, int], stdin: int, deadline: float, program: os.stat_result
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    pipes = [os.pipe2(os.O_CLOEXEC), os.pipe2(os.O_CLOEXEC)]
    name = f"airlock-reviewer-{os.getpid()}-{next(_names)}.service"
    readers: list[asyncio.StreamReader] = []
    try:
        await units._run(units._start, name, properties(config, *who, program), (stdin, pipes[0][1], pipes[1][1]))
    except AirlockError as exc:
        for r, w in pipes:
            os.close(r)
            os.close(w)
        structlog.get_logger().warning("runner.review.start_failed", error=exc.message)
        return {"ran": False, "why": exc.message}
    unit = units.StageService(name)
    transports: list[asyncio.ReadTransport] = []
    reading: asyncio.Future[Any] | None = None
    try:
        for r, w in pipes:
            os.close(w)
            reader = asyncio.StreamReader()
            transport, _ = await loop.connect_read_pipe(_protocol(reader), os.fdopen(r, "rb", 0))
            transports.append(transport)
            readers.append(reader)
        reading = asyncio.gather(_bounded(readers[0], MAX_STDOUT), _bounded(readers[1], MAX_STDERR), unit.wait())
        try:
            out, err, code = await asyncio.wait_for(asyncio.shield(reading), _left(deadline))
        except TimeoutError:
            await unit.kill(signal.SIGKILL)
            reading.cancel()
            with contextlib.suppress(BaseException):
                await reading
            return _report(None, (b"", False), (b"", False), True)
        return _report(code, out, err, False)
    finally:
        if reading is not None:
            reading.cancel()  # cancelled from outside: the shielded reads end too
        for transport in transports:
            transport.close()
        await unit.release()


def _protocol(reader: asyncio.StreamReader) -> Callable[[], asyncio.StreamReaderProtocol]:
    return lambda: asyncio.StreamReaderProtocol(reader)


def _left(deadline: float) -> float:
    return max(0.0, deadline - asyncio.get_running_loop().time())

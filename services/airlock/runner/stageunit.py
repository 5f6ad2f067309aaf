"""A job stage's transient service as data: its name, its properties, the
exec helper it runs and its environment file.  units.py asks systemd for it and
watches it.

The unit gets the job's identity (``User=``, ``Group=``,
``SupplementaryGroups=``), working directory, umask, the kill policy, a
``RuntimeMaxSec=`` backstop, and the rule's ``sandbox:`` (bound to the ticket)
as properties.  Jobs therefore no longer inherit the runner's own sandbox:
without ``sandbox:`` a root job is a full root job, as with sudo.

What runs: systemd executes ``ExecStart`` by path, so the unit's
``ExecStart`` is the exec helper below (``python3 -I -S -c HELPER``), not the
job's binary.  Inside the unit, the helper opens the approved canonical path
again from ``/`` one component at a time with ``O_NOFOLLOW``, compares the
file's device, inode (and for root jobs owner and mode) with the identity the
runner checked against the ticket's ``bound["binaries"]`` and executes that
fd (``execveat``).  A binary swapped after the runner's check is refused
(exit 126, nothing of the job runs).  The working directory is a path to
systemd (``WorkingDirectory=``; no property takes a directory fd), so the
helper compares the directory it was started in (``stat(".")``: the process's
own cwd, no name looked up) with the device and inode of the directory the
runner walked to and holds, and refuses (126) when a rename or symlink swap
after the check made systemd enter another one.  See docs/security.md.

The environment is not a unit property (``systemctl show`` is readable by
every local user and the environment may carry protected values): the runner
writes it, hex-encoded in one variable, to a root-only ``EnvironmentFile=``
that systemd reads while starting the unit; the helper decodes it and
executes the job with exactly that environment.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from airlock.common.sandbox import Property
from airlock.runner.binaries import _Binary
from airlock.runner.jobspec import JobSpec

_UNIT_NAME_MAX = 255
_UNIT_PREFIX = "airlock-job-"
_KEEP = re.compile(r"[A-Za-z0-9.-]")
# Where the runner writes each job's environment file (the runner unit's RuntimeDirectory=).
ENV_DIR = "/run/airlock-runner"
HELPER_EXIT_CHANGED = 126

# Runs as ExecStart of every job unit (python3 -I -S -c): argv is
# [path, dev, ino, uid, mode, cwd, argv0, args...]; uid and mode are "-" for
# unprivileged jobs; cwd is "dev:ino" of the working directory the runner holds
# ("-": not checked, the reviewer's fixed "/").  The environment arrives
# hex-encoded in AIRLOCK_JOB_ENV; reviewed scripts (index:sha256:root-only copy, hex-encoded) in AIRLOCK_JOB_SCRIPTS:
# each is read, checked and sealed into a memfd that replaces argv[index].
# Its imports are the cheapest that do the job (each job's start pays for them):
# posix, _stat and _signal are built in, where os, stat and signal would import
# posixpath, collections.abc, enum and more (14.5 ms of CPU per start with them, 6.7
# without: a bare interpreter is 6.6); fcntl and hashlib only for reviewed scripts.
# posix.environ is the environment as bytes.
HELPER = """\
import posix as os, sys, _signal, _stat
path, dev, ino, uid, mode, cwd = sys.argv[1:7]
def refuse(why):
    os.write(2, ("airlock: %s: %s since it was approved; not executed\\n" % (path, why)).encode())
    os._exit(126)
if cwd != "-":
    here = os.stat(".")
    if "%d:%d" % (here.st_dev, here.st_ino) != cwd:
        os.write(2, b"airlock: the working directory is not the one the runner checked"
                 b" (renamed or swapped); not executed\\n")
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
data = bytes.fromhex(os.environ.get(b"AIRLOCK_JOB_ENV", b"").decode())
env = dict(item.split(b"=", 1) for item in data.split(b"\\0") if item)
if os.environ.get(b"CREDENTIALS_DIRECTORY"):  # the rule's credentials (LoadCredential=, runner/credentials.py)
    env[b"CREDENTIALS_DIRECTORY"] = os.environ[b"CREDENTIALS_DIRECTORY"]
args = sys.argv[7:]
for item in bytes.fromhex(os.environ.get(b"AIRLOCK_JOB_SCRIPTS", b"").decode()).decode().split(";"):
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
    cwd_id: tuple[int, int] | None  # (st_dev, st_ino) of the directory the runner holds for ``cwd``
    umask: int
    env_file: str
    stop_timeout_seconds: float
    runtime_max_seconds: float
    limits: tuple[Property, ...] = ()  # runner.memory_max etc., then the rule's sandbox


def helper_argv(unit: StageUnit) -> list[str]:
    owner = "-" if unit.owner is None else str(unit.owner)
    mode = "-" if unit.mode is None else str(unit.mode)
    cwd = "-" if unit.cwd_id is None else f"{unit.cwd_id[0]}:{unit.cwd_id[1]}"
    held = [unit.path, str(unit.dev), str(unit.ino), owner, mode, cwd]
    return [unit.python, "-I", "-S", "-c", HELPER, *held, *unit.argv]


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


def stage_name(spec: JobSpec, index: int, suffix: str = ".service") -> str:
    """The unit name of stage ``index`` of ``spec`` (``.s<stage>`` only in a pipeline)."""
    return unit_name(spec.operation_id, spec.owner_uid, index if len(spec.stages) > 1 else None, suffix)


def for_stage(
    spec: JobSpec,
    index: int,
    binary: _Binary,
    *,
    env_file: str,
    limits: Sequence[Property],
    runtime_max_seconds: float,
    cwd: os.stat_result | None = None,
) -> StageUnit:
    """Stage ``index`` of ``spec`` as a unit running ``binary`` (opened and checked by the runner);
    ``cwd``: the ``fstat`` of the working directory the runner holds, compared by the helper."""
    last = len(spec.stages) - 1
    trusted = spec.trusted
    return StageUnit(
        name=stage_name(spec, index),
        description=f"airlock job {ascii(spec.operation_id)[1:-1]}" + (f" stage {index + 1}" if last else ""),
        slice=spec.slice,
        python=python_executable(),
        path=binary.path,
        dev=binary.st.st_dev,
        ino=binary.st.st_ino,
        owner=binary.st.st_uid if trusted else None,
        mode=stat.S_IMODE(binary.st.st_mode) if trusted else None,
        argv=(binary.path, *spec.stages[index][1:]),
        uid=spec.identity.uid,
        gid=spec.identity.gid,
        groups=spec.identity.groups,
        cwd=spec.cwd,
        cwd_id=(cwd.st_dev, cwd.st_ino) if cwd is not None else None,
        umask=spec.umask,
        env_file=env_file,
        stop_timeout_seconds=spec.kill_grace_seconds,
        runtime_max_seconds=runtime_max_seconds,
        limits=tuple(limits),
    )


def python_executable() -> str:
    return os.path.realpath(sys.executable)

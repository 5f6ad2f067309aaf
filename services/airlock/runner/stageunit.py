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
from airlock.runner.exechelper import HELPER
from airlock.runner.jobspec import JobSpec

_UNIT_NAME_MAX = 255
_UNIT_PREFIX = "airlock-job-"
_KEEP = re.compile(r"[A-Za-z0-9.-]")
# Where the runner writes each job's environment file (the runner unit's RuntimeDirectory=).
ENV_DIR = "/run/airlock-runner"


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

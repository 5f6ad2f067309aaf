"""A root job's path arguments, on the runner's side: classified at decide time, checked before the job starts.

`inspect` (the runner's ``inspect`` verb, asked by approval at decide time)
walks every candidate argument (`airlock.common.arguments.candidates`) on
fds (`airlock.common.pathtrust`) and returns those someone other than root
could change, with what identifies them now: kind, device and inode, size
and sha256 (or, past `HASH_LIMIT`, size and times).  Approval binds that
list to the ticket as ``bound["arguments"]``.

`check` runs just before the job starts: every bound argument is walked
again and must still be the same file with the same content (or still be
absent), else ``argument_changed`` and nothing runs.  A script's bytes are
read once, verified against the bound hash and returned; `seal` puts them in
a sealed memfd that the job reads instead of the path (spawn.py, units.py),
so a rewrite after this check cannot run.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import posixpath
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airlock.common import pathtrust
from airlock.common.arguments import candidates
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError, ErrorCode

HOST_ROOT = "/proc/1/root"  # the files as PID 1 sees them (CAP_SYS_PTRACE; docs/security.md)
HASH_LIMIT = 64 * 1024 * 1024  # per file: bigger files are bound by size and times
TOTAL_HASH_LIMIT = 256 * 1024 * 1024  # per request
_CHUNK = 1024 * 1024
_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE


@dataclass(frozen=True, slots=True)
class Script:
    stage: int
    index: int
    data: bytes
    sha256: str


def _kind(st: os.stat_result | None) -> str:
    if st is None:
        return "absent"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "directory" if stat.S_ISDIR(st.st_mode) else "other"


def _read(fd: int, limit: int) -> bytes | None:
    """The whole file the O_PATH ``fd`` holds, or None if it is longer than ``limit``."""
    readable = pathtrust.reopen(fd)
    try:
        chunks, size = [], 0
        while chunk := os.read(readable, _CHUNK):
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(readable)


def _hash(fd: int, limit: int) -> str | None:
    readable = pathtrust.reopen(fd)
    try:
        digest, size = hashlib.sha256(), 0
        while chunk := os.read(readable, _CHUNK):
            size += len(chunk)
            if size > limit:
                return None
            digest.update(chunk)
        return digest.hexdigest()
    finally:
        os.close(readable)


def view(containment: Containment) -> str:
    """Where ``/`` is for a job's files: a service job is started by PID 1 and sees its mounts,
    not the runner's own (``PrivateTmp=``); other jobs are the runner's children."""
    return HOST_ROOT if containment is Containment.SERVICE else "/"


def inspect(
    stages: Sequence[Sequence[str]], programs: Sequence[str], cwd: str, *, cwd_given: bool, root: str = "/"
) -> list[dict[str, Any]]:
    """The changeable path arguments of a root job, each with what identifies it now (``root``: `view`)."""
    _can_see(root)
    out: list[dict[str, Any]] = []
    budget = TOTAL_HASH_LIMIT
    scripted: set[int] = set()  # stages whose first path argument was found
    for cand in candidates(stages, programs, cwd_given=cwd_given):
        path = cand.text if cand.text.startswith("/") else posixpath.join(cwd, cand.text)
        try:
            found = pathtrust.walk(path, root)
        except (pathtrust.WalkError, OSError):
            continue  # not a path the job could open either (a loop, a name too long)
        try:
            kind = _kind(found.st)
            script = False
            if cand.script and cand.stage not in scripted and kind == "file":
                scripted.add(cand.stage)  # only the first path argument is the script
                assert found.fd is not None
                script = not cand.exec_only or _head(found.fd) == b"#!"
            if found.problem is None:
                continue  # root's alone: only root could change it
            if kind == "absent" and "/" not in cand.text and not cand.script:
                continue  # a bare word that names nothing: not a path
            where, why = found.problem
            item: dict[str, Any] = {
                "stage": cand.stage,
                "index": cand.index,
                "arg": stages[cand.stage][cand.index],
                "path": path,
                "kind": kind,
                "script": script,
                "changeable": {"path": where, "why": why},
            }
            if found.st is not None and found.fd is not None:
                item |= {"dev": found.st.st_dev, "ino": found.st.st_ino}
                if kind == "file":
                    item["size"] = found.st.st_size
                    digest = _hash(found.fd, min(HASH_LIMIT, budget)) if found.st.st_size <= budget else None
                    if digest is not None:
                        item["sha256"] = digest
                        budget -= found.st.st_size
                    elif script:
                        raise AirlockError(
                            ErrorCode.INVALID_ARGUMENTS,
                            f"{path}: a script for a root job is at most {HASH_LIMIT} bytes",
                            {"field": f"pipeline[{cand.stage}][{cand.index}]"},
                        )
                    else:
                        item |= {"mtime_ns": found.st.st_mtime_ns, "ctime_ns": found.st.st_ctime_ns}
            out.append(item)
        finally:
            found.close()
    return out


def _can_see(root: str) -> None:
    """Fail closed when the job's view of the files is out of reach (the walk would see other files)."""
    try:
        os.close(os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
    except OSError as exc:
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"cannot see the job's files through {root} ({exc.strerror}); nothing was run"
        ) from None


def _head(fd: int) -> bytes:
    readable = pathtrust.reopen(fd)
    try:
        return os.pread(readable, 2, 0)
    finally:
        os.close(readable)


def changed(item: Mapping[str, Any], why: str) -> AirlockError:
    path = str(item.get("path"))
    return AirlockError(
        ErrorCode.ARGUMENT_CHANGED,
        f"{path}: {why} since it was approved; nothing was run",
        {"path": path, "stage": item.get("stage"), "index": item.get("index")},
    )


def check(bound: Sequence[Mapping[str, Any]], root: str = "/") -> list[Script]:
    """Every bound argument is still what was approved (``argument_changed`` otherwise); the scripts' bytes."""
    _can_see(root)
    scripts: list[Script] = []
    for item in bound:
        try:
            found = pathtrust.walk(str(item["path"]), root)
        except OSError as exc:
            raise changed(item, f"cannot be walked ({exc.strerror})") from None
        try:
            kind = _kind(found.st)
            if item["kind"] == "absent":
                if kind != "absent":
                    raise changed(item, "exists now")
                continue
            if found.st is None or found.fd is None:
                raise changed(item, "is gone")
            if kind != item["kind"] or (found.st.st_dev, found.st.st_ino) != (item.get("dev"), item.get("ino")):
                raise changed(item, "is another file")
            if kind != "file":
                continue
            expected = item.get("sha256")
            if item.get("script"):
                data = _read(found.fd, HASH_LIMIT)
                if data is None or hashlib.sha256(data).hexdigest() != expected:
                    raise changed(item, "has other content")
                scripts.append(Script(int(item["stage"]), int(item["index"]), data, str(expected)))
            elif isinstance(expected, str):
                if _hash(found.fd, HASH_LIMIT) != expected:
                    raise changed(item, "has other content")
            elif (found.st.st_size, found.st.st_mtime_ns, found.st.st_ctime_ns) != (
                item.get("size"),
                item.get("mtime_ns"),
                item.get("ctime_ns"),
            ):
                raise changed(item, "was modified")
        finally:
            found.close()
    return scripts


def seal(script: Script) -> int:
    """A sealed memfd holding exactly the reviewed bytes (close-on-exec; spawn passes it on)."""
    fd = os.memfd_create(f"airlock-script-{script.stage}-{script.index}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(script.data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError as exc:
        os.close(fd)
        raise AirlockError(
            ErrorCode.SPAWN_FAILED, f"cannot hold the reviewed script in memory ({os.strerror(exc.errno or errno.EIO)})"
        ) from None
    return fd


def held_path(fd: int) -> str:
    """The name the job opens the sealed script by: its own copy of the fd."""
    return f"/proc/self/fd/{fd}"

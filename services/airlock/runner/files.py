"""File operations, run by the runner as the job's identity.

The operations (`read`, `inspect`, `list_dir`, `find`, `search`, `write`,
`edit`, and `preview` for the operator's diff) are plain functions of a
`FileSpec`; they touch the filesystem with whatever rights the process has.
`execute` runs one in a forked child that first drops to the target identity
(setgroups, setgid, setuid), so the kernel enforces the user's permissions:
permission denied, a missing file, no match are *outcomes*
(``{"ok": false, "error": {"code", "message"}}``), never a crash of the
runner.

Writes are atomic: a temporary file in the same directory, written and
fsynced, given the old file's owner and mode, renamed over the target, and
the directory fsynced.  A reader (or a crash, or SIGKILL at any moment) sees
the old content or the new, never a mix.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
import errno
import fnmatch
import grp
import hashlib
import json
import os
import pwd
import re
import secrets
import signal
import stat
import time
from collections.abc import Callable, Iterator
from typing import Any

from airlock.common.filespec import FileSpec
from airlock.runner.identity import Identity

HASH_LIMIT = 256 * 1024 * 1024  # files_inspect hashes regular files up to this size
SEARCH_FILE_LIMIT = 16 * 1024 * 1024  # files_search skips larger files
PREVIEW_LIMIT = 4 * 1024 * 1024  # files larger than this get no diff in the approval view
DIFF_LIMIT = 64 * 1024


class FileOpError(Exception):
    """An operation that ran and failed: reported as the outcome's error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


_ERRNO_CODES = {
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied",
    errno.ENOENT: "not_found",
    errno.EISDIR: "is_a_directory",
    errno.ENOTDIR: "not_a_directory",
    errno.ELOOP: "not_canonical",  # O_NOFOLLOW met a symlink (root), or a loop
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EFBIG: "too_large",
}


def _os_error(exc: OSError, path: str) -> FileOpError:
    code = _ERRNO_CODES.get(exc.errno or 0, "io_error")
    return FileOpError(code, f"{exc.filename or path}: {exc.strerror or exc}")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "other"


def _read_flags() -> int:
    # As root a symlink in the last component is refused (see _check_canonical);
    # an unprivileged identity follows it with its own rights.
    nofollow = os.O_NOFOLLOW if os.geteuid() == 0 else 0
    return os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | nofollow


def _read_all(path: str, limit: int | None = None) -> bytes:
    fd = os.open(path, _read_flags())
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError("is_a_directory", f"{path}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise FileOpError("not_a_file", f"{path}: not a regular file")
        if limit is not None and st.st_size > limit:
            raise FileOpError("too_large", f"{path}: {st.st_size} bytes is more than {limit}")
        chunks = []
        while chunk := os.read(fd, 1024 * 1024):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


# --- read-only tools ------------------------------------------------------------------


def read(spec: FileSpec) -> dict[str, Any]:
    offset, length = spec.params["offset_bytes"], spec.params["length_bytes"]
    fd = os.open(spec.path, _read_flags())
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise FileOpError("is_a_directory", f"{spec.path}: is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise FileOpError("not_a_file", f"{spec.path}: not a regular file")
        data = os.pread(fd, length, offset) if offset < st.st_size else b""
    finally:
        os.close(fd)
    end = offset + len(data)
    eof = end >= st.st_size
    return {
        "content": base64.b64encode(data).decode("ascii"),
        "content_sha256": _sha256(data),
        "offset_bytes": offset,
        "length_bytes": len(data),
        "size_bytes": st.st_size,
        "next_offset_bytes": None if eof else end,
        "eof": eof,
    }


def _names(uid: int, gid: int) -> tuple[str | None, str | None]:
    try:
        owner: str | None = pwd.getpwuid(uid).pw_name
    except KeyError:
        owner = None
    try:
        group: str | None = grp.getgrgid(gid).gr_name
    except KeyError:
        group = None
    return owner, group


def inspect(spec: FileSpec) -> dict[str, Any]:
    st = os.lstat(spec.path)
    owner, group = _names(st.st_uid, st.st_gid)
    out: dict[str, Any] = {
        "type": _kind(st.st_mode),
        "size_bytes": st.st_size,
        "mode": f"{stat.S_IMODE(st.st_mode):04o}",
        "owner_uid": st.st_uid,
        "owner_gid": st.st_gid,
        "owner": owner,
        "group": group,
        "mtime": st.st_mtime,
        "sha256": None,
    }
    if stat.S_ISLNK(st.st_mode):
        out["link_target"] = os.readlink(spec.path)
    elif stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT:
        try:
            out["sha256"] = _sha256(_read_all(spec.path, HASH_LIMIT))
        except (OSError, FileOpError):
            pass  # metadata is still the answer; the hash needs read permission
    return out


def list_dir(spec: FileSpec) -> dict[str, Any]:
    limit = spec.params["limit"]
    entries: list[dict[str, Any]] = []
    truncated = False
    with os.scandir(spec.path) as it:
        for entry in sorted(it, key=lambda e: e.name):
            if len(entries) >= limit:
                truncated = True
                break
            try:
                st = entry.stat(follow_symlinks=False)
                kind, size = _kind(st.st_mode), st.st_size
            except OSError:
                kind, size = "unknown", None
            entries.append({"name": entry.name, "type": kind, "size_bytes": size})
    return {"entries": entries, "truncated": truncated}


def _walk(root: str, max_depth: int) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Entries below ``root`` (not following symlinks), breadth by name, up to ``max_depth``."""
    stack: list[tuple[str, int]] = [(root, 1)]
    while stack:
        directory, depth = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            continue  # an unreadable subdirectory is skipped, as find(1) reports and goes on
        subdirs = []
        for entry in entries:
            yield directory, entry
            if depth < max_depth and entry.is_dir(follow_symlinks=False):
                subdirs.append((entry.path, depth + 1))
        stack.extend(reversed(subdirs))


def find(spec: FileSpec) -> dict[str, Any]:
    pattern, limit = spec.params["pattern"], spec.params["limit"]
    if not os.path.isdir(spec.path):
        os.scandir(spec.path).close()  # raises the right OSError (ENOENT, ENOTDIR, EACCES)
    paths: list[str] = []
    truncated = False
    for _dir, entry in _walk(spec.path, spec.params["max_depth"]):
        if fnmatch.fnmatchcase(entry.name, pattern):
            if len(paths) >= limit:
                truncated = True
                break
            paths.append(entry.path)
    return {"paths": paths, "truncated": truncated}


def search(spec: FileSpec) -> dict[str, Any]:
    query, limit = spec.params["query"], spec.params["limit"]
    try:
        matcher: Callable[[str], bool] = (
            re.compile(query).search if spec.params["regex"] else (lambda line: query in line)  # type: ignore[assignment]
        )
    except re.error as exc:
        raise FileOpError("invalid_pattern", f"query: not a valid regular expression ({exc})") from None
    st = os.stat(spec.path)
    files: Iterator[str]
    if stat.S_ISDIR(st.st_mode):
        files = (e.path for _d, e in _walk(spec.path, spec.params["max_depth"])
                 if e.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(e.name, spec.params["glob"]))
    else:
        files = iter([spec.path])
    matches: list[dict[str, Any]] = []
    scanned = 0
    truncated = False
    for path in files:
        try:
            data = _read_all(path, SEARCH_FILE_LIMIT)
        except (OSError, FileOpError):
            if path == spec.path:
                raise
            continue
        if b"\0" in data[:8192]:
            continue  # binary
        scanned += 1
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
            if matcher(line):
                if len(matches) >= limit:
                    truncated = True
                    break
                matches.append({"path": path, "line": number, "text": line[:1000]})
        if truncated:
            break
    return {"matches": matches, "files_scanned": scanned, "truncated": truncated}


# --- writes -------------------------------------------------------------------------------


def _current(path: str) -> tuple[bytes | None, os.stat_result | None]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None, None
    return _read_all(path), st


def atomic_write(path: str, data: bytes, existing: os.stat_result | None, mode: int | None) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, owner and mode kept, rename, fsync dir."""
    directory, name = os.path.split(path)
    temp = os.path.join(directory, f".{name}.airlock-{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if existing is not None:
                if (existing.st_uid, existing.st_gid) != (os.geteuid(), os.getegid()):
                    try:
                        os.fchown(fd, existing.st_uid, existing.st_gid)
                    except PermissionError:
                        raise FileOpError(
                            "permission_denied",
                            f"{path}: cannot keep its owner {existing.st_uid}:{existing.st_gid} (only root can); nothing was written",
                        ) from None
                os.fchmod(fd, stat.S_IMODE(existing.st_mode))
            else:
                os.fchmod(fd, (mode if mode is not None else 0o644) & ~_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    dir_fd = os.open(directory or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _umask() -> int:
    old = os.umask(0o022)
    os.umask(old)
    return old


def _target(path: str) -> str:
    # Unprivileged, a symlink is written through to its target (the path policy
    # matched was canonical); as root the path is canonical already.
    return os.path.realpath(path)


def _new_content(spec: FileSpec, before: bytes | None) -> bytes:
    if spec.tool == "files_write":
        return base64.b64decode(spec.params["content"])
    if before is None:
        raise FileOpError("not_found", f"{spec.path}: no such file")
    try:
        text = before.decode("utf-8")
    except UnicodeDecodeError:
        raise FileOpError("not_text", f"{spec.path}: not UTF-8 text; use files_write") from None
    old, new = spec.params["old_text"], spec.params["new_text"]
    count = text.count(old)
    if count == 0:
        raise FileOpError("no_match", f"{spec.path}: old_text was not found")
    if count > 1:
        raise FileOpError("ambiguous_match", f"{spec.path}: old_text matches {count} times; it must match exactly once")
    return text.replace(old, new, 1).encode("utf-8")


def _check_preconditions(spec: FileSpec, before: bytes | None) -> None:
    expected = spec.params.get("expected_sha256")
    if expected is not None and (before is None or _sha256(before) != expected):
        raise FileOpError("precondition_failed", f"{spec.path}: the current content does not have the expected sha256")
    if spec.tool == "files_write" and before is None and not spec.params["create"]:
        raise FileOpError("not_found", f"{spec.path}: no such file (create is false)")


def unified_diff(path: str, before: bytes | None, after: bytes) -> str:
    old = (before or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
    new = after.decode("utf-8", errors="replace").splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(old, new, fromfile=path if before is not None else "/dev/null", tofile=path))
    if len(diff) > DIFF_LIMIT:
        diff = diff[:DIFF_LIMIT] + "\n[diff truncated]\n"
    return diff


def write(spec: FileSpec) -> dict[str, Any]:
    path = _target(spec.path)
    before, existing = _current(path)
    _check_preconditions(spec, before)
    after = _new_content(spec, before)
    atomic_write(path, after, existing, spec.params.get("mode"))
    out = {
        "before_sha256": None if before is None else _sha256(before),
        "after_sha256": _sha256(after),
        "size_bytes": len(after),
        "created": before is None,
    }
    if spec.tool == "files_edit":
        out["diff"] = unified_diff(spec.path, before, after)
    return out


def preview(spec: FileSpec) -> dict[str, Any]:
    """For the approval view: the diff a write or edit would make now (nothing is written)."""
    path = _target(spec.path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    if st is not None and st.st_size > PREVIEW_LIMIT:
        raise FileOpError("too_large", f"{spec.path}: too large for a diff ({st.st_size} bytes)")
    before, _ = _current(path)
    _check_preconditions(spec, before)
    after = _new_content(spec, before)
    return {"before_sha256": None if before is None else _sha256(before), "after_sha256": _sha256(after),
            "diff": unified_diff(spec.path, before, after)}


OPERATIONS: dict[str, Callable[[FileSpec], dict[str, Any]]] = {
    "files_read": read,
    "files_inspect": inspect,
    "files_list": list_dir,
    "files_find": find,
    "files_search": search,
    "files_write": write,
    "files_edit": write,
}


def _check_canonical(spec: FileSpec) -> None:
    """As root, act only on a path that still has no symlink in it.

    Policy matched the canonical path when the request was decided; a requester
    who can write somewhere along the path could swap in a symlink before the
    runner acts and point a privileged read or write at /etc/shadow.  A path
    that resolves to itself now cannot have been redirected (the last
    component is also opened with O_NOFOLLOW, and a rename replaces a symlink
    rather than following it).  Unprivileged identities need no such check:
    the kernel limits them to their own rights either way.
    """
    if spec.tool == "files_inspect":
        # lstat does not follow the last component: a symlink there is inspected as such.
        parent, name = os.path.split(spec.path)
        real = os.path.join(os.path.realpath(parent), name)
    else:
        real = os.path.realpath(spec.path)
    if real != spec.path:
        raise FileOpError("not_canonical", f"{spec.path} resolves to {real}; ask for the resolved path")


def perform(spec: FileSpec, *, preview_only: bool = False) -> dict[str, Any]:
    """Run one operation with this process's rights; errors become the outcome."""
    try:
        if os.geteuid() == 0:
            _check_canonical(spec)
        result = preview(spec) if preview_only else OPERATIONS[spec.tool](spec)
    except FileOpError as exc:
        return {"ok": False, "error": {"code": exc.code, "message": exc.message}}
    except OSError as exc:
        err = _os_error(exc, spec.path)
        return {"ok": False, "error": {"code": err.code, "message": err.message}}
    return {"ok": True, "error": None} | result


# --- the identity-dropping executor -----------------------------------------------------------


def _child(spec: FileSpec, identity: Identity, preview_only: bool, out_fd: int) -> None:
    """In the forked child: drop to the identity, do the work, write the JSON outcome, exit."""
    status = 0
    try:
        signal.set_wakeup_fd(-1)  # the parent's event loop must not hear our signals
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        if os.geteuid() == 0:
            os.setgroups(list(identity.groups))
            os.setgid(identity.gid)
            os.setuid(identity.uid)
        os.umask(0o022)
        outcome = perform(spec, preview_only=preview_only)
        data = json.dumps(outcome, separators=(",", ":")).encode()
        view = memoryview(data)
        while view:
            view = view[os.write(out_fd, view):]
    except BaseException:
        status = 70
    finally:
        os._exit(status)


async def execute(spec: FileSpec, identity: Identity, *, timeout: float, preview_only: bool = False) -> dict[str, Any]:
    """Run ``spec`` in a child that is ``identity``; return the outcome.

    The runner must be root, or already ``identity`` (dev mode), which the
    caller checked.  A child that times out is killed; an outcome that cannot
    be read is reported as an ``io_error`` outcome.
    """
    started_wall, started_mono = time.time(), time.monotonic()
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child never returns
        os.close(read_fd)
        _child(spec, identity, preview_only, write_fd)
    os.close(write_fd)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=64 * 1024 * 1024)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0))
    timed_out = False
    try:
        try:
            data = await asyncio.wait_for(reader.read(), timeout)
        except TimeoutError:
            timed_out = True
            data = b""
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        transport.close()
        status = await asyncio.to_thread(_reap, pid)
    outcome: dict[str, Any]
    if timed_out:
        outcome = {"ok": False, "error": {"code": "timeout", "message": f"the file operation took more than {timeout:g}s"}}
    else:
        try:
            outcome = json.loads(data)
        except ValueError:
            outcome = {"ok": False, "error": {"code": "io_error", "message": f"the file operation failed (status {status})"}}
    return outcome | {
        "started_at": _iso(started_wall),
        "ended_at": _iso(time.time()),
        "duration_ms": round((time.monotonic() - started_mono) * 1000),
        "uid": identity.uid,
        "gid": identity.gid,
    }


def _reap(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return status


def _iso(wall: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")

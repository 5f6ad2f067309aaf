"""File operations on file descriptors, run in a child that already is the job's identity.

The operations (`read`, `inspect`, `list_dir`, `find`, `search`, `write`,
`edit`, and `preview` for the operator's diff) are plain functions of a
`FileSpec`.  They run in `runner.fileop_child`, a process the runner execs fresh as
the target identity, so the kernel enforces that user's permissions:
permission denied, a missing file, no match are *outcomes*
(``{"ok": false, "error": {"code", "message"}}``), never a crash.

Every path is resolved once, here, on file descriptors: from an fd of ``/``,
one component at a time with ``openat(O_PATH|O_DIRECTORY|O_NOFOLLOW)``; the
last component is opened (or created) relative to its parent's fd with
``O_NOFOLLOW``.  A symlink met anywhere is ``not_canonical`` and nothing is
touched; a link swapped in after the walk cannot redirect what the held fds
name.  Only regular files are read or written (a FIFO or device is
``not_a_file``, checked with ``lstat`` before the open and ``fstat`` after,
and the open is non-blocking).  Directories are walked with
``scandir(fd)`` and ``openat`` relative to the held directory fds.

Resolution on descriptors is runner/fileop_walk.py; writes (atomic, metadata kept,
the approved pre-state checked before the rename) are runner/fileop_write.py.
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import grp
import os
import pwd
import re
import stat
from collections.abc import Callable, Generator, Iterator
from typing import Any

from airlock.common.fileop_spec import FileSpec
from airlock.runner.fileop_walk import (
    _READ_DIR,
    FileOpError,
    _join,
    _kind,
    _lstat,
    _open_dir,
    _open_regular,
    _os_error,
    _parent,
    _read_fd,
    _require_regular,
    _sha256,
)
from airlock.runner.fileop_write import preview, write

HASH_LIMIT = 256 * 1024 * 1024  # files_inspect hashes regular files up to this size
SEARCH_FILE_LIMIT = 16 * 1024 * 1024  # files_search skips larger files
SEARCH_OUTPUT_LIMIT = 4 * 1024 * 1024  # bytes of matched text one search returns at most


# --- read-only tools ------------------------------------------------------------------


def read(spec: FileSpec) -> dict[str, Any]:
    offset, length = spec.params["offset_bytes"], spec.params["length_bytes"]
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        fd, st = _open_regular(parent, name, spec.path, stack)
        data = os.pread(fd, length, offset) if offset < st.st_size else b""
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
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        st = _lstat(parent, name, spec.path)
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
            out["link_target"] = os.readlink(name, dir_fd=parent)
        elif stat.S_ISREG(st.st_mode) and st.st_size <= HASH_LIMIT:
            try:
                fd, held = _open_regular(parent, name, spec.path, stack)
                if (held.st_dev, held.st_ino) == (st.st_dev, st.st_ino):
                    out["sha256"] = _sha256(_read_fd(fd, HASH_LIMIT, spec.path))
            except (OSError, FileOpError):
                pass  # metadata is still the answer; the hash needs read permission
    return out


def _listing(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as it:  # scandir duplicates the fd; ours stays open
        return sorted(it, key=lambda e: e.name)


def list_dir(spec: FileSpec) -> dict[str, Any]:
    limit = spec.params["limit"]
    entries: list[dict[str, Any]] = []
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        dir_fd = _open_dir(parent, name, spec.path, stack)
        for entry in _listing(dir_fd):
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


def _walk(
    dir_fd: int, path: str, depth: int, max_depth: int
) -> Generator[tuple[int, str, os.DirEntry[str]], None, None]:
    """(directory fd, directory path, entry) below a held directory, not following symlinks.

    Entries of a directory in name order, then its subdirectories, depth
    first, up to ``max_depth``.  A subdirectory is entered with
    ``openat(O_NOFOLLOW|O_DIRECTORY)`` relative to its parent's fd: one
    swapped for a symlink meanwhile is skipped, never followed.
    """
    try:
        entries = _listing(dir_fd)
    except OSError:
        return  # an unreadable subdirectory is skipped, as find(1) reports and goes on
    for entry in entries:
        yield dir_fd, path, entry
    if depth >= max_depth:
        return
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            sub = os.open(entry.name, _READ_DIR, dir_fd=dir_fd)
        except OSError:
            continue
        try:
            yield from _walk(sub, _join(path, entry.name), depth + 1, max_depth)
        finally:
            os.close(sub)


def find(spec: FileSpec) -> dict[str, Any]:
    pattern, limit = spec.params["pattern"], spec.params["limit"]
    paths: list[str] = []
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        dir_fd = _open_dir(parent, name, spec.path, stack)
        walk = stack.enter_context(contextlib.closing(_walk(dir_fd, spec.path, 1, spec.params["max_depth"])))
        for _fd, directory, entry in walk:
            if fnmatch.fnmatchcase(entry.name, pattern):
                if len(paths) >= limit:
                    truncated = True
                    break
                paths.append(_join(directory, entry.name))
    return {"paths": paths, "truncated": truncated}


def search(spec: FileSpec) -> dict[str, Any]:
    query, limit = spec.params["query"], spec.params["limit"]
    try:
        matcher: Callable[[str], bool] = (
            re.compile(query).search if spec.params["regex"] else (lambda line: query in line)  # type: ignore[assignment]
        )
    except re.error as exc:
        raise FileOpError("invalid_pattern", f"query: not a valid regular expression ({exc})") from None
    matches: list[dict[str, Any]] = []
    scanned = 0
    returned = 0
    truncated = False
    with contextlib.ExitStack() as stack:
        parent, name = _parent(spec.path, stack)
        st = _lstat(parent, name, spec.path)
        files: Iterator[tuple[int, str, str]]  # (directory fd, name, path)
        if stat.S_ISDIR(st.st_mode):
            dir_fd = _open_dir(parent, name, spec.path, stack)
            walk = stack.enter_context(contextlib.closing(_walk(dir_fd, spec.path, 1, spec.params["max_depth"])))
            files = (
                (fd, e.name, _join(d, e.name))
                for fd, d, e in walk
                if e.is_file(follow_symlinks=False) and fnmatch.fnmatchcase(e.name, spec.params["glob"])
            )
        else:
            _require_regular(st, spec.path)
            files = iter([(parent, name, spec.path)])
        for dir_fd, entry_name, path in files:
            try:
                with contextlib.ExitStack() as one:
                    fd, _st = _open_regular(dir_fd, entry_name, path, one)
                    data = _read_fd(fd, SEARCH_FILE_LIMIT, path)
            except (OSError, FileOpError):
                if path == spec.path:
                    raise
                continue
            if b"\0" in data[:8192]:
                continue  # binary
            scanned += 1
            for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
                if matcher(line):
                    text = line[:1000]
                    if len(matches) >= limit or returned + len(text) > SEARCH_OUTPUT_LIMIT:
                        truncated = True
                        break
                    returned += len(text)
                    matches.append({"path": path, "line": number, "text": text})
            if truncated:
                break
    return {"matches": matches, "files_scanned": scanned, "truncated": truncated}


OPERATIONS: dict[str, Callable[[FileSpec], dict[str, Any]]] = {
    "files_read": read,
    "files_inspect": inspect,
    "files_list": list_dir,
    "files_find": find,
    "files_search": search,
    "files_write": write,
    "files_edit": write,
}


def perform(spec: FileSpec, *, preview_only: bool = False, expect: str | None = None) -> dict[str, Any]:
    """Run one operation with this process's rights; errors become the outcome.

    ``expect`` is the pre-state bound to the ticket ("absent" or a sha256):
    a write proceeds only if the file still has it.
    """
    try:
        if preview_only:
            result = preview(spec)
        elif spec.writes:
            result = write(spec, expect)
        else:
            result = OPERATIONS[spec.tool](spec)
    except FileOpError as exc:
        return {"ok": False, "error": {"code": exc.code, "message": exc.message}}
    except OSError as exc:
        err = _os_error(exc, spec.path)
        return {"ok": False, "error": {"code": err.code, "message": err.message}}
    return {"ok": True, "error": None} | result

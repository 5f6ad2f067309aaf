"""A binary's identity: what approval saw, what the runner opens and executes.

Approval resolves each stage's argv[0] to its canonical path (resolve.py),
opens that path here and records the file's identity into the ticket's
``bound["binaries"]``: device and inode, and for a root job the owner and the
mode too.  The runner opens the same canonical path the same way, compares
the identity with the redeemed one, and executes the file it holds open (see
runner/spawn.py), so a symlink swapped, a file renamed over the binary or a
directory moved after approval can no longer change what runs.

The walk starts at ``/`` and opens one component at a time with ``O_NOFOLLOW``
relative to the directory before it: a canonical path has no symlink, so one
found on the way means the path changed since it was resolved.  Every fd is
``O_PATH`` (no read permission needed; ``execveat`` and ``/proc/self/fd/N``
execute it) and close-on-exec.

A root job runs only a trusted binary: the file and every directory above it
owned by root and writable by nobody else.  A directory writable by group or
others passes only with the sticky bit set (``/tmp``) and a root-owned entry
below it, which nobody else may then rename or remove.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH

# The fields an identity carries; root jobs add the owner and the mode.
BASE_FIELDS = ("dev", "ino")
PRIVILEGED_FIELDS = ("dev", "ino", "uid", "mode")


def changed(path: str, why: str) -> AirlockError:
    return AirlockError(ErrorCode.BINARY_CHANGED, f"{path}: {why} since it was approved", {"path": path})


def _unsafe(binary: str, path: str, why: str) -> AirlockError:
    return AirlockError(
        ErrorCode.UNSAFE_BINARY,
        f"{binary}: {path} {why}; a root job runs only binaries that root alone can change",
        {"path": path, "binary": binary},
    )


def _components(path: str) -> list[str]:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise changed(str(path), "is not an absolute path")
    parts = [p for p in path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise changed(path, "is not a canonical path")
    return parts


def trust_problem(st: os.stat_result, *, is_dir: bool, next_owner: int | None = None) -> str | None:
    """Why a file or directory on a root job's binary path is not root's alone, or None.

    ``next_owner`` is the owner of the entry below a directory: a sticky
    directory writable by others passes when that entry is root's.
    """
    if st.st_uid != 0:
        return f"is owned by uid {st.st_uid}, not root"
    if st.st_mode & _WRITABLE_BY_OTHERS:
        if is_dir and st.st_mode & stat.S_ISVTX and next_owner == 0:
            return None
        who = (
            "group and others"
            if st.st_mode & _WRITABLE_BY_OTHERS == _WRITABLE_BY_OTHERS
            else ("its group" if st.st_mode & stat.S_IWGRP else "others")
        )
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def open_binary(path: str, *, trusted: bool) -> tuple[int, os.stat_result]:
    """Open the canonical binary ``path`` from ``/`` without following a symlink.

    Returns an ``O_PATH`` fd (close-on-exec; the caller closes it) and its
    ``fstat``.  ``trusted``: also refuse with ``unsafe_binary`` unless the
    file and each directory above it are root's alone (checked on the fds).
    Raises ``binary_changed`` if the path no longer leads, symlink-free, to a
    regular file.
    """
    parts = _components(path)
    dirfd = os.open("/", _DIR_FLAGS)
    opened = "/"
    parent: os.stat_result = os.fstat(dirfd)
    try:
        for index, part in enumerate(parts):
            last = index == len(parts) - 1
            here = "/" + "/".join(parts[: index + 1])
            where = "" if last else f"{here} "  # the message starts with the path itself
            try:
                fd = os.open(part, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=dirfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    what = "a symlink" if last else "no longer a directory (a symlink or file took its place)"
                    raise changed(path, f"{where}is {what}") from None
                if exc.errno == errno.ENOENT:
                    raise changed(path, f"{where}is gone") from None
                raise changed(path, f"{where}cannot be opened ({os.strerror(exc.errno or 0)})") from None
            st = os.fstat(fd)
            if trusted:
                problem = trust_problem(parent, is_dir=True, next_owner=st.st_uid)
                if problem is not None:
                    os.close(fd)
                    raise _unsafe(path, opened, problem)
            if last:
                break
            os.close(dirfd)
            dirfd, opened, parent = fd, here, st
    finally:
        os.close(dirfd)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        raise changed(path, f"is {what} now")
    if trusted:
        problem = trust_problem(st, is_dir=False)
        if problem is not None:
            os.close(fd)
            raise _unsafe(path, path, problem)
    return fd, st


def identity_of(path: str, st: os.stat_result, *, privileged: bool) -> dict[str, Any]:
    """The identity a ticket binds: path, device and inode; owner and mode for root jobs."""
    out: dict[str, Any] = {"path": path, "dev": st.st_dev, "ino": st.st_ino}
    if privileged:
        out |= {"uid": st.st_uid, "mode": st.st_mode}
    return out


def bind(path: str, *, privileged: bool) -> dict[str, Any]:
    """Open ``path`` as the runner will and return the identity to bind (approval's side)."""
    fd, st = open_binary(path, trusted=privileged)
    os.close(fd)
    return identity_of(path, st, privileged=privileged)


def mismatch(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> list[str]:
    """The fields of ``expected`` that ``actual`` does not match (empty: the same file).

    A field missing from ``expected`` that a root job needs counts as a
    mismatch: an identity bound for an unprivileged job does not cover one
    that runs as root.
    """
    fields = PRIVILEGED_FIELDS if "uid" in actual else BASE_FIELDS
    return [name for name in ("path", *fields) if expected.get(name) != actual.get(name)]


def parse_bound(untrusted: Any, stages: int) -> list[dict[str, Any]]:
    """``bound["binaries"]`` as redeemed: one identity per stage, or invalid_arguments."""
    if not isinstance(untrusted, list) or len(untrusted) != stages:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"bound.binaries: must list one binary identity per stage ({stages})",
            {"field": "bound.binaries"},
        )
    out = []
    for index, item in enumerate(untrusted):
        ok = (
            isinstance(item, dict)
            and isinstance(item.get("path"), str)
            and all(isinstance(item.get(k), int) and not isinstance(item.get(k), bool) for k in BASE_FIELDS)
        )
        if not ok:
            raise AirlockError(
                ErrorCode.INVALID_ARGUMENTS,
                f"bound.binaries[{index}]: must have a path, dev and ino",
                {"field": f"bound.binaries[{index}]"},
            )
        out.append(dict(item))
    return out

"""Resolving a file operation's path once, on file descriptors, and the errors it reports.

From an fd of ``/``, one component at a time with
``openat(O_PATH|O_DIRECTORY|O_NOFOLLOW)``; the last component is opened (or
created) relative to its parent's fd with ``O_NOFOLLOW``.  A symlink met
anywhere is ``not_canonical``; only regular files are read or written
(``lstat`` before the open, ``fstat`` after, a non-blocking open).  An
operation's failure is a `FileOpError` with its code: an outcome, never a crash.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat

_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_READ_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


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
    errno.ELOOP: "not_canonical",  # O_NOFOLLOW met a symlink
    errno.ENXIO: "not_a_file",
    errno.ENOSPC: "no_space",
    errno.EDQUOT: "no_space",
    errno.EFBIG: "too_large",
}


def _os_error(exc: OSError, path: str) -> FileOpError:
    code = _ERRNO_CODES.get(exc.errno or 0, "io_error")
    return FileOpError(code, f"{path}: {exc.strerror or exc}")


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


def _join(directory: str, name: str) -> str:
    return directory.rstrip("/") + "/" + name


# --- resolution on file descriptors ----------------------------------------------------------


def _components(path: str) -> list[str]:
    if path == "/":
        return []
    parts = path.split("/")[1:]
    if not path.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise FileOpError("not_canonical", f"{path}: not a normalised absolute path")
    return parts


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _refusal(exc: OSError, dir_fd: int, name: str, path: str) -> FileOpError:
    """The outcome of a failed ``openat``: a symlink in the way is ``not_canonical``."""
    if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.ENXIO) and _is_link(dir_fd, name):
        return FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    return _os_error(exc, path)


def _openat(dir_fd: int, name: str, flags: int, path: str, mode: int = 0o777) -> int:
    try:
        return os.open(name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise _refusal(exc, dir_fd, name, path) from None


def _hold(stack: contextlib.ExitStack, fd: int) -> int:
    stack.callback(os.close, fd)
    return fd


def _parent(path: str, stack: contextlib.ExitStack) -> tuple[int, str]:
    """(an O_PATH fd of the path's directory, the last name), with no symlink followed.

    Walked from ``/`` one component at a time; each step is relative to the
    fd of the one before, so a rename or a link swapped in later cannot change
    where the walk went.  ``/`` itself is ``(fd of /, ".")``.
    """
    parts = _components(path)
    fd = os.open("/", _PATH_DIR)
    walked = ""
    try:
        for name in parts[:-1]:
            walked = _join(walked, name)
            following = _openat(fd, name, _PATH_DIR, walked)
            os.close(fd)
            fd = following
    except BaseException:
        os.close(fd)
        raise
    return _hold(stack, fd), (parts[-1] if parts else ".")


def _lstat(dir_fd: int, name: str, path: str) -> os.stat_result:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise _os_error(exc, path) from None


def _require_regular(st: os.stat_result, path: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise FileOpError("is_a_directory", f"{path}: is a directory")
    if stat.S_ISLNK(st.st_mode):
        raise FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    raise FileOpError("not_a_file", f"{path}: not a regular file (a {_kind(st.st_mode)})")


def _open_regular(dir_fd: int, name: str, path: str, stack: contextlib.ExitStack) -> tuple[int, os.stat_result]:
    """A held read fd of a regular file (never a FIFO, device or symlink) and its fstat."""
    _require_regular(_lstat(dir_fd, name, path), path)
    fd = _hold(stack, _openat(dir_fd, name, _READ_FILE, path))
    st = os.fstat(fd)
    _require_regular(st, path)  # it may have been swapped between lstat and open
    return fd, st


def _open_dir(dir_fd: int, name: str, path: str, stack: contextlib.ExitStack) -> int:
    st = _lstat(dir_fd, name, path)
    if stat.S_ISLNK(st.st_mode):
        raise FileOpError("not_canonical", f"{path} is a symbolic link; ask for the resolved path")
    if not stat.S_ISDIR(st.st_mode):
        raise FileOpError("not_a_directory", f"{path}: not a directory")
    return _hold(stack, _openat(dir_fd, name, _READ_DIR, path))


def _read_fd(fd: int, limit: int | None = None, path: str = "") -> bytes:
    size = os.fstat(fd).st_size
    if limit is not None and size > limit:
        raise FileOpError("too_large", f"{path}: {size} bytes is more than {limit}")
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1024 * 1024, offset):
        chunks.append(chunk)
        offset += len(chunk)
        if limit is not None and offset > limit:
            raise FileOpError("too_large", f"{path}: more than {limit} bytes")
    return b"".join(chunks)

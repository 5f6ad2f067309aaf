"""`airlock dev up`'s runtime folder, trusted with root's power when dev up runs as root.

It must be safe in a shared ``/tmp`` (issue 39): dev up creates it 0700, or
accepts an existing one only if it is a real directory of the invoking user's
that nobody else may write to (OpenSSH's StrictModes rule); every file it
writes there is opened with ``O_NOFOLLOW`` (the config by ``O_EXCL`` and a
rename, so a planted link is replaced, never followed) and is 0600, as are its
folders and logs.  Split from `airlock.cli.dev`.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path


class UnsafeRuntimeDir(Exception):
    """The runtime folder is not one dev up can trust; the message says why and what to do."""


def _own_dir(path: Path, mode: int) -> None:
    """Make ``path`` a folder of ours (``mode``), or check an existing one is ours and closed to writers.

    `os.lstat`: a symlink is refused, never followed.  Group- or other-writable,
    or another user's, is refused: whoever could write there could plant the
    config or a socket that root then trusts.
    """
    try:
        os.mkdir(path, mode)
        return
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeRuntimeDir(f"{path} exists and is not a directory (a symlink?); remove it or choose another")
    if st.st_uid != os.geteuid():
        raise UnsafeRuntimeDir(
            f"{path} belongs to uid {st.st_uid}, not to you: another user made it, and could swap what is in it; "
            "choose a directory of your own"
        )
    if st.st_mode & 0o022:
        raise UnsafeRuntimeDir(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): anyone who can write "
            f"there could replace its config or sockets; chmod go-w {path}, or choose another"
        )


def prepare_runtime_dir(runtime_dir: Path) -> None:
    """The runtime folder and its logs/ and internal/ folders, created 0700 or checked (`UnsafeRuntimeDir`)."""
    runtime_dir.parent.mkdir(parents=True, exist_ok=True)
    _own_dir(runtime_dir, 0o700)
    for sub in ("logs", "internal"):
        _own_dir(runtime_dir / sub, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` 0600 without following a link: a fresh file (O_EXCL|O_NOFOLLOW), renamed into place."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)
    os.replace(temporary, path)  # replaces a link at ``path`` itself, never its target


def open_log(path: Path) -> int:
    """A service's log for appending: ours, 0600, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise UnsafeRuntimeDir(f"{path} is not a regular file of yours")
    os.fchmod(fd, 0o600)  # a log left by an older dev up may be 0644
    return fd

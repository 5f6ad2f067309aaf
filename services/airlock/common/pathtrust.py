"""Who besides root can change what a path names: a walk on file descriptors.

`walk` opens a path from ``/`` one component at a time with ``O_PATH |
O_NOFOLLOW`` relative to the directory before it, and follows a symbolic
link itself (``readlinkat`` on the directory it sits in, at most 40), so
every directory the kernel would pass through is one the walk held and
checked with ``fstat``.  The answer is the file held open (or that it is
absent) and the first place where someone other than root could change what
the path names: a directory or file not owned by root, or writable by group
or others (a sticky directory such as ``/tmp`` passes above a root-owned
entry, `airlock.common.binary.trust_problem`).  For an absent name the
directory it would be created in counts too: whoever may create it there
decides what a later open finds.

Used for a root job's arguments (runner/arguments.py) and for the
interpreter chain of its binary (common/interp.py).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from airlock.common.binary import trust_problem

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_ANY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_LINKS = 40  # the kernel's limit (MAXSYMLINKS)


class WalkError(OSError):
    """A path that cannot be walked (a symlink loop, a name too long)."""


@dataclass(frozen=True, slots=True)
class Found:
    """What a path names: the file held open (``fd``, ``st``; None when absent),
    where it really is (``real``, symlinks resolved), and the first place someone
    other than root could change that (``problem``: (path, why), None if root's alone)."""

    fd: int | None
    st: os.stat_result | None
    real: str
    problem: tuple[str, str] | None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


def _problem(st: os.stat_result, where: str, *, is_dir: bool, next_owner: int | None = None) -> tuple[str, str] | None:
    why = trust_problem(st, is_dir=is_dir, next_owner=next_owner)
    return (where, why) if why is not None else None


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p and p != "."]


def walk(path: str, root: str = "/") -> Found:
    """Walk the absolute ``path`` on fds (see the module's docstring); the caller closes ``fd``.

    ``root`` is where ``/`` is: ``/proc/1/root`` sees the files as PID 1 (and
    the jobs it starts) sees them, not through the caller's own mount
    namespace (the runner's private ``/tmp``).
    """
    if not path.startswith("/") or "\0" in path:
        raise WalkError(errno.EINVAL, "not an absolute path", path)
    todo = _parts(path)
    root_fd = os.open(root, _DIR_FLAGS)
    stack: list[tuple[int, os.stat_result, str]] = [(root_fd, os.fstat(root_fd), "/")]
    problem: tuple[str, str] | None = None
    links = 0
    try:
        while todo:
            part = todo.pop(0)
            if part == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            dirfd, dir_st, dir_path = stack[-1]
            here = dir_path.rstrip("/") + "/" + part
            try:
                fd = os.open(part, _ANY_FLAGS, dir_fd=dirfd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR):
                    # Absent: whoever may create the name in this directory decides what it will be.
                    problem = problem or _problem(dir_st, dir_path, is_dir=True)
                    return Found(None, None, here, problem)
                raise WalkError(exc.errno or errno.EIO, os.strerror(exc.errno or errno.EIO), here) from None
            st = os.fstat(fd)
            problem = problem or _problem(dir_st, dir_path, is_dir=True, next_owner=st.st_uid)
            if stat.S_ISLNK(st.st_mode):
                os.close(fd)
                links += 1
                if links > MAX_LINKS:
                    raise WalkError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(part, dir_fd=dirfd)
                if target.startswith("/"):
                    while len(stack) > 1:
                        os.close(stack.pop()[0])
                todo = _parts(target) + todo
                continue
            if todo:
                if not stat.S_ISDIR(st.st_mode):
                    os.close(fd)
                    problem = problem or _problem(st, here, is_dir=False)
                    return Found(None, None, here + "/" + "/".join(todo), problem)
                stack.append((fd, st, here))
                continue
            problem = problem or _problem(st, here, is_dir=stat.S_ISDIR(st.st_mode))
            return Found(fd, st, here, problem)
        # The path named a directory already on the stack ("/", or ending in "..").
        fd, st, real = stack[-1]
        held = os.dup(fd)
        problem = problem or _problem(st, real, is_dir=True)
        return Found(held, st, real, problem)
    finally:
        for fd, _st, _path in stack:
            os.close(fd)


def reopen(fd: int) -> int:
    """A readable fd of the file an O_PATH fd holds (the same inode, never the path again)."""
    return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)

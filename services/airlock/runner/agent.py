"""forward_agent: the requesting process's own SSH agent socket, from its credentials.

The client never names the socket.  The runner (root) reads ``SSH_AUTH_SOCK``
from the environment of the process that connected to intake (its pid from
``SO_PEERCRED``), and accepts it only if that process still belongs to the
peer's uid, the path is absolute, and ``lstat`` says it is a socket owned by
that uid.  The job then runs as that same uid, so the kernel checks the
connect to the socket with the peer's own permissions: forwarding gives the
job nothing its requester did not already have.

``/proc/<pid>/environ`` is the environment the process was started with
(later ``setenv`` calls are not in it): what a shell's exported variable gives.

The path is an environment value of another user's process; it is never put
in an error message, a log line or a journal record (the name only).
"""

from __future__ import annotations

import errno
import os
import stat

from airlock.common import validate
from airlock.common.errors import AirlockError
from airlock.runner.identity import Identity

NAME = "SSH_AUTH_SOCK"
_MAX_ENVIRON = 4 * 1024 * 1024  # far above ARG_MAX's share for the environment
_MAX_PATH = 4096  # PATH_MAX


def _refuse(message: str) -> AirlockError:
    return validate.bad("forward_agent", message)


def _read_environ(pid: int, uid: int) -> bytes:
    """The start-up environment of process ``pid``, if it still belongs to ``uid``.

    The directory fd pins the process: if ``pid`` exits and the number is
    reused, reads through the old fd fail (ESRCH) rather than return the new
    process's environment.  The owner of /proc/<pid> is the process's
    effective uid (root for a non-dumpable process, which is then refused).
    """
    try:
        dirfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise _refuse(f"the requesting process (pid {pid}) has gone") from None
    try:
        if os.fstat(dirfd).st_uid != uid:
            raise _refuse(f"the requesting process (pid {pid}) no longer belongs to uid {uid}")
        try:
            fd = os.open("environ", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError:
            raise _refuse(f"the environment of the requesting process (pid {pid}) cannot be read") from None
        try:
            chunks: list[bytes] = []
            size = 0
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
                size += len(chunk)
                if size > _MAX_ENVIRON:
                    raise _refuse(f"the environment of the requesting process (pid {pid}) is too large")
        except OSError:
            raise _refuse(f"the requesting process (pid {pid}) has gone") from None
        finally:
            os.close(fd)
        # Checked again after the read: still the same process, still the same owner.
        if os.fstat(dirfd).st_uid != uid:
            raise _refuse(f"the requesting process (pid {pid}) no longer belongs to uid {uid}")
        return b"".join(chunks)
    finally:
        os.close(dirfd)


def _lookup(environ: bytes, name: bytes) -> bytes | None:
    """The first ``name=`` entry, as getenv(3) finds it."""
    prefix = name + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix) :]
    return None


def agent_socket(peer_pid: int, peer_uid: int, identity: Identity) -> str | None:
    """The peer process's SSH agent socket for a job running as ``identity``.

    None when the peer has no ``SSH_AUTH_SOCK``: like ``ssh -A`` without an
    agent, the job then runs without one (reference/000 clients set
    forward_agent whenever they may use an agent).  Raises
    ``invalid_arguments`` ("forward_agent: ...") if the job would not run as
    the peer, the process is gone or changed hands, or the path is not an
    absolute path to a socket the peer's uid owns: those are never ignored.
    """
    if identity.uid != peer_uid:
        raise _refuse(f"the job must run as the requesting user (uid {peer_uid}), not uid {identity.uid}")
    if peer_pid <= 0:
        raise _refuse("the requesting process is not known")
    raw = _lookup(_read_environ(peer_pid, peer_uid), NAME.encode())
    if not raw:
        return None
    if not raw.startswith(b"/"):
        raise _refuse(f"{NAME} of the requesting process is not an absolute path")
    if len(raw) > _MAX_PATH:
        raise _refuse(f"{NAME} of the requesting process is longer than {_MAX_PATH} bytes")
    path = os.fsdecode(raw)
    try:
        st = os.lstat(raw)  # the last component itself: a symlink is refused, not followed
    except OSError as exc:
        why = "does not exist" if exc.errno == errno.ENOENT else "cannot be examined"
        raise _refuse(f"{NAME} of the requesting process {why}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise _refuse(f"{NAME} of the requesting process is not a socket")
    if st.st_uid != peer_uid:
        raise _refuse(f"{NAME} of the requesting process is owned by uid {st.st_uid}, not by uid {peer_uid}")
    return path

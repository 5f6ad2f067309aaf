"""The runner's fork server: starts unsandboxed job stages that systemd then puts in a scope.

The runner is sandboxed (airlock-runner.service: no capabilities, no network,
a read-only system): what it forks inherits all of that.  So a job whose rule
needs no service-only sandbox property is forked here instead: this process
is a transient service the runner starts once (forker.py), with systemd's
defaults and no sandbox, as ``python3 -I -S`` of this file.  It is what
``systemd-run --scope`` is to a command: the process that forks, while
systemd puts the child in its own scope (the runner asks for it).

Its only input is fd 0, one end of a SOCK_SEQPACKET socket pair the runner
kept the other end of (no name on any filesystem: nobody else can reach it).
It adds no power the runner lacks: the runner can already ask systemd for a
root service running anything.  When the runner's end closes, it exits, and
systemd kills whatever it forked that had not yet been moved to a scope.

Messages (runner -> here): ``spawn`` with fds [spec memfd, cwd, stdout,
stderr, exe, extra...] (stdin last when the spec says so); cwd is the
working directory the runner walked to and checked, held open: the child
enters it with ``fchdir``, never by name (a directory renamed or a symlink
swapped after the check cannot move the job).  The spec (JSON in a
memfd, so argv and environment have no size limit) gives a tag, argv,
environment, uid, gid, groups, cwd, umask and which argv entries the extra
fds (sealed scripts) replace.  The child leads its own session, switches to
the job's identity, and waits at a gate: a pipe whose write end goes back to
the runner with the child's pid (``spawned``).  The runner opens it (``1``)
once systemd has moved the child into the job's scope; a gate closed without
it ends the child with 125, nothing of the job run.  Every child is reaped
here and its wait status sent back (``exited``).

Standard library only, no airlock imports: it runs from the file's path.
"""

from __future__ import annotations

import array
import ctypes
import errno as _errno
import fcntl
import json
import os
import select
import signal
import socket
import sys
from typing import Any

_MAX_FDS = 64
_GATE_REFUSED = 125
# keyctl(2) by number (no libkeyutils in Debian's minimal install): KEYCTL_JOIN_SESSION_KEYRING.
_KEYCTL = {"x86_64": 250, "aarch64": 219, "armv7l": 311, "i686": 288, "ppc64le": 289, "s390x": 280, "riscv64": 219}
_KEYCTL_JOIN_SESSION_KEYRING = 1
_libc = ctypes.CDLL(None, use_errno=True)
_HIGH_FD = 512  # above every fd the child is given, below the soft limit (1024 under systemd)


def _child(spec: dict[str, Any], fds: list[int], gate: int) -> None:
    """In the forked child: become the job's process, wait at the gate, execute.  Never returns."""
    try:
        os.setsid()
        for signum in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        stdin = fds.pop() if spec["stdin"] else os.open(os.devnull, os.O_RDONLY)
        cwd, stdout, stderr, exe, *extra = fds
        cwd = fcntl.fcntl(cwd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD + _MAX_FDS + 8)  # above what closerange closes
        # Out of the way of 0..N first, then into place: an fd received as 1 must not be clobbered.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIGH_FD) for fd in (stdin, stdout, stderr, exe, *extra, gate)]
        for target, fd in enumerate(high[:-1]):
            os.dup2(fd, target, inheritable=True)
        gate = os.dup2(high[-1], 3 + 1 + len(extra), inheritable=False)
        os.closerange(gate + 1, cwd)  # every fd but the stage's and the held cwd, whatever number cwd got
        os.closerange(cwd + 1, max(os.sysconf("SC_OPEN_MAX"), cwd + 1))
        args = list(spec["argv"])
        for offset, index in enumerate(spec["extra_argv"]):
            args[index] = f"/proc/self/fd/{4 + offset}"
        os.umask(spec["umask"])
        if (spec["uid"], spec["gid"], sorted(spec["groups"])) != (os.getuid(), os.getgid(), sorted(os.getgroups())):
            os.setgroups(spec["groups"])
            os.setresgid(spec["gid"], spec["gid"], spec["gid"])
            os.setresuid(spec["uid"], spec["uid"], spec["uid"])
        os.fchdir(cwd)  # the held directory, as the job's user (the kernel checks its search bit, as for chdir)
        os.close(cwd)
        _own_keyring()
        opened = b""
        while True:
            chunk = os.read(gate, 16)
            if not chunk:
                break
            opened += chunk
        if opened != b"1":
            os._exit(_GATE_REFUSED)
        os.close(gate)
        os.execve("/proc/self/fd/3", args, spec["env"])  # noqa: S606  the runner's held, checked file
    except OSError as exc:
        os.write(2, f"airlock: cannot execute {spec['argv'][0]}: {exc.strerror}\n".encode())
        os._exit(127 if exc.errno == 2 else 126)
    except BaseException:  # never back into the server's loop: this is the job's process
        os.write(2, b"airlock: cannot start the job\n")
        os._exit(126)
    os._exit(126)


def _own_keyring() -> None:
    """A new anonymous session keyring, owned by the job's user: every job shares the fork server's
    otherwise (a service gets its own: systemd's KeyringMode=private, the default for system services)."""
    number = _KEYCTL.get(os.uname().machine)
    if number is None or _libc.syscall(number, _KEYCTL_JOIN_SESSION_KEYRING, None) >= 0:
        return
    errno = ctypes.get_errno()
    # Keyrings refused to everyone here (a container manager's seccomp filter: nspawn's): systemd
    # goes on without one too.  Any other failure ends the stage before the job runs.
    if errno not in (_errno.ENOSYS, _errno.EPERM, _errno.EACCES, _errno.EOPNOTSUPP):
        raise OSError(errno, "cannot give the job a session keyring of its own")


def _receive(sock: socket.socket) -> tuple[bytes, list[int]]:
    fds = array.array("i")
    data, ancdata, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(_MAX_FDS * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
    return data, list(fds)


def _spawn(sock: socket.socket, fds: list[int], children: dict[int, int]) -> None:
    tag = 0
    try:
        with os.fdopen(fds[0], "rb") as f:
            spec = json.loads(f.read())
        tag = int(spec["tag"])
        gate_read, gate_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            _child(spec, fds[1:], gate_read)
        os.close(gate_read)
        children[pid] = tag
        reply = json.dumps({"spawned": tag, "pid": pid}).encode()
        sock.sendmsg([reply], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [gate_write]))])
        os.close(gate_write)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        sock.send(json.dumps({"failed": tag, "error": str(exc)}).encode())
    finally:
        for fd in fds[1:]:
            try:
                os.close(fd)
            except OSError:
                pass


def _reap(sock: socket.socket, children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        tag = children.pop(pid, None)
        if tag is not None:
            sock.send(json.dumps({"exited": tag, "pid": pid, "status": status}).encode())


def main() -> int:
    try:
        return _serve()
    except ConnectionError:  # reset or a broken pipe: the runner is gone (killed), nothing is left to serve
        return 0


def _serve() -> int:
    sock = socket.socket(fileno=os.dup(0))
    os.close(0)
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the loop: reaped below
    children: dict[int, int] = {}
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while True:
        for fd, _events in poller.poll():
            if fd == wake_read:
                while True:
                    try:
                        if not os.read(wake_read, 256):
                            break
                    except BlockingIOError:
                        break
                _reap(sock, children)
                continue
            data, fds = _receive(sock)
            if not data:
                return 0  # the runner is gone
            if data == b"spawn" and fds:
                _spawn(sock, fds, children)
            else:
                for stray in fds:
                    os.close(stray)
        _reap(sock, children)


if __name__ == "__main__":
    sys.exit(main())

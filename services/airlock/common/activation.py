"""Sockets handed over by systemd (or by `airlock dev up`, which does the same).

The passed fds are read exactly once (``listen_fds_with_names`` unsets the
LISTEN_* variables so no child ever sees them), LISTEN_PID is honoured by
libsystemd, and each socket is found by its ``FileDescriptorName=``.  Only
listening AF_UNIX stream sockets are accepted.  They are never closed early or
unlinked: the socket unit owns the path.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping

# Which FileDescriptorName= each service must be handed.
DOORS: dict[str, tuple[str, ...]] = {
    "intake": ("agent",),
    "approval": ("approval", "operator"),
    "runner": ("runner",),
    "journal": ("journal",),
    "exectree": ("exectree",),
}

# airlock-notify says READY=1 once each channel has had the journal's answer through approval, or after this
# long anyway (relay/service.py); `airlock dev up` gives it that long once the services are up (cli/dev.py).
RELAY_READY_SECONDS = 60.0


class ActivationError(Exception):
    pass


def _listen_fds_with_names() -> dict[int, str]:
    from systemd import daemon  # python3-systemd

    return dict(daemon.listen_fds_with_names(unset_environment=True))


def take_sockets(required: Iterable[str], fds: Mapping[int, str] | None = None) -> dict[str, socket.socket]:
    """Return ``{name: socket}`` for every required FileDescriptorName."""
    passed = _listen_fds_with_names() if fds is None else dict(fds)
    by_name: dict[str, socket.socket] = {}
    for fd, name in sorted(passed.items()):
        sock = socket.socket(fileno=fd)
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            raise ActivationError(f"passed fd {fd} ({name}) is not an AF_UNIX stream socket")
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            raise ActivationError(f"passed fd {fd} ({name}) is not listening (Accept=no is required)")
        sock.set_inheritable(False)  # never leak into a job
        by_name[name] = sock
    missing = [name for name in required if name not in by_name]
    if missing:
        got = ", ".join(sorted(by_name)) or "none"
        raise ActivationError(
            f"no socket named {', '.join(missing)} was passed (got: {got}); "
            "start this service through its .socket unit or `airlock dev up`"
        )
    return by_name

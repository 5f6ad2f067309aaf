"""Cold start under socket activation (issue 37): wake the services intake is about to call.

The first request after an idle exit started the four services one after the
other: intake, then the journal when intake recorded the request, then
approval and the runner when intake asked them -- each a Python start.  Here
intake, before its own imports, connects to each internal socket and closes
the connection at once: the connection waiting on a listening socket is what
makes systemd start its service, so they start while intake does (each
accepts the empty connection, reads its end and forgets it).

`main` is the ``airlock-intake`` command (pyproject's entry point) and
``python3 -m airlock.intake``: it wakes the peers, then loads intake.

Only under systemd's socket activation (``LISTEN_PID`` is this process and
systemd's ``INVOCATION_ID`` is set), where the paths are the socket units'
own; ``airlock dev up`` starts every service itself.  Imports nothing beyond
``os``, ``socket`` and ``collections.abc`` (about a millisecond, and intake
loads it anyway): it runs before the rest of intake is loaded.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

# units/airlock-journal.socket, airlock-approval.socket and airlock-runner.socket.
PEERS = (
    "/run/airlock/internal/journal.sock",
    "/run/airlock/internal/approval.sock",
    "/run/airlock/internal/runner.sock",
)


def peers(environ: Mapping[str, str] = os.environ) -> int:
    """Poke each internal socket once; how many accepted the connection (0 when not socket-activated)."""
    if environ.get("LISTEN_PID") != str(os.getpid()) or not environ.get("INVOCATION_ID"):
        return 0
    woken = 0
    for path in PEERS:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
            woken += 1
        except OSError:
            pass  # not there or its queue full: intake's own call will find out and say so
        finally:
            sock.close()
    return woken


def main() -> int:
    peers()
    from airlock.intake.service import main as serve  # after the wake: this import is most of the start

    return serve()

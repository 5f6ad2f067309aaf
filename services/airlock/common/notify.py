"""sd_notify through sdnotify: READY, STATUS, WATCHDOG, STOPPING.

Without NOTIFY_SOCKET (a plain foreground run) every call is a no-op.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Mapping

import sdnotify


class Notifier:
    """sd_notify for the service's own unit (the approval hook is `approval.hook.NotifyCommand`)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self._enabled = bool(environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self._enabled else None
        self._watchdog_usec = 0
        try:
            if environ.get("WATCHDOG_PID") in (None, "", str(os.getpid())):
                self._watchdog_usec = int(environ.get("WATCHDOG_USEC", "0"))
        except ValueError:
            self._watchdog_usec = 0
        # Jobs and hooks must not inherit our notify or watchdog settings.
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            os.environ.pop(key, None)

    def _send(self, state: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(state)

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")
        if not gc.isenabled():  # paused by airlock.entry for the start: what it built lives as long as we do
            gc.freeze()
            gc.enable()

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog_interval(self) -> float:
        """Half the watchdog period, in seconds (0 when no watchdog is set)."""
        return self._watchdog_usec / 2_000_000 if self._watchdog_usec else 0.0

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self) -> None:
        self._send("STOPPING=1")

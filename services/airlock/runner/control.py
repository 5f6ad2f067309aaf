"""Live control of one running job: its exec tree as it grows, and an operator's kill.

`JobControl` is made by the runner's ``exec`` before the job starts and
handed to the spawner, which tells it where the job lives (its units, or the
pids it forked) and through which containment it can be signalled.  A kill
that arrives before the job started cancels it (nothing runs); after, the
signal goes to the whole job: ``KillUnit`` on every stage's unit (its whole
cgroup) in service containment, the scope and the process groups otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from typing import Any, Protocol

from airlock.common.codec import iso_utc
from airlock.runner.execwatch import Watch
from airlock.runner.proctree import ProcEvents


class Signallable(Protocol):
    async def signal(self, signum: int) -> None: ...


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class JobControl:
    def __init__(self, events: ProcEvents | None, tree_limit: int, cancel: asyncio.Event) -> None:
        self.events = events if tree_limit > 0 else None
        self.tree_limit = tree_limit
        self.cancel = cancel
        self.watch: Watch | None = None
        self.containment: Signallable | None = None
        self.killed: dict[str, Any] | None = None
        self.protected: tuple[str | bytes, ...] = ()  # protected values and credentials: out of the tree too
        self.summary: dict[str, Any] = {}  # what `running` lists: the command, as whom, since when

    # --- the exec tree (spawn.py calls these) ---

    def begin(self, units: Iterable[str] = ()) -> None:
        if self.events is not None:
            self.watch = self.events.watch(units, self.tree_limit)

    def claim(self, pids: Iterable[int]) -> None:
        if self.events is not None and self.watch is not None and not self.watch.units:
            self.events.claim(self.watch, pids)

    def end(self) -> None:
        if self.events is not None and self.watch is not None:
            self.events.finish(self.watch)

    def tree(self, max_bytes: int) -> dict[str, Any] | None:
        return self.watch.record(max_bytes, self.protected) if self.watch is not None else None

    # --- kill ---

    def started(self, containment: Signallable) -> None:
        self.containment = containment

    async def kill(self, signum: int, by: str, reason: str) -> str:
        """Signal the whole job; returns ``running`` or ``not started`` (then it never starts)."""
        self.killed = {"by": by, "signal": signal_name(signum), "reason": reason, "at": iso_utc(time.time())}
        if self.containment is None:
            self.cancel.set()
            return "not started"
        await self.containment.signal(signum)
        self._signal_escaped(signum)
        return "running"

    def _signal_escaped(self, signum: int) -> None:
        """Process groups: what left them (setsid, a double fork) is still the job's by ancestry."""
        if self.events is None or self.watch is None or self.watch.units:
            return  # under a unit, KillUnit reached the whole cgroup
        groups = set(getattr(self.containment, "pgids", ()))
        # Held by pidfd, then asked again: a pid whose exit the events report meanwhile may already be
        # another process's, and root must never signal that one by its number.
        held: dict[int, int] = {}
        for pid in self.events.live(self.watch):
            with contextlib.suppress(OSError):
                held[pid] = os.pidfd_open(pid)
        try:
            still = set(self.events.live(self.watch))
            for pid, fd in held.items():
                try:
                    if pid in still and os.getpgid(pid) not in groups:
                        signal.pidfd_send_signal(fd, signum)
                except OSError:
                    continue  # gone meanwhile
        finally:
            for fd in held.values():
                os.close(fd)

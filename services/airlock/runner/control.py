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
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire.exectree import Tree
from airlock.runner.execwatch import Watch
from airlock.runner.treeclient import CALL_SECONDS, TreeClient

# A job whose `follow` has not been answered this long after its stages ended left a process behind.
FOLLOW_GRACE = 0.02


class Signallable(Protocol):
    async def signal(self, signum: int) -> None: ...


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


class JobControl:
    def __init__(self, trees: TreeClient | None, tree_limit: int, cancel: asyncio.Event) -> None:
        self.trees = trees if tree_limit > 0 else None
        self.tree_limit = tree_limit
        self.cancel = cancel
        self.watch: Watch | None = None
        self.watch_id = 0  # the listener's (airlock-exectree) ID of the job's watch (`watch`); 0: none
        self.watch_key = 0  # or this runner's key of the job the listener follows (`follow`); 0: none
        self._later = False  # by ancestry: the watch goes with the claim (see `begin`)
        self._following: asyncio.Future[Tree | AirlockError] | None = None  # `follow`: answered with the tree
        self._finishing: asyncio.Future[Tree | AirlockError] | None = None  # the tree, from the end on
        self.containment: Signallable | None = None
        self.killed: dict[str, Any] | None = None
        self.protected: tuple[str | bytes, ...] = ()  # protected values and credentials: out of the tree too
        self.summary: dict[str, Any] = {}  # what `running` lists: the command, as whom, since when

    # --- the exec tree (spawn.py calls these; airlock-exectree follows the job: runner/treeclient.py) ---

    # The listener's calls are off the job's path where the order allows (issue 47's bench: a blocking
    # round trip each was 1 ms of an exec's 11).  By cgroup the watch must exist before the job's first
    # exec, so it is awaited, and `finish` at the end asks for the tree.  By fork ancestry, once the
    # listener follows this runner's forks, the stages' fork events wait for their job in the listener:
    # one `follow` sent after the fork watches and claims them, and its answer is the tree, sent when the
    # events show the job's last process gone -- about when the runner reaps it, so the tree is there
    # when the reply needs it instead of one round trip later.  A job that left a process behind (a
    # daemon) is ended by `finish` with the key after FOLLOW_GRACE.  The first job, or one after the
    # listener started again, awaits a `watch` before the fork, claims after and finishes at the end.

    async def begin(self, units: Iterable[str] = ()) -> None:
        if self.trees is None:
            return
        units = tuple(units)
        if units or not self.trees.follows_forks:
            self.watch, self.watch_id = await self.trees.watch(units, self.tree_limit)
        else:
            self._later = True  # `claim` follows

    async def claim(self, pids: Iterable[int]) -> None:
        if self.trees is None:
            return
        if self._later:
            self._later = False
            self.watch = Watch((), self.tree_limit)
            self.watch.source = self.trees.source
            self.watch_key = self.trees.new_key()
            self._following = asyncio.ensure_future(self.trees.follow(self.watch_key, self.tree_limit, pids))
        elif self.watch is not None and self.watch_id and not self.watch.units:
            await self.trees.claim(self.watch, self.watch_id, pids)

    async def end(self) -> None:
        """The job's stages are done: its tree is asked for now, and awaited by `tree`."""
        if self.trees is None:
            return
        if self._following is not None:
            self._finishing = asyncio.ensure_future(self._settle(self._following, self.watch_key))
            self._following, self.watch_key = None, 0
        elif self.watch is not None and self.watch_id:
            self._finishing = asyncio.ensure_future(self.trees.finish(self.watch_id))
            self.watch_id = 0

    async def _settle(self, following: asyncio.Future[Tree | AirlockError], key: int) -> Tree | AirlockError:
        """`follow`'s answer; when it has not come within FOLLOW_GRACE, `finish` by key (which answers both)."""
        assert self.trees is not None
        done, _ = await asyncio.wait({following}, timeout=FOLLOW_GRACE)
        if done:
            return following.result()
        got = await self.trees.finish(0, key)
        if isinstance(got, AirlockError) and got.code is ErrorCode.NOT_FOUND:  # `follow` was answered meanwhile
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(following), CALL_SECONDS)
        following.cancel()  # the listener failed: its call is not waited for any longer
        return got

    async def tree(self, max_bytes: int) -> dict[str, Any] | None:
        if self.watch is None:
            return None
        if self._finishing is not None:
            got = await self._finishing
            self._finishing = None
            TreeClient.fill(self.watch, got)
            if isinstance(got, AirlockError) and self.trees is not None:
                self.trees.follows_forks = False  # a listener started again follows no one yet
        return self.watch.record(max_bytes, self.protected)

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
        await self._signal_escaped(signum)
        return "running"

    async def _signal_escaped(self, signum: int) -> None:
        """Process groups: what left them (setsid, a double fork) is still the job's by ancestry."""
        id_, key = self.watch_id, self.watch_key
        if self.trees is None or self.watch is None or self.watch.units or not (id_ or key):
            return  # under a unit, KillUnit reached the whole cgroup
        groups = set(getattr(self.containment, "pgids", ()))
        # Held by pidfd, then asked again: a pid whose exit the events report meanwhile may already be
        # another process's, and root must never signal that one by its number.
        held: dict[int, int] = {}
        for pid in await self.trees.live(id_, key):
            with contextlib.suppress(OSError):
                held[pid] = os.pidfd_open(pid)
        try:
            still = set(await self.trees.live(id_, key))
            for pid, fd in held.items():
                try:
                    if pid in still and os.getpgid(pid) not in groups:
                        signal.pidfd_send_signal(fd, signum)
                except OSError:
                    continue  # gone meanwhile
        finally:
            for fd in held.values():
                os.close(fd)

"""airlock-exectree: the one process that listens to the kernel's process events, for the runner.

It holds the exec-tree source (runner/proctree.py: the process-events
connector, else fanotify exec opens) so that airlock-runner does not: the
connector wants CAP_NET_ADMIN, netlink and the host's network namespace,
fanotify CAP_SYS_ADMIN, and reading what a program is (/proc/PID/exe of any
user's process) CAP_SYS_PTRACE.  This unit has those and nothing else
(units/airlock-exectree.service); the root runner has none of them.

Its door (internal/exectree.sock, `common.wire.exectree`) serves only the
runner's uid: ``watch`` a job before its first process starts, ``claim`` the
stages the runner forked, ``live`` for a kill, ``finish`` for its tree.  A
job's watch lives here until ``finish`` or until the runner that asked is
gone (a runner restarted mid-job does not leave its watches behind), and a
service that holds watches does not exit when idle.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from airlock.common import daemon, log
from airlock.common.codec import canonical_json
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import AllowList, Peer, uid_of
from airlock.common.server import Call, Door, Service
from airlock.common.wire import exectree as wire
from airlock.common.wire.verb import Caller, Empty, serve
from airlock.runner.execwatch import Watch
from airlock.runner.proctree import ProcEvents

NAME = "exectree"
# Jobs followed at once at most: more are told the tree is unavailable (a runner runs far fewer).
MAX_WATCHES = 4096


def tree_of(w: Watch, max_bytes: int) -> wire.Tree:
    """``w`` as the ``finish`` reply: its programs in about ``max_bytes`` of JSON, the rest counted as more.

    Twice the runner's budget is sent: the runner redacts secrets first, which can change an entry's size."""
    kept: list[dict[str, Any]] = []
    used = 0
    for entry in w.execs:
        used += len(canonical_json(entry)) + 1
        if used > 2 * max_bytes:
            break
        kept.append(entry)
    return wire.Tree(
        source=w.source,
        unavailable=w.unavailable,
        complete=w.complete,
        limit=w.limit,
        more=w.more + len(w.execs) - len(kept),
        missed=tuple(w.missed),
        unattributed=w.unattributed,
        unwatched=dict(w.unwatched),
        processes=tuple(kept),
    )


class ExecTree:
    def __init__(self, config: Config, events: ProcEvents | None = None) -> None:
        self.config = config
        self.events = events or ProcEvents(config.runner.exec_tree_source)
        self.watches: dict[int, tuple[Watch, int]] = {}  # id -> (its watch, the runner's pid that asked)
        self.ending: dict[int, asyncio.Future[wire.Tree]] = {}  # id -> the `follow` waiting for its tree
        self.keys: dict[tuple[int, int], int] = {}  # (runner pid, the runner's key) -> id, for `follow`
        self.ids = itertools.count(1)
        self.runner_uid = uid_of(config.services.runner_user)
        self.log = log.get()

    def caller_of(self, peer: Peer) -> frozenset[Caller]:
        if self.runner_uid is not None and peer.uid == self.runner_uid:
            return frozenset({Caller.RUNNER})
        self.log.warning("exectree.peer.refused", peer_uid=peer.uid, peer_pid=peer.pid)
        return frozenset()

    def _find(self, id_: int) -> Watch:
        found = self.watches.get(id_)
        if found is None:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no watch {id_} (this listener restarted, or it was finished)")
        return found[0]

    def _id(self, call: Call, id_: int, key: int) -> int:
        """The watch a call names: by its id, or by the key the calling runner follows it by."""
        if key:
            id_ = self.keys.get((call.peer.pid, key), 0)
            if not id_:
                raise AirlockError(ErrorCode.NOT_FOUND, f"no job followed by key {key} (restarted, or it was finished)")
        return id_

    def _drop(self, id_: int) -> wire.Tree | None:
        """Forget the watch ``id_``; hand its tree to the `follow` that waits for it, if any."""
        w, _pid = self.watches.pop(id_)
        self.events.finish(w)
        for key in [k for k, v in self.keys.items() if v == id_]:
            del self.keys[key]
        waiter = self.ending.pop(id_, None)
        if waiter is None or waiter.done():
            return None
        tree = tree_of(w, w.reply_bytes)
        waiter.set_result(tree)
        return tree

    def _forget_gone_runners(self) -> None:
        for id_, (_w, pid) in list(self.watches.items()):
            if not os.path.exists(f"/proc/{pid}"):
                self._drop(id_)
                self.log.info("exectree.watch.dropped", watch=id_, runner_pid=pid)

    async def watch(self, call: Call, args: wire.Watch) -> wire.Watching:
        self._forget_gone_runners()
        if len(self.watches) >= MAX_WATCHES:
            return wire.Watching(0, self.events.source, f"more than {MAX_WATCHES} jobs are followed already")
        if not args.units:  # by fork ancestry: the stages are this runner's forks
            self.events.follow_forks_of(call.peer.pid)
        w = self.events.watch(args.units, args.limit)  # the source was opened before serving (`build`)
        if w.unavailable is not None:
            return wire.Watching(0, w.source, w.unavailable)
        id_ = next(self.ids)
        self.watches[id_] = (w, call.peer.pid)
        if args.pids:
            self.events.claim(w, args.pids)
        return wire.Watching(id_, w.source)

    async def follow(self, call: Call, args: wire.Follow) -> wire.Tree:
        """Watch, claim and finish in one call: the tree comes when the events show none of the job's
        processes alive (by ancestry none can join it after that), or at a ``finish`` with the key."""
        named = (call.peer.pid, args.key)
        if named in self.keys:
            raise AirlockError(ErrorCode.INVALID_REQUEST, f"key {args.key} names a job followed already")
        watching = await self.watch(call, wire.Watch((), args.limit, args.pids))
        if not watching.id:
            return wire.Tree(watching.source, watching.unavailable, complete=False)
        w = self._find(watching.id)
        w.reply_bytes = args.max_bytes
        self.keys[named] = watching.id
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[wire.Tree] = loop.create_future()
        self.ending[watching.id] = waiter

        def gone() -> None:  # from the events' reading thread (or at once, in at_exit)
            loop.call_soon_threadsafe(self._gone, watching.id, waiter)

        self.events.at_exit(w, gone)
        return await waiter

    def _gone(self, id_: int, waiter: asyncio.Future[wire.Tree]) -> None:
        if self.ending.get(id_) is waiter and id_ in self.watches:
            self._drop(id_)

    async def claim(self, call: Call, args: wire.Claim) -> Empty:
        self.events.claim(self._find(args.id), args.pids)
        return Empty()

    async def live(self, call: Call, args: wire.Ref) -> wire.Live:
        return wire.Live(tuple(self.events.live(self._find(self._id(call, args.id, args.key)))))

    async def finish(self, call: Call, args: wire.Finish) -> wire.Tree:
        id_ = self._id(call, args.id, args.key)
        w = self._find(id_)
        return self._drop(id_) or tree_of(w, args.max_bytes)  # a waiting `follow` gets the same tree

    def door(self) -> Door:
        """exectree.sock: the runner's uid only (its socket unit lets root alone connect)."""
        return Door(
            NAME,
            allow=AllowList.of([self.config.services.runner_user], []),
            verbs=serve(
                wire.DOOR,
                {
                    wire.WATCH: self.watch,
                    wire.CLAIM: self.claim,
                    wire.LIVE: self.live,
                    wire.FINISH: self.finish,
                    wire.FOLLOW: self.follow,
                },
                caller_of=self.caller_of,
            ),
            max_line=64 * 1024,
        )


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    tree = ExecTree(config)
    if config.runner.exec_tree_max == 0:  # no trees: the runner asks nothing, so nothing is opened
        tree.events.unavailable = "runner.exec_tree_max is 0"
    else:  # before serving: the first watch (the one that started this service) must find the source open
        await asyncio.to_thread(tree.events.open)
    if tree.events.unavailable is not None:
        tree.log.warning("exectree.source.unavailable", error=tree.events.unavailable)
    else:
        tree.log.info("exectree.source.opened", source=tree.events.source, names=tree.events.names)
    service = Service(NAME, config, [tree.door()])
    service.keep_alive = lambda: bool(tree.watches)  # an idle exit would lose the running jobs' trees
    service.on_stop = _closing(tree)
    return service


def _closing(tree: ExecTree) -> Any:
    async def close() -> None:
        await asyncio.to_thread(tree.events.close)

    return close


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["NAME", "ExecTree", "build", "main", "tree_of"]

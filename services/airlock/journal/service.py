"""airlock-journal: the one writer of the audit store.

It serves ``internal/journal.sock`` to the other services; its verbs are
declared in `airlock.common.wire.journal` and its door table is built from
them (`wire.verb.serve`).  Who calls is the connection's SO_PEERCRED, never
the message: a uid that belongs to one service can call only that service's
verbs and write only as that service.  (Under `airlock dev up` every service
runs as the same user; then the uid maps to several services and an append's
``writer`` picks among exactly those.)
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import time
from collections.abc import Awaitable, Mapping
from typing import Any, Final

from airlock import __version__
from airlock.common import daemon, log
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import AllowList, Peer, uid_of
from airlock.common.server import Call, Door, Service
from airlock.common.wire import journal as wire
from airlock.common.wire.verb import Caller, Empty, Handler, Message, Verb, serve
from airlock.journal import anchors, segments, select
from airlock.journal.anchoring import Anchoring, check_at_start, identity, shipping
from airlock.journal.auditing import Auditing
from airlock.journal.disk import DiskWatch
from airlock.journal.quota import JournalQuota
from airlock.journal.store import Store

# Retention (journal/retention.py) runs after every rollover, at start and this often.
RETENTION_EVERY_SECONDS: Final = 3600.0

NAME = "journal"


def writers_by_uid(config: Config) -> dict[int, set[str]]:
    table: dict[int, set[str]] = {}
    for service, user in (
        ("intake", config.services.intake_user),
        ("approval", config.services.approval_user),
        ("runner", config.services.runner_user),
    ):
        uid = uid_of(user)
        if uid is not None:
            table.setdefault(uid, set()).add(service)
    return table


class Journal:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self.database = config.paths.state_dir / "journal.sqlite"
        self.writers = writers_by_uid(config)
        # Each agent's share of the journal's bytes: charged for every record, checked at op.begin.
        self.quota = JournalQuota(
            config.journal.agent_bytes_per_second, config.journal.agent_burst_bytes, time.monotonic
        )
        store.meter = self.quota.charge
        self.auditing = Auditing(config, store)  # verify, archive, retention
        self.disk_watch: DiskWatch | None = None  # set by `build`

    def callers(self, peer: Peer) -> frozenset[Caller]:
        """The services the peer's uid is (`wire.verb.serve` refuses a verb not declared for them)."""
        return frozenset(Caller(service) for service in self.writers.get(peer.uid, ()))

    def writer_for(self, peer: Peer, claimed: str | None) -> str:
        allowed = self.writers.get(peer.uid, set())
        if len(allowed) == 1:
            return next(iter(allowed))
        if claimed in allowed:
            assert claimed is not None
            return claimed
        raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")

    def verbs(self) -> dict[Verb[Any, Any], Handler[Any, Any]]:
        """The door's handlers; while the chain does not match its anchors only verify and disk answer."""
        refusing = self._refusing
        return {
            wire.APPEND: refusing(self.append),
            wire.OP_BEGIN: refusing(self.op_begin),
            wire.OP_COMPLETE: refusing(self.op_complete),
            wire.OP_ABANDON: refusing(self.op_abandon),
            wire.REQUEST_CLAIM: refusing(self.request_claim),
            wire.SYNC: refusing(self.sync),
            wire.EVENTS: refusing(self.events),
            wire.RECORDS: refusing(self.records),
            wire.HEAD: refusing(self.head),
            wire.VERIFY: self.auditing.verify,
            wire.ARCHIVE: refusing(self.auditing.archive),
            wire.DISK: self.disk,
        }

    def _refusing(self, handler: Handler[Any, Any]) -> Handler[Any, Any]:
        store = self.store

        async def guarded(call: Call, args: Any) -> Message:
            if store.refusal is not None:
                raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, store.refusal)
            reply: Message = await handler(call, args)
            return reply

        return guarded

    async def append(self, call: Call, args: wire.Append) -> wire.Appended:
        appended = await self._append(call.peer, args)
        assert appended is not None
        return appended

    async def _append(self, peer: Peer, a: wire.Append, claim: tuple[str, float] | None = None) -> wire.Appended | None:
        """Append one event; with ``claim`` only if the request ID wins it (None otherwise), in one commit."""
        fields: dict[str, Any] = {
            "writer": self.writer_for(peer, a.writer),
            "kind": a.kind,
            "request_id": a.request_id,
            "operation_id": a.operation_id,
            "peer_uid": a.peer_uid,
            "session": a.session,
            "payload": a.payload,
        }
        after = self.store.parse_marks(None if a.after is None else list(a.after))
        if not a.durable:
            # Queued, answered at once: durable with the next durable commit that names its mark.
            mark = self.store.append_deferred(**fields, claim=claim, after=after)
            return None if mark is None else wire.Appended(mark=mark)
        if claim is None:
            event = await self.store.append(**fields, after=after)
        else:
            found = await self.store.append_claimed(claim[0], claim[1], **fields)
            if found is None:
                return None
            event = found
        return wire.Appended(event.seq, event.hash)

    async def _event(self, peer: Peer, event: wire.Append | None) -> wire.Journaled:
        """Append the event a combined verb carries (one round trip less per request)."""
        if event is None:
            return wire.Journaled()
        return wire.Journaled(await self._append(peer, event))

    async def op_begin(self, call: Call, a: wire.OpBegin) -> wire.OpBegun:
        """Claim the request ID (optional), journal the event (optional), then begin the operation."""
        self.writer_for(call.peer, "intake")
        # A new request of an agent over its journal quota, or one the full replay store has no room
        # for, is refused before anything of it is written.
        self._admit(a.event.peer_uid if a.event is not None else None)
        self.store.op_room(a.operation_id)
        appended: wire.Appended | None = None
        if a.claim is not None:
            claim = (a.claim.key, a.claim.window_seconds)
            if a.event is not None:
                # The replay gate and request.received in one transaction: one commit.
                appended = await self._append(call.peer, a.event, claim)
                if appended is None:
                    return wire.OpBegun(claimed=False)
            else:
                if not await self.store.claim_request_id(*claim):
                    return wire.OpBegun(claimed=False)
        elif a.event is not None:
            appended = await self._append(call.peer, a.event)
        result = await self.store.op_begin(a.operation_id, a.digest, has_protected=a.has_protected)
        return wire.OpBegun(True, result.state, result.outcome, appended)

    def _admit(self, uid: int | None) -> None:
        """The agent's journal quota; the first refusal of a spell is logged for the operator."""
        try:
            self.quota.admit(uid)
        except AirlockError as exc:
            if self.quota.newly_limited:
                log.get().warning(
                    "journal.quota.exceeded",
                    peer_uid=uid,
                    retry_after_seconds=exc.details.get("retry_after_seconds"),
                    bytes_per_second=self.quota.rate,
                    burst_bytes=self.quota.burst,
                )
            raise

    async def op_complete(self, call: Call, a: wire.OpComplete) -> wire.Journaled:
        self.writer_for(call.peer, "intake")
        # Submitted together, the outcome and the event land in one group commit.
        # The event's `after` marks (the runner's deferred end record) hold for the outcome too.
        marks = a.event.after if a.event is not None else None
        after = self.store.parse_marks(None if marks is None else list(marks))
        _, out = await asyncio.gather(
            self.store.op_complete(a.operation_id, a.digest, a.outcome, after),
            self._event(call.peer, a.event),
        )
        return out

    async def op_abandon(self, call: Call, a: wire.OpAbandon) -> wire.Journaled:
        self.writer_for(call.peer, "intake")
        await self.store.op_abandon(a.operation_id)
        return await self._event(call.peer, a.event)

    async def request_claim(self, call: Call, a: wire.Claim) -> wire.Claimed:
        """Intake's replay guard: claim a request ID for the replay window, durably.

        A claim (a control action's: ping or hello with a time) is a row too: charged to the agent's
        journal quota like a record, and refused when the agent is over it."""
        self.writer_for(call.peer, "intake")
        uid, colon, _ = a.key.partition(":")
        if colon and uid.isdigit() and len(uid) <= 10:
            self._admit(int(uid))
            self.quota.charge(int(uid), len(a.key))
        return wire.Claimed(await self.store.claim_request_id(a.key, a.window_seconds))

    async def sync(self, call: Call, a: wire.Sync) -> wire.Synced:
        """Which of the caller's deferred marks are not durable (failed, or of an earlier journal process)."""
        self.writer_for(call.peer, a.writer)
        return wire.Synced(tuple(await self.store.sync(list(a.marks))))

    async def events(self, call: Call, a: wire.Events) -> wire.Page:
        page = self.store.events(after=a.after, tail=a.tail, limit=a.limit or 64, scope=a.scope)
        return wire.Page(tuple(e.to_dict() for e in page.events), page.next_cursor, page.latest)

    async def records(self, call: Call, a: wire.Records) -> wire.Found:
        """A service's own records by kind and payload fields (journal/select.py); the writer interprets them."""
        try:
            return await asyncio.to_thread(select.records, self.database, a)
        except (sqlite3.Error, ValueError) as exc:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"the journal could not be read: {exc}") from None

    async def disk(self, call: Call, a: Empty) -> wire.Disk:
        """The journal's size, its filesystem's free space and growth rate (`airlock status`)."""
        watch = self.disk_watch
        if watch is None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the disk watch is not running")
        try:
            found = await watch.check()
        except OSError as exc:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"cannot measure the journal's filesystem: {exc}") from None
        return wire.Disk.from_dict(found.to_dict())

    async def head(self, call: Call, a: Empty) -> wire.Head:
        seq, digest = self.store.head()
        return wire.Head(seq, digest)


async def _logged(work: Awaitable[Any]) -> None:
    """Background work: an error is logged, never raised into the event loop."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.get().error("journal.background.failed", error=str(exc)[:300])


async def build(config: Config, sockets: Mapping[str, socket.socket]) -> Service:
    config.paths.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    store = Store.open(
        config.paths.state_dir / "journal.sqlite",
        operation_retention=config.journal.operation_retention,
        operation_capacity=config.journal.operation_capacity,
        operation_capacity_per_agent=config.journal.operation_capacity_per_agent,
        segment_max_bytes=config.journal.segment_max_bytes,
        segment_max_age=config.journal.segment_max_age,
    )
    store.archive_dir = config.journal.archive_dir or segments.default_archive_dir(store.path)
    journal = Journal(config, store)
    anchor_path = anchors.path_beside(store.path)
    await asyncio.to_thread(check_at_start, store, anchor_path)
    anchoring = Anchoring(
        store,
        anchor_path,
        config.journal.anchor_every_records,
        config.journal.anchor_every_seconds,
        key=config.journal.checkpoint_key,
        identity=identity(),
    )
    store.on_commit = anchoring.committed
    background: set[asyncio.Task[Any]] = set()

    def spawn(work: Awaitable[Any]) -> None:
        task = asyncio.get_running_loop().create_task(_logged(work))
        background.add(task)
        task.add_done_callback(background.discard)

    def rolled(events: list[Any]) -> None:
        # The seal and the opening are anchored (and signed) at once; then retention runs.
        log.get().info("journal.segment.sealed", segment=events[0].payload.get("segment"), last_seq=events[0].seq)
        spawn(anchoring.anchor("rollover"))
        spawn(journal.auditing.retain())

    store.on_rollover = rolled
    journal.auditing.anchoring = anchoring
    j = config.journal
    journal.disk_watch = watch = DiskWatch(
        store.path,
        warn_percent=j.disk_warn_percent,
        warn_bytes=j.disk_warn_bytes,
        every=j.disk_check_seconds,
        repeat=j.disk_warn_every_seconds,
    )
    store.on_records, anchoring.host = shipping()
    s = config.services
    door = Door(
        "journal",
        allow=AllowList.of([s.intake_user, s.approval_user, s.runner_user], []),
        verbs=serve(wire.DOOR, journal.verbs(), caller_of=journal.callers),
        max_line=wire.MAX_LINE,
    )
    service = Service(NAME, config, [door])

    async def started() -> None:
        if store.refusal is not None:
            return
        payload: dict[str, Any] = {"service": NAME, "pid": os.getpid(), "version": __version__}
        if store.restored_triggers:
            payload["restored_triggers"] = list(store.restored_triggers)
        await store.append(writer="journal", kind="service.started", payload=payload)
        await anchoring.anchor("start")
        anchoring.start()
        watch.start()

        async def hourly() -> None:
            while True:
                await _logged(journal.auditing.retain())
                await asyncio.sleep(RETENTION_EVERY_SECONDS)

        spawn(hourly())

    async def stop() -> None:
        for task in list(background):
            task.cancel()
        await watch.stop()
        await anchoring.stop()
        try:
            if store.refusal is None:
                stopping = {"service": NAME, "pid": os.getpid()}
                await store.append(writer="journal", kind="service.stopping", payload=stopping)
        finally:
            await store.close()
            await anchoring.anchor("stop")

    service.on_started = started
    service.on_stop = stop
    return service


def main(argv: list[str] | None = None) -> int:
    return daemon.service_main(NAME, build, argv)

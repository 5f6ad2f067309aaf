"""The journal's durable store: hash-chained audit events and the replay store.

One SQLite database in WAL mode with ``synchronous=FULL``: a commit is on disk
when it returns.  Appends return only after their commit.

Group commit: every append and every settled operation goes through one queue
drained by one writer task.  The writer takes everything queued, commits it in
one transaction on its own thread, and while that fsync runs the event loop
keeps queueing the next batch — so N concurrent appends cost about one fsync,
not N.  The chain (seq, prev_hash, hash) is computed only by that writer, so
it has no races.  If a transaction fails (disk full, read-only, I/O error)
every append in it fails with ``audit_unavailable`` and the head is reloaded
from the database, so the chain continues from what is really on disk.

Request IDs: intake's replay guard (``claim_request_id``) lives here too, in
the ``request_ids`` table, and goes through the same writer: the check and the
insert run inside one transaction on the one writer thread, so two claims of
one key can never both win, and a claim survives an intake or journal restart.

Deferred appends (issue 21): an append may be queued without waiting for
its commit (``append_deferred``); it answers at once with a *mark*
(``"<boot>:<n>"``: this store's random boot ID and the append's place in the
queue).  The queue is one FIFO drained by one writer, so a deferred record is
durable once any later durable commit of this store has returned -- unless
its own transaction failed or the journal restarted in between.  A durable
append (or settle) that names earlier marks in ``after`` therefore commits
only if each of them is already committed or in its own transaction: a mark
of another boot, or of a transaction that failed, fails it with
``audit_unavailable``.  An exec's request, decision and ``exec.started`` cost
one fsync this way, and nothing starts on the strength of a record that was
lost.

Connections: the writer's connection is used only on the writer thread (the
lock documents and enforces that); reads use a second, read-only connection,
and ``verify`` opens its own so a long scan reads one consistent
snapshot without holding up ``events``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from airlock.common.codec import canonical_json, iso_utc, reject_constant
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import check_writer
from airlock.journal import chain
from airlock.journal.chain import GENESIS, Anchor, VerifyResult
from airlock.journal.operations import MAX_ID_CHARS, OpBegin, OperationTable, Settled, check_id

__all__ = ["GENESIS", "Event", "EventsPage", "OpBegin", "Stats", "Store", "VerifyResult"]

MAX_PAYLOAD_BYTES: Final = 64 * 1024
MAX_OUTCOME_BYTES: Final = 1024 * 1024
CACHE_KIB: Final = 512  # SQLite page cache per connection
MAX_PAGE: Final = 256
# A batch this large already amortises the fsync; bigger ones only delay the
# first caller in it.
MAX_BATCH: Final = 1024
SCHEMA_VERSION: Final = 3
# A replay window longer than a day is a misconfiguration, not a policy.
MAX_CLAIM_WINDOW: Final = 86400.0
# Marks of failed deferred appends remembered; past it the oldest are
# forgotten and every mark below the newest forgotten one counts as failed.
MAX_FAILED_MARKS: Final = 65536
MAX_AFTER: Final = 16  # marks one append may name
# How long a batch of deferred appends alone waits for a durable one to share
# its commit (an exec's path from request.received to exec.started takes a few
# ms); past it they are committed on their own.
DEFER_LINGER: Final = 0.1
# Claim keys are "<uid>:<request id>": the uid's digits, a colon, an ID.
MAX_CLAIM_KEY_CHARS: Final = MAX_ID_CHARS + 16
MAX_UID: Final = 2**32 - 1

_SCHEMA: Final = """
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY,   -- assigned by the writer, never reused
    time         TEXT NOT NULL,
    kind         TEXT NOT NULL,
    request_id   TEXT,
    operation_id TEXT,
    peer_uid     INTEGER,
    session      TEXT,
    writer       TEXT NOT NULL,
    payload      TEXT NOT NULL,         -- canonical JSON, exactly as hashed
    prev_hash    TEXT NOT NULL,
    hash         TEXT NOT NULL
);
CREATE INDEX events_request   ON events (request_id, seq)   WHERE request_id IS NOT NULL;
CREATE INDEX events_operation ON events (operation_id, seq) WHERE operation_id IS NOT NULL;
CREATE INDEX events_session   ON events (session, seq)      WHERE session IS NOT NULL;
CREATE INDEX events_peer      ON events (peer_uid, seq)     WHERE peer_uid IS NOT NULL;
CREATE TABLE operations (
    ord          INTEGER PRIMARY KEY,   -- completion order: eviction order
    operation_id TEXT NOT NULL UNIQUE,
    digest       TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    completed_at REAL NOT NULL
);
"""

# Schema 2: request IDs claimed within the replay window (intake's replay guard).
_SCHEMA_2: Final = """
CREATE TABLE request_ids (
    key     TEXT PRIMARY KEY,              -- "<peer uid>:<request id>"
    expires REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX request_ids_expires ON request_ids (expires);
"""

# Schema 3: the highest seq ever written, so a deleted tail is never written
# again under the same numbers (and is evident: high-water above the head).
_SCHEMA_3: Final = """
CREATE TABLE IF NOT EXISTS chain_high (
    id  INTEGER PRIMARY KEY CHECK (id = 1),
    seq INTEGER NOT NULL
);
INSERT OR IGNORE INTO chain_high (id, seq) SELECT 1, COALESCE(MAX(seq), 0) FROM events;
"""

# Defence in depth against our own bugs; the hash chain and the anchors are
# what catch someone with write access to the file.  Re-created at every open
# if missing (`Store.restored_triggers` names them).
_TRIGGERS: Final[Mapping[str, str]] = {
    "events_no_update": "CREATE TRIGGER events_no_update BEFORE UPDATE ON events\n"
                        "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
    "events_no_delete": "CREATE TRIGGER events_no_delete BEFORE DELETE ON events\n"
                        "BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;",
    "chain_high_no_lower": "CREATE TRIGGER chain_high_no_lower BEFORE UPDATE ON chain_high WHEN NEW.seq < OLD.seq\n"
                           "BEGIN SELECT RAISE(ABORT, 'the high-water mark never goes down'); END;",
    "chain_high_no_delete": "CREATE TRIGGER chain_high_no_delete BEFORE DELETE ON chain_high\n"
                            "BEGIN SELECT RAISE(ABORT, 'the high-water mark never goes down'); END;",
}

_COLUMNS: Final = "seq, time, kind, request_id, operation_id, peer_uid, session, writer, payload, prev_hash, hash"
_SCOPES: Final[Mapping[str, type]] = {"request_id": str, "operation_id": str, "session": str, "peer_uid": int}


@dataclass(frozen=True, slots=True)
class Event:
    """One audit record as stored and chained."""

    seq: int
    time: str
    kind: str
    request_id: str | None
    operation_id: str | None
    peer_uid: int | None
    session: str | None
    writer: str
    payload: dict[str, Any]
    prev_hash: str
    hash: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": self.time,
            "kind": self.kind,
            "request_id": self.request_id,
            "operation_id": self.operation_id,
            "peer_uid": self.peer_uid,
            "session": self.session,
            "writer": self.writer,
            "payload": self.payload,
            "prev_hash": self.prev_hash,
            "hash": self.hash,
        }


@dataclass(frozen=True, slots=True)
class EventsPage:
    """One page of the events feed (reference/004)."""

    events: list[Event]
    next_cursor: int
    latest: int

    def to_dict(self) -> dict[str, Any]:
        return {"events": [e.to_dict() for e in self.events], "next_cursor": self.next_cursor, "latest": self.latest}


@dataclass(frozen=True, slots=True)
class Stats:
    """Writer counters since open: ``transactions`` < ``appends`` is group commit at work."""

    transactions: int
    appends: int
    operations: int
    failed_transactions: int
    largest_batch: int


@dataclass(slots=True)
class _Append:
    time: str
    kind: str
    request_id: str | None
    operation_id: str | None
    peer_uid: int | None
    session: str | None
    writer: str
    payload: dict[str, Any]
    payload_json: str
    # None for a deferred append: nobody waits for its commit.
    future: asyncio.Future[Event | None] | None
    # Appended only if this claim wins, in the same transaction (intake's
    # replay gate and its request.received cost one commit, not two).
    claim: _Claim | None = None
    mark: int = 0  # its place in the queue (see "Deferred appends")
    after: tuple[int, ...] = ()  # earlier marks that must be committed first


@dataclass(slots=True)
class _Settle:
    entry: Settled
    future: asyncio.Future[None]
    after: tuple[int, ...] = ()


@dataclass(slots=True)
class _Sync:
    """Resolved once everything queued before it has been committed or failed."""

    future: asyncio.Future[None]


@dataclass(slots=True)
class _Claim:
    key: str
    now: float
    window: float
    future: asyncio.Future[bool]


_Work = _Append | _Settle | _Claim | _Sync


class Store:
    """The journal store.  Create with `Store.open`; async methods need one running loop."""

    def __init__(
        self,
        path: Path,
        wconn: sqlite3.Connection,
        rconn: sqlite3.Connection,
        head: tuple[int, str],
        operations: OperationTable,
        clock: Callable[[], float],
        high_water: int = 0,
        restored_triggers: tuple[str, ...] = (),
    ) -> None:
        self.path = path
        # Triggers found missing at open and created again (for the service to report).
        self.restored_triggers = restored_triggers
        self._wconn = wconn
        self._wlock = threading.Lock()
        self._rconn = rconn
        self._rlock = threading.Lock()
        self._head = head
        self._high = max(high_water, head[0])
        # Set by `refuse`: every later append, claim and settle fails closed.
        self._refusal: str | None = None
        # Called on the event loop after each successful commit (the journal anchors from it).
        self.on_commit: Callable[[], None] | None = None
        # Called with every committed batch's events, before on_commit (journal/fleet.py ships them to journald).
        self.on_records: Callable[[list[Event]], None] | None = None
        self._ops = operations
        self._clock = clock
        # One thread, so the writer connection is only ever used from it.
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-writer")
        # None is the stop sentinel, queued behind everything still to commit.
        # Unbounded on purpose: putting never awaits, so nothing can slip in
        # behind the sentinel; the journal service bounds its connections.
        self._queue: asyncio.Queue[_Work | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._closed = False
        self._transactions = 0
        self._appends = 0
        self._settles = 0
        self._failed = 0
        self._largest_batch = 0
        # Deferred appends: this store's boot ID, marks issued and settled so
        # far, and the marks whose transaction failed (see the module doc).
        self.boot = secrets.token_hex(8)
        self._issued = 0
        self._failed_marks: set[int] = set()
        self._failed_floor = 0
        # Keys of deferred claims queued and not yet committed or failed.
        self._claims_queued: dict[str, int] = {}
        # Set when work someone waits for is queued (or the store closes): a batch of
        # deferred appends alone waits for it up to DEFER_LINGER.
        self._urgent = asyncio.Event()

    # -- opening --------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: Path,
        *,
        operation_retention: float = 300,
        operation_capacity: int = 256,
        clock: Callable[[], float] = time.time,
    ) -> Store:
        """Open (creating if needed) the database at ``path``, mode 0600.

        Raises `AirlockError(audit_unavailable)` if it cannot be opened or has
        a schema this version does not know.
        """
        path = Path(path)
        operations = OperationTable(retention=operation_retention, capacity=operation_capacity, clock=clock)
        wconn: sqlite3.Connection | None = None
        rconn: sqlite3.Connection | None = None
        try:
            _create_private(path)
            wconn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
            mode = wconn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise sqlite3.OperationalError(f"cannot switch to WAL mode (got {mode!r})")
            wconn.execute("PRAGMA synchronous=FULL")
            # Appends touch only the tail of the tables: a small page cache is
            # enough, and keeps a long-running journal's memory flat.
            wconn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            _migrate(wconn)
            restored = _restore_triggers(wconn)
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    os.chmod(side, 0o600)
            head = _read_head(wconn)
            high = _read_high(wconn)
            operations.load(_read_operations(wconn, operations.expiry_cutoff()))
            rconn = _reader(path)
        except (sqlite3.Error, OSError) as exc:
            for conn in (wconn, rconn):
                if conn is not None:
                    conn.close()
            raise AirlockError(
                ErrorCode.AUDIT_UNAVAILABLE, f"cannot open the audit journal {path}: {exc}", {"path": str(path)}
            ) from exc
        return cls(path, wconn, rconn, head, operations, clock, high, tuple(restored))

    # -- appending ------------------------------------------------------------

    async def append(
        self,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
        after: tuple[int, ...] = (),
    ) -> Event:
        """Append one event; return it once its commit is durable.

        ``writer`` is the service the journal service identified by the peer's
        credentials.  The payload must not hold protected values (callers
        strip them); it is capped at `MAX_PAYLOAD_BYTES` of canonical JSON.
        ``after``: marks (from `parse_marks`) that must be committed with or
        before it, else it fails with ``audit_unavailable``.
        """
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.after = after
        future = item.future
        assert future is not None
        self._submit(item)
        event = await future
        assert event is not None  # only a claimed append can come back empty
        return event

    async def append_claimed(
        self,
        key: str,
        window_seconds: float,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
    ) -> Event | None:
        """`claim_request_id` and `append` in one transaction: the event, or None if the key was held."""
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.claim = self._claim_item(key, window_seconds)
        future = item.future
        assert future is not None
        self._submit(item)
        return await future

    def append_deferred(
        self,
        *,
        writer: str,
        kind: str,
        request_id: str | None = None,
        operation_id: str | None = None,
        peer_uid: int | None = None,
        session: str | None = None,
        payload: dict[str, Any],
        claim: tuple[str, float] | None = None,
        after: tuple[int, ...] = (),
    ) -> str | None:
        """Queue one event without waiting for its commit; return its mark.

        It is durable once a later durable commit that names the mark in
        ``after`` has returned.  With ``claim`` (key, window) the request ID
        is claimed first, at once: None if it is held (by a committed claim
        or by one still queued), and nothing is queued.
        """
        item = self._append_item(writer, kind, request_id, operation_id, peer_uid, session, payload)
        item.future = None
        item.after = after  # checked like a durable append's: if one failed, this is not written (its mark fails)
        if claim is not None:
            item.claim = self._claim_item(*claim)
            if not self._claim_free(item.claim):
                return None
        self._submit(item)
        if item.claim is not None:
            key = item.claim.key
            self._claims_queued[key] = self._claims_queued.get(key, 0) + 1
        return f"{self.boot}:{item.mark}"

    def _claim_free(self, claim: _Claim) -> bool:
        """Whether ``claim`` would win now: no queued claim of its key, no unexpired committed one."""
        if claim.key in self._claims_queued:
            return False
        with self._rlock:
            row = self._rconn.execute("SELECT expires FROM request_ids WHERE key = ?", (claim.key,)).fetchone()
        return row is None or float(row[0]) <= claim.now

    def parse_marks(self, marks: Any) -> tuple[int, ...]:
        """Marks as ``after`` takes them; a mark of another boot fails with ``audit_unavailable`` at once."""
        if marks is None:
            return ()
        if not isinstance(marks, list) or len(marks) > MAX_AFTER:
            raise _invalid(f"after must be a list of at most {MAX_AFTER} marks", "after")
        out = []
        for mark in marks:
            boot, _, number = mark.partition(":") if isinstance(mark, str) else ("", "", "")
            if not number.isdigit() or len(number) > 18 or not boot:
                raise _invalid("after: a mark is '<boot>:<number>'", "after")
            n = int(number)
            if boot != self.boot or n > self._issued or self._mark_failed(n):
                raise _lost()
            out.append(n)
        return tuple(out)

    def _mark_failed(self, n: int) -> bool:
        return n in self._failed_marks or n < self._failed_floor

    def _fail_mark(self, n: int) -> None:
        if len(self._failed_marks) >= MAX_FAILED_MARKS:
            self._failed_floor = max(self._failed_marks) + 1
            self._failed_marks.clear()
        self._failed_marks.add(n)

    async def sync(self, marks: Any) -> list[str]:
        """The marks (of ``marks``) that are not durable: failed, or of another boot (their fate is unknown).

        Waits until everything queued before this call has been committed or failed.
        """
        if not isinstance(marks, list) or len(marks) > MAX_PAGE:
            raise _invalid(f"marks must be a list of at most {MAX_PAGE} marks", "marks")
        work = _Sync(asyncio.get_running_loop().create_future())
        self._submit(work)
        await work.future
        lost = []
        for mark in marks:
            try:
                self.parse_marks([mark])
            except AirlockError as exc:
                if exc.code is not ErrorCode.AUDIT_UNAVAILABLE:
                    raise
                lost.append(mark)
        return lost

    def _append_item(
        self,
        writer: str,
        kind: str,
        request_id: str | None,
        operation_id: str | None,
        peer_uid: int | None,
        session: str | None,
        payload: dict[str, Any],
    ) -> _Append:
        check_writer(writer, kind)
        normalized, text = _canonical_object("payload", payload, MAX_PAYLOAD_BYTES)
        return _Append(
            time=iso_utc(self._clock()),
            kind=kind,
            request_id=_optional_text("request_id", request_id),
            operation_id=_optional_text("operation_id", operation_id),
            peer_uid=_optional_uid(peer_uid),
            session=_optional_text("session", session),
            writer=writer,
            payload=normalized,
            payload_json=text,
            future=asyncio.get_running_loop().create_future(),
        )

    def refuse(self, reason: str) -> None:
        """Fail every later write closed with ``audit_unavailable`` (the chain did not check out)."""
        self._refusal = reason

    @property
    def refusal(self) -> str | None:
        return self._refusal

    def _submit(self, item: _Work) -> None:
        if self._refusal is not None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, self._refusal)
        if self._closing:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the audit journal is closing")
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._run_writer(), name="journal-writer")
        elif self._writer.done():
            # Cancelled from outside (say, its event loop ended): nobody would commit.
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the audit journal's writer has stopped")
        if isinstance(item, _Append):
            self._issued += 1
            item.mark = self._issued
        self._queue.put_nowait(item)
        if not _deferred(item):
            self._urgent.set()  # someone waits: the writer commits now

    async def _run_writer(self) -> None:
        loop = asyncio.get_running_loop()
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is None:
                break
            batch: list[_Work] = [first]
            stop = self._drain(batch)
            if not stop and all(_deferred(w) for w in batch):
                # Nobody waits for these: give the durable record that follows them
                # (exec.started, request.replied) a moment to share their commit.
                self._urgent.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._urgent.wait(), DEFER_LINGER)
                stop = self._drain(batch)
            await self._commit(loop, batch)

    def _drain(self, batch: list[_Work]) -> bool:
        """Move what is queued into ``batch`` (up to MAX_BATCH); True if the stop sentinel came."""
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return False
            if item is None:
                return True
            batch.append(item)
        return False

    async def _commit(self, loop: asyncio.AbstractEventLoop, batch: list[_Work]) -> None:
        batch = self._check_after(batch)
        if all(isinstance(w, _Sync) for w in batch):
            for work in batch:
                if isinstance(work, _Sync) and not work.future.done():
                    work.future.set_result(None)
            return
        try:
            events, claimed, head = await loop.run_in_executor(
                self._executor, self._write, batch, self._head, self._high
            )
        except (sqlite3.Error, OSError) as exc:
            self._failed += 1
            await self._reload_head(loop)
            self._failed_batch(batch, _unavailable(exc))
            return
        except Exception as exc:  # the writer must outlive any one batch; its callers get the error
            self._failed += 1
            await self._reload_head(loop)
            self._failed_batch(batch, exc)
            return
        self._head = head
        self._high = max(self._high, head[0])
        if self.on_records is not None:
            self.on_records([e for e in events if e is not None])
        if self.on_commit is not None:
            self.on_commit()
        self._transactions += 1
        self._largest_batch = max(self._largest_batch, len(batch))
        appended = iter(events)
        claims = iter(claimed)
        for work in batch:
            if isinstance(work, _Append):
                event = next(appended)
                self._appends += event is not None
                if work.future is None:
                    self._deferred_done(work, event is not None)
                elif not work.future.done():
                    work.future.set_result(event)
            elif isinstance(work, _Sync):
                if not work.future.done():
                    work.future.set_result(None)
            elif isinstance(work, _Claim):
                won = next(claims)
                if not work.future.done():
                    work.future.set_result(won)
            else:
                self._settles += 1
                self._ops.settle(work.entry)
                if not work.future.done():
                    work.future.set_result(None)

    def _check_after(self, batch: list[_Work]) -> list[_Work]:
        """Fail, before the transaction, the work whose ``after`` marks failed; return the rest.

        Runs after every earlier batch has been committed or failed, so each
        mark named is either settled by now or in this batch (FIFO).
        """
        if not any(isinstance(w, _Append | _Settle) and w.after for w in batch):
            return batch
        kept: list[_Work] = []
        for work in batch:
            if isinstance(work, _Append | _Settle) and any(self._mark_failed(n) for n in work.after):
                if isinstance(work, _Append) and work.future is None:
                    self._deferred_done(work, False)
                elif work.future is not None:
                    _fail(work.future, _lost())
                continue
            kept.append(work)
        return kept

    def _deferred_done(self, work: _Append, written: bool) -> None:
        if not written:
            self._fail_mark(work.mark)
        if work.claim is not None:
            key = work.claim.key
            left = self._claims_queued.get(key, 0) - 1
            if left > 0:
                self._claims_queued[key] = left
            else:
                self._claims_queued.pop(key, None)

    def _failed_batch(self, batch: list[_Work], exc: BaseException) -> None:
        for work in batch:
            if isinstance(work, _Append) and work.future is None:
                self._deferred_done(work, False)
            elif isinstance(work, _Sync):
                if not work.future.done():
                    work.future.set_result(None)  # a barrier: the marks before it are settled (failed)
            elif work.future is not None:
                _fail(work.future, exc)

    async def _reload_head(self, loop: asyncio.AbstractEventLoop) -> None:
        """After a failed transaction the database, not memory, says where the chain is."""
        try:
            self._head, self._high = await loop.run_in_executor(self._executor, self._locked_head)
        except sqlite3.Error:
            pass  # the head was never advanced past the last commit, so it is still right

    def _locked_head(self) -> tuple[tuple[int, str], int]:
        with self._wlock:
            return _read_head(self._wconn), _read_high(self._wconn)

    def _write(
        self, batch: list[_Work], head: tuple[int, str], high: int
    ) -> tuple[list[Event | None], list[bool], tuple[int, str]]:
        """Runs on the writer thread: chain the batch and commit it as one transaction.

        Returns the new events, the outcome of each claim in batch order, and the new head.
        Seqs continue above the high-water mark, never below: a deleted tail's
        numbers are not used again.
        """
        seq, prev = head
        top = max(seq, high)
        events: list[Event | None] = []
        rows: list[tuple[Any, ...]] = []
        settles: list[Settled] = [w.entry for w in batch if isinstance(w, _Settle)]
        claims: list[_Claim] = []
        for work in batch:
            if isinstance(work, _Claim):
                claims.append(work)
            elif isinstance(work, _Append) and work.claim is not None:
                claims.append(work.claim)
        with self._wlock:
            conn = self._wconn
            try:
                conn.execute("BEGIN IMMEDIATE")
                won = dict(zip((id(c) for c in claims), _claim_all(conn, claims), strict=True))
                for work in batch:
                    if not isinstance(work, _Append):
                        continue
                    if work.claim is not None and not won[id(work.claim)]:
                        events.append(None)  # its key was held: nothing is written for it
                        continue
                    top += 1
                    seq = top
                    record = {
                        "seq": seq,
                        "time": work.time,
                        "kind": work.kind,
                        "request_id": work.request_id,
                        "operation_id": work.operation_id,
                        "peer_uid": work.peer_uid,
                        "session": work.session,
                        "writer": work.writer,
                        "payload": work.payload,
                        "prev_hash": prev,
                    }
                    digest = chain.compute_hash_with(record, work.payload_json)  # one encoding of the payload
                    events.append(Event(seq, work.time, work.kind, work.request_id, work.operation_id, work.peer_uid,
                                        work.session, work.writer, work.payload, prev, digest))
                    rows.append((seq, work.time, work.kind, work.request_id, work.operation_id, work.peer_uid,
                                 work.session, work.writer, work.payload_json, prev, digest))
                    prev = digest
                if rows:
                    conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
                    _raise_high(conn, seq)
                if settles:
                    conn.executemany(
                        "INSERT OR REPLACE INTO operations (operation_id, digest, outcome, completed_at) VALUES (?,?,?,?)",
                        [(s.operation_id, s.digest, s.outcome_json, s.completed_at) for s in settles],
                    )
                    _prune_operations(conn, self._ops.expiry_cutoff(), self._ops.capacity)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite already rolled back (e.g. after SQLITE_FULL)
                raise
        claimed = [won[id(w)] for w in batch if isinstance(w, _Claim)]
        return events, claimed, (seq, prev)

    # -- operations -----------------------------------------------------------

    async def op_begin(self, operation_id: str, digest: str, *, has_protected: bool = False) -> OpBegin:
        """new (now active) | replay (the settled outcome) | raise conflict / in progress /
        protected redelivery forbidden.  Active state is memory only (reference/001)."""
        return self._ops.begin(operation_id, digest, has_protected=has_protected)

    async def op_complete(
        self, operation_id: str, digest: str, outcome: dict[str, Any], after: tuple[int, ...] = ()
    ) -> None:
        """Store a settled outcome durably and end the operation's active state.

        Completing an operation that is not active (say, begun before a journal
        restart) still stores it.  Completing it again with the same digest is
        a no-op; with another digest it is a conflict.  If the store cannot
        commit, the active state is cleared anyway and `audit_unavailable`
        raised: the outcome is then unknown to replay, as after a crash.
        """
        _, text = _canonical_object("outcome", outcome, MAX_OUTCOME_BYTES)
        if not self._ops.check_complete(operation_id, digest):
            self._ops.abandon(operation_id)
            return
        entry = Settled(operation_id, digest, text, self._clock())
        work = _Settle(entry, asyncio.get_running_loop().create_future(), after)
        try:
            self._submit(work)
            await work.future
        except AirlockError:
            self._ops.abandon(operation_id)
            raise

    async def op_abandon(self, operation_id: str) -> None:
        """End an operation that settled nothing (it never ran, or failed before settling)."""
        self._ops.abandon(check_id("operation_id", operation_id))

    async def claim_request_id(self, key: str, window_seconds: float) -> bool:
        """Claim ``key`` for ``window_seconds``: True if it was free (or its claim
        expired), False if it is still claimed.

        The check and the insert are one statement in a durable transaction of
        the writer, so the answer holds across restarts of intake and of the
        journal.  If the store cannot commit, raises ``audit_unavailable``:
        the caller must fail closed.
        """
        work = self._claim_item(key, window_seconds)
        self._submit(work)
        return await work.future

    def _claim_item(self, key: str, window_seconds: float) -> _Claim:
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_CLAIM_KEY_CHARS:
            raise _invalid(f"key must be a string of 1 to {MAX_CLAIM_KEY_CHARS} characters", "key")
        try:
            key.encode()
        except UnicodeEncodeError:
            raise _invalid("key is not valid Unicode", "key") from None
        if (
            isinstance(window_seconds, bool)
            or not isinstance(window_seconds, int | float)
            or not 0 < window_seconds <= MAX_CLAIM_WINDOW
        ):
            raise _invalid(f"window_seconds must be a number above 0 and at most {MAX_CLAIM_WINDOW:g}", "window_seconds")
        return _Claim(key, self._clock(), float(window_seconds), asyncio.get_running_loop().create_future())

    # -- reading --------------------------------------------------------------
    #
    # The readers below are synchronous and may take a while on a large
    # journal (verify): a service calls them with asyncio.to_thread.
    # Each is safe from any thread.

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the newest durable event; ``(0, GENESIS)`` when empty."""
        return self._head

    @property
    def stats(self) -> Stats:
        return Stats(self._transactions, self._appends, self._settles, self._failed, self._largest_batch)

    def events(
        self,
        *,
        after: int | None = None,
        tail: int | None = None,
        limit: int = 64,
        scope: dict[str, Any] | None = None,
    ) -> EventsPage:
        """One page of the events feed, oldest first (reference/004).

        - ``after=N``: events with seq > N (from the start when omitted), at
          most ``limit``.  ``next_cursor`` is the last seq returned when the
          page is full; otherwise everything up to ``latest`` has been seen and
          ``next_cursor`` is ``latest`` (so a scoped follower skips past events
          outside its scope).
        - ``tail=N``: the newest min(N, ``limit``) events; ``next_cursor`` is
          ``latest``.  ``tail=0`` just returns the cursor to follow from now.
          **``tail`` wins over ``after`` when both are given.**
        - ``scope``: any of ``request_id``, ``operation_id``, ``session``
          (strings) and ``peer_uid`` (integer); several keys must all match.
        - ``latest`` is the newest seq in the whole journal, read in the same
          snapshot as the page.

        Poll with ``after=next_cursor`` to follow.  No per-client state.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise _invalid(f"limit must be an integer from 1 to {MAX_PAGE}", "limit")
        if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or not 0 <= tail <= MAX_PAGE):
            raise _invalid(f"tail must be an integer from 0 to {MAX_PAGE}", "tail")
        if after is not None and (isinstance(after, bool) or not isinstance(after, int) or after < 0):
            raise _invalid("after must be a non-negative integer", "after")
        where, params = _scope_sql(scope)
        with self._rlock:
            conn = self._rconn
            conn.execute("BEGIN")  # one snapshot for the page and `latest`
            try:
                latest = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0])
                if tail is not None:
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM events WHERE {where} ORDER BY seq DESC LIMIT ?",
                        (*params, min(tail, limit)),
                    ).fetchall()
                    rows.reverse()
                    cursor = latest
                else:
                    start = after or 0
                    rows = conn.execute(
                        f"SELECT {_COLUMNS} FROM events WHERE seq > ? AND {where} ORDER BY seq LIMIT ?",
                        (start, *params, limit),
                    ).fetchall()
                    cursor = rows[-1][0] if len(rows) == limit else max(start, latest)
            finally:
                conn.execute("COMMIT")
        return EventsPage([_event(row) for row in rows], cursor, latest)

    def verify(self, *, from_seq: int | None = None, anchor: str | None = None) -> VerifyResult:
        """Check the chain (all of it, or from ``from_seq``, optionally against an
        anchor hash kept off the host) and name the first bad record."""
        if from_seq is not None and (isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1):
            raise _invalid("from_seq must be a positive integer", "from_seq")
        if anchor is not None and (from_seq is None or not chain.is_hash(anchor)):
            raise _invalid("anchor must be 64 lowercase hex digits and needs from_seq", "anchor")
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            return _verify_chain(conn, from_seq, anchor)
        finally:
            conn.close()

    def audit(
        self,
        anchors: Iterable[Anchor] | None = None,
        *,
        from_seq: int | None = None,
        anchor: str | None = None,
        check_chain: bool = True,
    ) -> dict[str, Any]:
        """`verify` and, with ``anchors``, `chain.check_anchors`, from one snapshot.

        The answer of the ``verify`` verb: ``ok``, ``first_bad_seq`` and
        ``reason`` over both checks (the lowest bad seq wins), ``chain`` and
        ``anchors`` apart, the high-water mark and the segments begun by
        acknowledgements.  ``check_chain=False`` skips the chain walk (for a
        second batch of anchors).
        """
        if from_seq is not None and (isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 1):
            raise _invalid("from_seq must be a positive integer", "from_seq")
        if anchor is not None and (from_seq is None or not chain.is_hash(anchor)):
            raise _invalid("anchor must be 64 lowercase hex digits and needs from_seq", "anchor")
        given = list(anchors or ())
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            walked = _verify_chain(conn, from_seq, anchor) if check_chain else None
            facts = _facts(conn, [a.seq for a in given])
        finally:
            conn.close()
        checked = chain.check_anchors(
            given, stored=facts.stored, head_seq=facts.head[0], high_water=facts.high,
            acks={seq: h for seq, (h, _) in facts.acks.items()}, before=facts.before,
        )
        confirmed = {a.seq for a in given if a.ack and facts.acks.get(a.seq, ("",))[0] == a.hash}
        bad = [(r.first_bad_seq, r.reason) for r in (walked, checked) if r is not None and not r.ok]
        first = min(bad, key=lambda b: b[0] or 0) if bad else (None, None)
        return {
            "ok": not bad,
            "checked": walked.checked if walked is not None else 0,
            "first_bad_seq": first[0],
            "reason": first[1],
            "head_seq": facts.head[0],
            "head_hash": facts.head[1],
            "high_water": facts.high,
            "chain": walked.to_dict() if walked is not None else None,
            "anchors": checked.to_dict() | {"given": len(given)},
            "segments": [
                _segment(seq, h, payload, seq in confirmed) for seq, (h, payload) in sorted(facts.acks.items())
            ],
        }

    def check_tail(self, last: Anchor | None) -> chain.AnchorCheck:
        """The start-up check: the newest anchor still matches, and the chain links from it to the head.

        Cheap: reads only the records since ``last``.  Without an anchor only
        the high-water mark is checked.
        """
        conn = _reader(self.path)
        try:
            conn.execute("BEGIN")
            facts = _facts(conn, [last.seq] if last else [], acks=False)
            result = chain.check_anchors(
                [last] if last else [], stored=facts.stored, head_seq=facts.head[0], high_water=facts.high,
                acks={}, before=facts.before,
            )
            if result.ok and last is not None:
                walked = _verify_chain(conn, last.seq, last.hash)
                if not walked.ok:
                    return chain.AnchorCheck(False, 1, 0, walked.first_bad_seq, walked.reason)
            return result
        finally:
            conn.close()

    async def close(self) -> None:
        """Commit everything already queued, then close.  Later appends fail."""
        if self._closed:
            return
        self._closing = True
        if self._writer is not None:
            self._queue.put_nowait(None)
            self._urgent.set()
            if not self._writer.done():
                await self._writer
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._wconn.close)
        self._executor.shutdown(wait=True)
        with self._rlock:
            self._rconn.close()
        self._closed = True


# -- acknowledging a mismatch --------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acknowledged:
    """The acknowledgement record written, and the mismatch it acknowledged."""

    event: Event
    mismatch: chain.AnchorCheck


def acknowledge(
    path: Path,
    anchors: Iterable[Anchor],
    *,
    operator: str,
    uid: int,
    reason: str,
    clock: Callable[[], float] = time.time,
) -> Acknowledged:
    """Start a new chain segment over a mismatch with the anchors (the journal is stopped).

    One transaction: the whole chain is walked and compared with ``anchors``;
    if they disagree, a ``chain.acknowledged`` record is appended that links
    to the last record left (its ``prev_hash``), takes the seq above
    everything ever written or anchored, and records the old head, the
    high-water mark, the first contradiction, who acknowledged it and why.
    The caller writes its ack anchor.  Refused (``conflict``) when nothing
    disagrees, or when the chain is broken inside (an edited record is not a
    cut or a rewritten tail: it stays evident).
    """
    given = list(anchors)
    reason = validate_reason(reason)
    if not path.is_file():
        raise AirlockError(ErrorCode.NOT_FOUND, f"no audit journal at {path}", {"path": str(path)})
    conn = sqlite3.connect(path, isolation_level=None, timeout=10)
    try:
        conn.execute("PRAGMA synchronous=FULL")
        _migrate(conn)
        _restore_triggers(conn)
        conn.execute("BEGIN IMMEDIATE")
        try:
            walked = _verify_chain(conn, None, None)
            facts = _facts(conn, [a.seq for a in given])
            if not walked.ok:
                raise AirlockError(
                    ErrorCode.CONFLICT,
                    f"the chain is broken inside at seq {walked.first_bad_seq} ({walked.reason}); an "
                    "acknowledgement covers a cut or rewritten tail, not that: see docs/operations.md",
                    {"first_bad_seq": walked.first_bad_seq},
                )
            mismatch = chain.check_anchors(
                given, stored=facts.stored, head_seq=facts.head[0], high_water=facts.high,
                acks={seq: h for seq, (h, _) in facts.acks.items()}, before=facts.before,
            )
            if mismatch.ok:
                raise AirlockError(ErrorCode.CONFLICT, "nothing to acknowledge: the journal matches every anchor")
            head_seq, head_hash = facts.head
            seq = max([facts.high, head_seq, *(a.seq for a in given)]) + 1
            payload = {
                "previous": {"seq": head_seq, "hash": head_hash},
                "high_water": facts.high,
                "contradicted": {"first_bad_seq": mismatch.first_bad_seq, "reason": mismatch.reason},
                "operator": operator,
                "uid": uid,
                "reason": reason,
            }
            normalized, text = _canonical_object("payload", payload, MAX_PAYLOAD_BYTES)
            when = iso_utc(clock())
            record = {
                "seq": seq, "time": when, "kind": chain.ACK_KIND, "request_id": None,
                "operation_id": None, "peer_uid": uid, "session": None, "writer": "journal",
                "payload": normalized, "prev_hash": head_hash,
            }
            digest = chain.compute_hash(record)
            conn.execute(
                f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (seq, when, chain.ACK_KIND, None, None, uid, None, "journal", text, head_hash, digest),
            )
            _raise_high(conn, seq)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except sqlite3.Error as exc:
        raise _unavailable(exc) from exc
    finally:
        conn.close()
    event = Event(seq, when, chain.ACK_KIND, None, None, uid, None, "journal", normalized, head_hash, digest)
    return Acknowledged(event, mismatch)


def validate_reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 1024:
        raise _invalid("an acknowledgement needs a reason of 1 to 1024 characters", "reason")
    return reason


# -- helpers ----------------------------------------------------------------


def _create_private(path: Path) -> None:
    """Create the database file 0600 before SQLite does (SQLite gives its -wal
    and -shm files the main file's mode), and tighten an existing one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def _reader(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(
        path.resolve().as_uri() + "?mode=ro", uri=True, isolation_level=None, check_same_thread=False, timeout=10
    )
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    return conn


def _migrate(conn: sqlite3.Connection) -> None:
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version == SCHEMA_VERSION:
        return
    if version not in (0, 1, 2):
        raise sqlite3.DatabaseError(f"unknown journal schema version {version} (this airlock knows {SCHEMA_VERSION})")
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Version 0 is an empty file; version 1 lacks the request IDs; version 2 the high-water mark.
        script = (_SCHEMA if version == 0 else "") + (_SCHEMA_2 if version < 2 else "") + _SCHEMA_3
        for statement in _split_sql(script):
            conn.execute(statement)
        # The triggers this migration brings; any other missing one is
        # `_restore_triggers`'s to re-create, and to report.
        present = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        for name, sql in _TRIGGERS.items():
            if (version == 0 or name.startswith("chain_high_")) and name not in present:
                conn.execute(sql)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _verify_chain(conn: sqlite3.Connection, from_seq: int | None, anchor: str | None) -> VerifyResult:
    cursor = conn.execute(f"SELECT {_COLUMNS} FROM events WHERE seq >= ? ORDER BY seq", (from_seq or 1,))
    names = [d[0] for d in cursor.description]
    return chain.verify_rows((dict(zip(names, row, strict=True)) for row in cursor), from_seq=from_seq, anchor=anchor)


@dataclass(frozen=True, slots=True)
class _Facts:
    head: tuple[int, str]
    high: int
    stored: dict[int, str]  # seq -> hash, for the seqs asked about that exist
    before: dict[int, int]  # for the seqs asked about that do not: the newest seq below
    acks: dict[int, tuple[str, dict[str, Any]]]  # seq -> (hash, payload) of acknowledgements


def _facts(conn: sqlite3.Connection, seqs: Iterable[int], *, acks: bool = True) -> _Facts:
    wanted = sorted(set(seqs))
    stored: dict[int, str] = {}
    for start in range(0, len(wanted), 500):
        chunk = wanted[start:start + 500]
        marks = ",".join("?" * len(chunk))
        for seq, digest in conn.execute(f"SELECT seq, hash FROM events WHERE seq IN ({marks})", chunk):
            stored[int(seq)] = str(digest)
    before: dict[int, int] = {}
    for seq in wanted:
        if seq not in stored:
            row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE seq < ?", (seq,)).fetchone()
            before[seq] = int(row[0])
    found: dict[int, tuple[str, dict[str, Any]]] = {}
    if acks:
        for seq, digest, payload in conn.execute(
            "SELECT seq, hash, payload FROM events WHERE kind = ? ORDER BY seq", (chain.ACK_KIND,)
        ):
            try:
                data = json.loads(payload)
            except ValueError:
                data = {}
            found[int(seq)] = (str(digest), data if isinstance(data, dict) else {})
    return _Facts(_read_head(conn), _read_high(conn), stored, before, found)


def _segment(seq: int, digest: str, payload: dict[str, Any], confirmed: bool) -> dict[str, Any]:
    """What `audit verify` shows of one acknowledgement record."""
    found = payload.get("previous")
    previous: dict[str, Any] = found if isinstance(found, dict) else {}
    return {
        "seq": seq,
        "hash": digest,
        "confirmed": confirmed,
        "previous_seq": previous.get("seq"),
        "operator": payload.get("operator"),
        "reason": payload.get("reason"),
        "contradicted": payload.get("contradicted"),
    }


def _restore_triggers(conn: sqlite3.Connection) -> list[str]:
    """Re-create any of `_TRIGGERS` that someone dropped; return their names."""
    present = {str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
    missing = [name for name in _TRIGGERS if name not in present]
    if missing:
        conn.execute("BEGIN IMMEDIATE")
        try:
            for name in missing:
                conn.execute(_TRIGGERS[name])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    return missing


def _raise_high(conn: sqlite3.Connection, seq: int) -> None:
    conn.execute(
        "INSERT INTO chain_high (id, seq) VALUES (1, ?) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq "
        "WHERE excluded.seq > chain_high.seq",
        (seq,),
    )


def _read_high(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT seq FROM chain_high WHERE id = 1").fetchone()
    return 0 if row is None else int(row[0])


def _split_sql(script: str) -> list[str]:
    """Statements of a script (triggers hold ';' inside BEGIN … END)."""
    statements, current = [], ""
    for line in script.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            statements.append(current.strip())
            current = ""
    return [s for s in statements if s]


def _claim_all(conn: sqlite3.Connection, claims: list[_Claim]) -> list[bool]:
    """Inside the writer's transaction: each claim wins unless its key is held and unexpired.

    In batch order, so of two claims of one key in one batch only the first wins.
    """
    if not claims:
        return []
    # Expired claims are dead weight; the index makes this a short range scan.
    conn.execute("DELETE FROM request_ids WHERE expires <= ?", (min(c.now for c in claims),))
    outcome = []
    for claim in claims:
        cursor = conn.execute(
            "INSERT INTO request_ids (key, expires) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET expires = excluded.expires WHERE request_ids.expires <= ?",
            (claim.key, claim.now + claim.window, claim.now),
        )
        outcome.append(cursor.rowcount == 1)
    return outcome


def _read_head(conn: sqlite3.Connection) -> tuple[int, str]:
    row = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


def _read_operations(conn: sqlite3.Connection, cutoff: float) -> list[Settled]:
    rows = conn.execute(
        "SELECT operation_id, digest, outcome, completed_at FROM operations WHERE completed_at > ? ORDER BY ord",
        (cutoff,),
    ).fetchall()
    return [Settled(str(r[0]), str(r[1]), str(r[2]), float(r[3])) for r in rows]


def _prune_operations(conn: sqlite3.Connection, cutoff: float, capacity: int) -> None:
    conn.execute("DELETE FROM operations WHERE completed_at <= ?", (cutoff,))
    conn.execute(
        "DELETE FROM operations WHERE ord NOT IN (SELECT ord FROM operations ORDER BY ord DESC LIMIT ?)", (capacity,)
    )


def _event(row: tuple[Any, ...]) -> Event:
    payload = json.loads(row[8])
    return Event(row[0], row[1], row[2], row[3], row[4], row[5], row[6], row[7], payload, row[9], row[10])


def _canonical_object(name: str, value: object, cap: int) -> tuple[dict[str, Any], str]:
    """The object as it will be hashed and stored, and its canonical text.

    Round-tripping through canonical JSON means what is hashed now is exactly
    what `verify` will parse back later (tuples become lists, keys strings).
    """
    if not isinstance(value, dict):
        raise _invalid(f"{name} must be an object", name)
    try:
        data = canonical_json(value)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _invalid(f"{name} is not JSON-serialisable: {str(exc)[:200]}", name) from None
    if len(data) > cap:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"{name} is {len(data)} bytes of canonical JSON; the limit is {cap}",
            {"field": name, "limit_bytes": cap},
        )
    try:
        normalized = json.loads(data, parse_constant=reject_constant)
    except (ValueError, RecursionError):
        raise _invalid(f"{name} holds a value JSON cannot carry (NaN or infinity)", name) from None
    text = canonical_json(normalized).decode()
    return normalized, text


def _optional_text(name: str, value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise _invalid(f"{name} must be a string of 1 to {MAX_ID_CHARS} characters", name)
    try:
        value.encode()
    except UnicodeEncodeError:
        raise _invalid(f"{name} is not valid Unicode", name) from None
    return value


def _optional_uid(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UID:
        raise _invalid("peer_uid must be an integer from 0 to 2^32-1", "peer_uid")
    return value


def _scope_sql(scope: dict[str, Any] | None) -> tuple[str, tuple[Any, ...]]:
    if not scope:
        return "1", ()
    if not isinstance(scope, dict):
        raise _invalid("scope must be an object", "scope")
    clauses, params = [], []
    for key, value in sorted(scope.items()):
        kind = _SCOPES.get(key)
        if kind is None:
            raise _invalid(f"unknown scope {key!r} (use one of {', '.join(sorted(_SCOPES))})", "scope")
        if kind is int:
            _optional_uid(value)
            if value is None:
                raise _invalid("scope peer_uid must be an integer", "scope")
        elif _optional_text(f"scope {key}", value) is None:
            raise _invalid(f"scope {key} must be a string", "scope")
        clauses.append(f"{key} = ?")  # key is one of _SCOPES, never caller text
        params.append(value)
    return " AND ".join(clauses), tuple(params)


def _invalid(message: str, field: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, message, {"field": field})


def _unavailable(exc: BaseException) -> AirlockError:
    return AirlockError(ErrorCode.AUDIT_UNAVAILABLE, f"the audit journal could not commit: {str(exc)[:200]}")


def _deferred(work: _Work | None) -> bool:
    return isinstance(work, _Append) and work.future is None


def _lost() -> AirlockError:
    return AirlockError(
        ErrorCode.AUDIT_UNAVAILABLE,
        "an earlier record of this request was not committed (the journal restarted or could not write it)",
    )


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

"""The journal's group-commit writer: one queue, one writer task, one transaction per batch.

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

The writer's connection is used only on the writer thread (the lock
documents and enforces that).  The verbs that queue work (append, deferred
appends, sync, settles, claims) are in journal/appends.py; `Writer` is their
writer, and `Store` (journal/store.py) holds both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from airlock.common import log
from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal import rollover, transaction
from airlock.journal.operations import OperationTable
from airlock.journal.reads import Reader
from airlock.journal.records import Event, Stats, _unavailable
from airlock.journal.schema import _read_head, _read_high, _reader
from airlock.journal.workitems import _Append, _Claim, _deferred, _fail, _lost, _Settle, _Sync, _Work

# A batch this large already amortises the fsync; bigger ones only delay the
# first caller in it.
MAX_BATCH: Final = 1024
# Marks of failed deferred appends remembered; past it the oldest are
# forgotten and every mark below the newest forgotten one counts as failed.
MAX_FAILED_MARKS: Final = 65536
# After a rollover that could not start (the database open elsewhere), wait this long before trying again.
ROLL_RETRY_SECONDS: Final = 5.0
# How long a batch of deferred appends alone waits for a durable one to share
# its commit (an exec's path from request.received to exec.started takes a few
# ms); past it they are committed on their own.
DEFER_LINGER: Final = 0.1


class Writer:
    """`Store`'s writing half: everything that goes through the one queue and the one writer task."""

    def __init__(
        self,
        path: Path,
        wconn: sqlite3.Connection,
        reader: Reader,
        head: tuple[int, str],
        operations: OperationTable,
        clock: Callable[[], float],
        high_water: int = 0,
        segment: tuple[int | None, float | None] = (None, None),
        segment_max_bytes: int = 0,
        segment_max_age: float = 0.0,
    ) -> None:
        self.path = path
        self.reader = reader  # its connection is reopened on the new live file after a rollover
        # Segments (journal/segments.py): the live one's first seq and opening time, and when to seal it.
        self._segment_first, self._segment_opened = segment
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_age = segment_max_age
        self._roll_after = 0.0
        self._finish_pending = False
        # Called on the event loop after each rollover with its records (the journal anchors and applies retention).
        self.on_rollover: Callable[[list[Event]], None] | None = None
        self._wconn = wconn
        self._wlock = threading.Lock()
        self._head = head
        self._high = max(high_water, head[0])
        # Set by `Appends.refuse`: every later append, claim and settle fails closed.
        self.refused: str | None = None
        # Called on the event loop after each successful commit (the journal anchors from it).
        self.on_commit: Callable[[], None] | None = None
        # Called with every committed batch's events, before on_commit (journal/fleet.py ships them to journald).
        self.on_records: Callable[[list[Event]], None] | None = None
        self.ops = operations
        self.clock = clock
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
        self.issued = 0
        self._failed_marks: set[int] = set()
        self._failed_floor = 0
        # Keys of deferred claims queued and not yet committed or failed.
        self.claims_queued: dict[str, int] = {}
        # Set when work someone waits for is queued (or the store closes): a batch of
        # deferred appends alone waits for it up to DEFER_LINGER.
        self._urgent = asyncio.Event()

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the newest durable event; ``(0, GENESIS)`` when empty."""
        return self._head

    @property
    def stats(self) -> Stats:
        return Stats(self._transactions, self._appends, self._settles, self._failed, self._largest_batch)

    async def close(self) -> bool:
        """Commit everything already queued, then close the writer's connection (False: closed before)."""
        if self._closed:
            return False
        self._closing = True
        if self._writer is not None:
            self._queue.put_nowait(None)
            self._urgent.set()
            if not self._writer.done():
                await self._writer
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._wconn.close)
        self._executor.shutdown(wait=True)
        self._closed = True
        return True

    def mark_failed(self, n: int) -> bool:
        return n in self._failed_marks or n < self._failed_floor

    def _fail_mark(self, n: int) -> None:
        if len(self._failed_marks) >= MAX_FAILED_MARKS:
            self._failed_floor = max(self._failed_marks) + 1
            self._failed_marks.clear()
        self._failed_marks.add(n)

    def submit(self, item: _Work) -> None:
        if self.refused is not None:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, self.refused)
        if self._closing:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the audit journal is closing")
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._run_writer(), name="journal-writer")
        elif self._writer.done():
            # Cancelled from outside (say, its event loop ended): nobody would commit.
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "the audit journal's writer has stopped")
        if isinstance(item, _Append):
            self.issued += 1
            item.mark = self.issued
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
                    async with asyncio.timeout(DEFER_LINGER):  # not wait_for: no Task per batch (issue 50)
                        await self._urgent.wait()
                stop = self._drain(batch)
            await self._commit(loop, batch)
            if self._roll_due():
                await self._roll(loop)

    def _roll_due(self) -> bool:
        """Whether the live segment is past its size or age (checked between batches: a stat, no I/O wait)."""
        if self.refused is not None or time.monotonic() < self._roll_after:
            return False
        if self._finish_pending:
            return True
        if self._segment_first is None:  # the database was empty at open: it begins now
            if self._head[0] == 0:
                return False
            self._segment_first, self._segment_opened = self._head[0], self.clock()
        if self._head[0] <= self._segment_first:
            return False
        if self.segment_max_age > 0 and self._segment_opened is not None:
            if self.clock() - self._segment_opened >= self.segment_max_age:
                return True
        if self.segment_max_bytes > 0:
            # The database's own pages (committed, in the file or still in the WAL): the WAL file's size
            # says nothing once it has grown, as SQLite reuses it without shrinking it.
            with self.reader.lock:
                try:
                    pages = self.reader.conn.execute("PRAGMA page_count").fetchone()[0]
                    size = self.reader.conn.execute("PRAGMA page_size").fetchone()[0]
                except sqlite3.Error:
                    return False
            return int(pages) * int(size) >= self.segment_max_bytes
        return False

    async def _roll(self, loop: asyncio.AbstractEventLoop) -> None:
        """Seal the live segment and open the next, on the writer thread between two batches."""
        try:
            events = await loop.run_in_executor(self._executor, self._roll_locked)
        except (sqlite3.Error, OSError, ValueError) as exc:
            self._roll_after = time.monotonic() + ROLL_RETRY_SECONDS
            log.get().warning("journal.segment.rollover_failed", database=str(self.path), error=str(exc))
            await self._reload_head(loop)
            return
        self._transactions += 1
        if self.on_records is not None:
            self.on_records(events)
        if self.on_commit is not None:
            self.on_commit()
        if self.on_rollover is not None:
            self.on_rollover(events)

    def _roll_locked(self) -> list[Event]:
        # Readers wait on the lock: the store's read connection is closed (it would keep the file in
        # WAL mode) and opened again on the new live file.
        with self.reader.lock:
            self.reader.conn.close()
            try:
                with self._wlock:
                    try:
                        if self._finish_pending:
                            conn, events, head = rollover.finish(self.path, self._live_conn(), self.clock())
                        else:
                            conn, events, head = rollover.seal(
                                self.path, self._wconn, self._head, self._high, self.clock()
                            )
                    except BaseException:
                        # Sealed but not yet in place: nothing more is written until `finish` succeeds.
                        try:
                            self._finish_pending = rollover.seal_pending(self._live_conn())
                        except sqlite3.Error:
                            self._finish_pending = True
                        raise
                    self._finish_pending = False
                    self._wconn = conn
                    self._head = head
                    self._high = max(self._high, head[0])
                    self._segment_first = head[0]
                    self._segment_opened = self.clock()
            finally:
                self.reader.conn = _reader(self.path)
        return events

    def _live_conn(self) -> sqlite3.Connection:
        """The writer connection, opened again if a failed rollover closed it."""
        try:
            self._wconn.execute("SELECT 1")
        except sqlite3.ProgrammingError:
            self._wconn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10)
            self._wconn.execute("PRAGMA synchronous=FULL")
        return self._wconn

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
        if self._finish_pending and not await self._finish_first(loop, batch):
            return
        batch = self._check_after(batch)
        if all(isinstance(w, _Sync) for w in batch):
            for work in batch:
                if isinstance(work, _Sync) and not work.future.done():
                    work.future.set_result(None)
            return
        # Outcomes the replay table let go of (its owner's share was full) leave the database with this batch.
        settling = [w.entry for w in batch if isinstance(w, _Settle)]
        earlier = self.ops.take_evicted() if settling else []
        evicted = earlier + self.ops.planned_evictions(settling)
        try:
            events, claimed, head = await loop.run_in_executor(
                self._executor, self._write, batch, self._head, self._high, evicted
            )
        except (sqlite3.Error, OSError) as exc:
            self.ops.evicted.extend(earlier)  # the next settle deletes them (a restart's load trims them too)
            self._failed += 1
            await self._reload_head(loop)
            self._failed_batch(batch, _unavailable(exc))
            return
        except Exception as exc:  # the writer must outlive any one batch; its callers get the error
            self.ops.evicted.extend(earlier)
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
                self.ops.settle(work.entry)
                if not work.future.done():
                    work.future.set_result(None)

    async def _finish_first(self, loop: asyncio.AbstractEventLoop, batch: list[_Work]) -> bool:
        """A sealed segment not yet in place is finished before anything else is written; else the batch fails."""
        self._roll_after = 0.0
        await self._roll(loop)
        if not self._finish_pending:
            return True
        self._failed += 1
        self._failed_batch(batch, _unavailable(OSError("the journal is between two segments")))
        return False

    def _check_after(self, batch: list[_Work]) -> list[_Work]:
        """Fail, before the transaction, the work whose ``after`` marks failed; return the rest.

        Runs after every earlier batch has been committed or failed, so each
        mark named is either settled by now or in this batch (FIFO).
        """
        if not any(isinstance(w, _Append | _Settle) and w.after for w in batch):
            return batch
        kept: list[_Work] = []
        for work in batch:
            if isinstance(work, _Append | _Settle) and any(self.mark_failed(n) for n in work.after):
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
            left = self.claims_queued.get(key, 0) - 1
            if left > 0:
                self.claims_queued[key] = left
            else:
                self.claims_queued.pop(key, None)

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
        self, batch: list[_Work], head: tuple[int, str], high: int, evicted: list[str] | None = None
    ) -> tuple[list[Event | None], list[bool], tuple[int, str]]:
        """Runs on the writer thread: chain the batch and commit it as one transaction (journal/transaction.py)."""
        return transaction.write_batch(self._wconn, self._wlock, self.ops, batch, head, high, evicted)

"""The journal's durable store: hash-chained audit events and the replay store.

One SQLite database in WAL mode with ``synchronous=FULL``: a commit is on disk
when it returns.  Appends return only after their commit.

`Store` is the facade the journal service, the tests and the benchmarks use;
it is assembled from parts that each hold one idea:

- `journal/schema.py`: the tables, the migrations, the SQL helpers;
- `journal/records.py`: `Event` and the checks a payload passes;
- `journal/writer.py`: the group-commit writer (the queue, batches, the
  transaction, what a failure does to the marks);
- `journal/appends.py`: the write verbs (appends, deferred appends and their
  marks, settled operations, request-ID claims);
- `journal/reads.py`: the events feed, verification and anchor checks;
- `journal/acknowledge.py`: the offline acknowledgement of a cut tail.

Connections: the writer's connection is used only on the writer thread (the
lock documents and enforces that); reads use a second, read-only connection,
and ``verify`` opens its own so a long scan reads one consistent
snapshot without holding up ``events``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal import rollover, segments
from airlock.journal.acknowledge import Acknowledged, acknowledge, validate_reason
from airlock.journal.appends import Appends
from airlock.journal.chain import GENESIS, VerifyResult
from airlock.journal.operations import OpBegin, OperationTable
from airlock.journal.reads import Reader
from airlock.journal.records import MAX_OUTCOME_BYTES, MAX_PAGE, MAX_PAYLOAD_BYTES, Event, EventsPage, Stats
from airlock.journal.schema import (
    CACHE_KIB,
    SCHEMA_VERSION,
    _create_private,
    _migrate,
    _read_head,
    _read_high,
    _read_operations,
    _reader,
    _restore_triggers,
)
from airlock.journal.workitems import _Work
from airlock.journal.writer import DEFER_LINGER, MAX_BATCH

__all__ = [
    "DEFER_LINGER",
    "GENESIS",
    "MAX_BATCH",
    "MAX_OUTCOME_BYTES",
    "MAX_PAGE",
    "MAX_PAYLOAD_BYTES",
    "SCHEMA_VERSION",
    "Acknowledged",
    "Event",
    "EventsPage",
    "OpBegin",
    "Stats",
    "Store",
    "VerifyResult",
    "acknowledge",
    "validate_reason",
]


class Store(Appends, Reader):
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
        segment: tuple[int | None, float | None] = (None, None),
        segment_max_bytes: int = 0,
        segment_max_age: float = 0.0,
    ) -> None:
        self.path = path
        # Segments (journal/segments.py): the live one's first seq and opening time, and when to seal it.
        self._segment_first, self._segment_opened = segment
        self.archive_dir: Path | None = segments.default_archive_dir(path)
        self.segment_max_bytes = segment_max_bytes
        self.segment_max_age = segment_max_age
        self._roll_after = 0.0
        self._finish_pending = False
        # Called on the event loop after each rollover with its records (the journal anchors and applies retention).
        self.on_rollover: Callable[[list[Event]], None] | None = None
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
        # Called with (peer_uid, payload bytes) for every record taken (journal/quota.py charges the agent).
        self.meter: Callable[[int | None, int], None] | None = None
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
        operation_capacity_per_agent: int | None = None,
        clock: Callable[[], float] = time.time,
        segment_max_bytes: int = 0,
        segment_max_age: float = 0.0,
    ) -> Store:
        """Open (creating if needed) the database at ``path``, mode 0600.

        Raises `AirlockError(audit_unavailable)` if it cannot be opened or has
        a schema this version does not know.
        """
        path = Path(path)
        operations = OperationTable(
            retention=operation_retention,
            capacity=operation_capacity,
            clock=clock,
            per_owner=operation_capacity_per_agent,
        )
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
            if rollover.seal_pending(wconn):
                # A rollover a crash interrupted: finish it before anything else is written.
                wconn, _, _ = rollover.finish(path, wconn, clock())
            rollover.tighten(segments.segments_dir(path))
            for suffix in ("-wal", "-shm"):
                side = path.with_name(path.name + suffix)
                if side.exists():
                    os.chmod(side, 0o600)
            head = _read_head(wconn)
            high = _read_high(wconn)
            _, first, opened = rollover.live_segment(wconn)
            operations.load(_read_operations(wconn, operations.expiry_cutoff()))
            rconn = _reader(path)
        except (sqlite3.Error, OSError) as exc:
            for conn in (wconn, rconn):
                if conn is not None:
                    conn.close()
            raise AirlockError(
                ErrorCode.AUDIT_UNAVAILABLE, f"cannot open the audit journal {path}: {exc}", {"path": str(path)}
            ) from exc
        return cls(
            path,
            wconn,
            rconn,
            head,
            operations,
            clock,
            high,
            tuple(restored),
            (first, opened),
            segment_max_bytes,
            segment_max_age,
        )

    # -- state ----------------------------------------------------------------

    def head(self) -> tuple[int, str]:
        """(seq, hash) of the newest durable event; ``(0, GENESIS)`` when empty."""
        return self._head

    @property
    def stats(self) -> Stats:
        return Stats(self._transactions, self._appends, self._settles, self._failed, self._largest_batch)

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

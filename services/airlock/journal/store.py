"""The journal's durable store: hash-chained audit events and the replay store.

One SQLite database in WAL mode with ``synchronous=FULL``: a commit is on disk
when it returns.  Appends return only after their commit.

`Store` is the facade the journal service, the tests and the benchmarks use;
it holds parts that each own their state and hold one idea (no part
inherits from another; each gets what it uses when it is made):

- `journal/schema.py`: the tables, the migrations, the SQL helpers;
- `journal/records.py`: `Event` and the checks a payload passes;
- `journal/writer.py`: the group-commit writer (the queue, batches, what a
  failure does to the marks), `journal/transaction.py` its transaction;
- `journal/appends.py`: the write verbs (appends, deferred appends and their
  marks, settled operations, request-ID claims), handed to the writer;
- `journal/reads.py`: the events feed, verification and anchor checks;
- `journal/acknowledge.py`: the offline acknowledgement of a cut tail.

Connections: the writer's connection is used only on the writer thread (the
lock documents and enforces that); reads use a second, read-only connection,
and ``verify`` opens its own so a long scan reads one consistent
snapshot without holding up ``events``.
"""

from __future__ import annotations

import os
import sqlite3
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
from airlock.journal.writer import DEFER_LINGER, MAX_BATCH, Writer

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


class Store:
    """The journal store.  Create with `Store.open`; async methods need one running loop.

    A facade over three parts that each own their state: ``reader`` (the
    read-only connection, the events feed, verification), ``writer`` (the
    queue, the writer thread, the chain head) and ``appends`` (the write
    verbs, handing work to ``writer``).  Its verbs are theirs.
    """

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
        # Triggers found missing at open and created again (for the service to report).
        self.restored_triggers = restored_triggers
        self.reader = Reader(path, rconn)
        self.writer = Writer(
            path, wconn, self.reader, head, operations, clock, high_water, segment, segment_max_bytes, segment_max_age
        )
        self.appends = Appends(self.writer, self.reader)
        # The verbs, as their parts define them.
        self.append = self.appends.append
        self.append_claimed = self.appends.append_claimed
        self.append_deferred = self.appends.append_deferred
        self.parse_marks = self.appends.parse_marks
        self.sync = self.appends.sync
        self.refuse = self.appends.refuse
        self.op_begin = self.appends.op_begin
        self.op_room = self.appends.op_room
        self.op_complete = self.appends.op_complete
        self.op_abandon = self.appends.op_abandon
        self.claim_request_id = self.appends.claim_request_id
        self.events = self.reader.events
        self.verify = self.reader.verify
        self.audit = self.reader.audit
        self.check_tail = self.reader.check_tail
        self.sealed = self.reader.sealed
        self.hash_at = self.reader.hash_at
        self.verify_full = self.reader.verify_full
        self.head = self.writer.head

    # What the journal service plugs in: each goes to the part that calls it.

    @property
    def refusal(self) -> str | None:
        return self.writer.refused

    @property
    def boot(self) -> str:
        return self.writer.boot

    @property
    def archive_dir(self) -> Path | None:
        return self.reader.archive_dir

    @archive_dir.setter
    def archive_dir(self, value: Path | None) -> None:
        self.reader.archive_dir = value

    @property
    def meter(self) -> Callable[[int | None, int], None] | None:
        return self.appends.meter

    @meter.setter
    def meter(self, value: Callable[[int | None, int], None] | None) -> None:
        self.appends.meter = value

    @property
    def on_commit(self) -> Callable[[], None] | None:
        return self.writer.on_commit

    @on_commit.setter
    def on_commit(self, value: Callable[[], None] | None) -> None:
        self.writer.on_commit = value

    @property
    def on_records(self) -> Callable[[list[Event]], None] | None:
        return self.writer.on_records

    @on_records.setter
    def on_records(self, value: Callable[[list[Event]], None] | None) -> None:
        self.writer.on_records = value

    @property
    def on_rollover(self) -> Callable[[list[Event]], None] | None:
        return self.writer.on_rollover

    @on_rollover.setter
    def on_rollover(self, value: Callable[[list[Event]], None] | None) -> None:
        self.writer.on_rollover = value

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

    @property
    def stats(self) -> Stats:
        return self.writer.stats

    async def close(self) -> None:
        """Commit everything already queued, then close.  Later appends fail."""
        if await self.writer.close():
            with self.reader.lock:
                self.reader.conn.close()

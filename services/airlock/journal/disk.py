"""The journal's disk: its size, its filesystem's free space, how fast it grows, and a warning before it fills.

A full filesystem makes the journal fail closed (nothing runs without its
record); this is the warning well before that.  `measure` is what ``airlock
status`` shows: the journal's bytes (the database with its -wal and -shm
files), the current segment (the database file itself until segments
exist), free and total space where it lives, the rate it grew at over the
last day and the days left at that rate.  The rate comes from the journal's
own records -- how many were written in the last 24 hours (at least the last
hour's worth, or since the first record when it is younger) times the
average bytes a record takes on disk -- so it survives restarts.

`DiskWatch` runs in airlock-journal: every ``journal.disk_check_seconds`` it
measures and, under a threshold (``journal.disk_warn_percent`` or
``journal.disk_warn_bytes``), logs ``journal.disk.low`` with its own
MESSAGE_ID (units/airlock.catalog), again at most every
``journal.disk_warn_every_seconds`` while it stays low, and
``journal.disk.recovered`` once when space returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from airlock.common import log
from airlock.common.codec import iso_utc
from airlock.common.kinds import NOTICES
from airlock.journal.schema import _reader

DAY: Final = 86_400.0
# A rate measured over less than this is not extrapolated to a day.
MIN_WINDOW: Final = 3_600.0


@dataclass(frozen=True, slots=True)
class Disk:
    """One measurement (what ``airlock status`` shows under the journal)."""

    database: str
    segment: str  # the file records are written to now
    journal_bytes: int
    filesystem_bytes: int
    free_bytes: int
    free_percent: float
    records: int
    bytes_per_day: float | None  # None: too little history to tell
    rate_window_seconds: float
    days_left: float | None  # None: not growing, or rate unknown
    low: bool
    warn_percent: float
    warn_bytes: int
    measured: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def journal_bytes(database: Path, *, sealed: bool = True) -> int:
    """The database and its -wal and -shm files and (``sealed``) the sealed segments beside it
    (journal/segments.py), as they take space on disk (an archive elsewhere is its own filesystem's affair)."""
    total = 0
    segments = sorted(database.with_name("segments").glob("journal-*.db")) if sealed else []
    for path in (
        database,
        database.with_name(database.name + "-wal"),
        database.with_name(database.name + "-shm"),
        *segments,
    ):
        try:
            total += os.stat(path).st_blocks * 512
        except OSError:
            continue
    return total


def _records_since(conn: sqlite3.Connection, since: str) -> tuple[int, int, str | None]:
    """(records with time >= since, all records, the oldest record's time): a binary search over seq (times rise
    with seq), so a few primary-key reads however long the journal."""
    row = conn.execute("SELECT MIN(seq), MAX(seq) FROM events").fetchone()
    if row is None or row[0] is None:
        return 0, 0, None
    low, high = int(row[0]), int(row[1])
    total = high - low + 1  # seqs skip only at an acknowledged cut: near enough for a rate
    first = conn.execute("SELECT time FROM events WHERE seq >= ? ORDER BY seq LIMIT 1", (low,)).fetchone()
    lo, hi = low, high + 1  # the first seq whose record is at or after `since`
    while lo < hi:
        mid = (lo + hi) // 2
        found = conn.execute("SELECT seq, time FROM events WHERE seq >= ? ORDER BY seq LIMIT 1", (mid,)).fetchone()
        if found is None or str(found[1]) >= since:
            hi = mid
        else:
            lo = int(found[0]) + 1
    return max(0, high - lo + 1), total, str(first[0]) if first else None


def measure(database: Path, warn_percent: float, warn_bytes: int, now: float | None = None) -> Disk:
    """Measure once (blocking: statvfs and a few SQLite reads)."""
    now = time.time() if now is None else now
    st = os.statvfs(database.parent)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    percent = 100.0 * free / total if total else 0.0
    size = journal_bytes(database)
    recent = records = 0
    window = 0.0
    try:
        conn = _reader(database)
        try:
            conn.execute("BEGIN")
            recent, records, oldest = _records_since(conn, iso_utc(now - DAY))
        finally:
            conn.close()
        if oldest is not None:
            window = min(DAY, max(0.0, now - _parse(oldest)))
    except (sqlite3.Error, ValueError):
        recent = records = 0
    rate: float | None = None
    if records and window >= MIN_WINDOW:
        # Bytes a record takes, from the live segment (whose records were counted).
        rate = recent * (journal_bytes(database, sealed=False) / records) * DAY / window
    days = free / rate if rate else None
    low = (warn_percent > 0 and percent < warn_percent) or (warn_bytes > 0 and free < warn_bytes)
    return Disk(
        database=str(database),
        segment=str(database),
        journal_bytes=size,
        filesystem_bytes=total,
        free_bytes=free,
        free_percent=round(percent, 2),
        records=records,
        bytes_per_day=round(rate) if rate is not None else None,
        rate_window_seconds=round(window),
        days_left=round(days, 1) if days is not None else None,
        low=low,
        warn_percent=warn_percent,
        warn_bytes=warn_bytes,
        measured=iso_utc(now),
    )


def _parse(moment: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(moment.replace("Z", "+00:00")).timestamp()


class DiskWatch:
    """Measures every ``every`` seconds and warns in journald while space is low (at most every ``repeat``)."""

    def __init__(
        self,
        database: Path,
        *,
        warn_percent: float,
        warn_bytes: int,
        every: float,
        repeat: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.database = database
        self.warn_percent = warn_percent
        self.warn_bytes = warn_bytes
        self.every = every
        self.repeat = repeat
        self.clock = clock
        self.last: Disk | None = None
        self.warned_at: float | None = None  # monotonic time of the last warning while low; None: not low
        self._task: asyncio.Task[None] | None = None

    async def check(self) -> Disk:
        disk = await asyncio.to_thread(measure, self.database, self.warn_percent, self.warn_bytes)
        self.observe(disk)
        return disk

    def observe(self, disk: Disk) -> None:
        """Log what this measurement calls for: a warning (bounded rate) while low, one notice when it clears."""
        self.last = disk
        logger = log.get()
        fields = {
            "database": disk.database,
            "free_bytes": disk.free_bytes,
            "free_percent": disk.free_percent,
            "filesystem_bytes": disk.filesystem_bytes,
            "journal_bytes": disk.journal_bytes,
            "bytes_per_day": disk.bytes_per_day,
            "days_left": disk.days_left,
            "warn_percent": disk.warn_percent,
            "warn_bytes": disk.warn_bytes,
        }
        now = self.clock()
        if disk.low:
            if self.warned_at is None or now - self.warned_at >= self.repeat:
                self.warned_at = now
                logger.warning("journal.disk.low", message_id=NOTICES["journal.disk.low"], **fields)
        elif self.warned_at is not None:
            self.warned_at = None
            logger.info("journal.disk.recovered", message_id=NOTICES["journal.disk.recovered"], **fields)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.check()
            except OSError as exc:  # the filesystem is gone or unreadable: say so, keep watching
                log.get().error("journal.disk.unmeasured", database=str(self.database), error=str(exc))
            await asyncio.sleep(self.every)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

"""journal/disk.py: the growth rate from the journal's own records, and the warning's bounded repetition."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from airlock.common import log
from airlock.journal import disk
from airlock.journal.store import Store

HOUR = 3600.0
T0 = 1_800_000_000.0


def _journal(path: Path, times: list[float]) -> None:
    now = [T0]

    async def fill() -> None:
        store = Store.open(path, clock=lambda: now[0])
        try:
            for t in times:
                now[0] = t
                await store.append(writer="runner", kind="exec.finished", payload={"pad": "x" * 200})
        finally:
            await store.close()

    asyncio.run(fill())


def test_rate_counts_the_last_day_of_records(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    # 100 records two days ago, then 300 in the last day: only those 300 count.
    _journal(path, [T0 - 2 * 86_400 + i for i in range(100)] + [T0 - 20 * HOUR + 60 * i for i in range(300)])
    found = disk.measure(path, 0, 0, now=T0)
    assert found.records == 400 and found.rate_window_seconds == 86_400
    per_record = found.journal_bytes / 400
    assert found.bytes_per_day == pytest.approx(300 * per_record, rel=0.01)
    assert found.bytes_per_day is not None
    assert found.days_left == pytest.approx(found.free_bytes / found.bytes_per_day, rel=0.01)
    assert found.low is False and found.segment == str(path)


def test_a_young_journal_has_no_rate_yet(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _journal(path, [T0 - 60 + i for i in range(10)])  # one minute of records: not extrapolated to a day
    found = disk.measure(path, 0, 0, now=T0)
    assert found.bytes_per_day is None and found.days_left is None


def test_thresholds(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _journal(path, [T0])
    assert disk.measure(path, 100.0, 0, now=T0).low is True  # under 100 % free: always
    assert disk.measure(path, 0, 1 << 62, now=T0).low is True
    assert disk.measure(path, 0, 0, now=T0).low is False  # both off


def test_warning_repeats_at_a_bounded_rate_and_clears_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    said: list[tuple[str, dict[str, Any]]] = []

    class Logger:
        def warning(self, event: str, **fields: Any) -> None:
            said.append((event, fields))

        info = warning

    monkeypatch.setattr(log, "get", lambda: Logger())
    clock = [0.0]
    watch = disk.DiskWatch(tmp_path / "j", warn_percent=10, warn_bytes=0, every=1, repeat=60, clock=lambda: clock[0])
    low = disk.Disk(str(tmp_path), str(tmp_path), 1, 100, 5, 5.0, 1, None, 0, None, True, 10, 0, "t")
    ok = disk.Disk(str(tmp_path), str(tmp_path), 1, 100, 50, 50.0, 1, None, 0, None, False, 10, 0, "t")
    for t in (0, 1, 30, 59, 60, 61, 119, 120):
        clock[0] = t
        watch.observe(low)
    assert [e for e, _ in said] == ["journal.disk.low"] * 3  # at 0, 60 and 120
    watch.observe(ok)
    watch.observe(ok)
    assert [e for e, _ in said][3:] == ["journal.disk.recovered"]
    clock[0] = 121
    watch.observe(low)  # low again: warned at once
    assert said[-1][0] == "journal.disk.low" and said[-1][1]["free_percent"] == 5.0

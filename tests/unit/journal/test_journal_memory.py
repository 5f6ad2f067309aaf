"""The journal's memory figures and trim (issue 21)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from airlock.journal import memory


def test_sqlite_figures_are_the_loaded_librarys(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    try:
        conn.execute("CREATE TABLE t (x)")
        conn.executemany("INSERT INTO t VALUES (?)", [("x" * 1000,)] * 200)
        status = memory.sqlite_status()
        assert status["memory_used"] and status["memory_used"] > 0  # the same library _sqlite3 uses
        assert status["malloc_count"] and status["malloc_count"] > 0
    finally:
        conn.close()


def test_trim_gives_freed_heap_back(tmp_path: Path) -> None:
    assert memory.trim() is True  # glibc (Debian): malloc_trim exists
    rss = memory.rss_kib()
    assert rss["VmRSS"] >= rss["RssAnon"] > 0

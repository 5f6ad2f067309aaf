"""Journal append throughput: Store with 1 and 32 concurrent writers beside bare SQLite.

The bare baseline is what the journal would cost without group commit: one
row per transaction, with the same durability (WAL, synchronous=FULL), so one
fsync per event.  All three are measured in the same run, on the same
filesystem, so the ratios mean something even when absolute numbers do not.

    .venv/bin/python bench/journal_bench.py [--count N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from airlock.common.codec import canonical_json
from airlock.journal.store import Store


@dataclass(frozen=True, slots=True)
class Result:
    name: str
    appends: int
    seconds: float
    transactions: int

    @property
    def rate(self) -> float:
        return self.appends / self.seconds


def payload(i: int) -> dict[str, object]:
    return {
        "argv": ["systemctl", "restart", "nginx"],
        "exit_code": 0,
        "duration_ms": 412 + i % 100,
        "stdout": {"bytes": 1843, "sha256": hashlib.sha256(str(i).encode()).hexdigest()},
    }


def bare_sqlite(path: Path, count: int) -> Result:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(
        "CREATE TABLE events (seq INTEGER PRIMARY KEY, time TEXT, kind TEXT, request_id TEXT, "
        "payload TEXT, prev_hash TEXT, hash TEXT)"
    )
    prev = "0" * 64
    start = time.perf_counter()
    for i in range(1, count + 1):
        body = canonical_json(payload(i))
        digest = hashlib.sha256(bytes.fromhex(prev) + body).hexdigest()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO events VALUES (?,?,?,?,?,?,?)",
            (i, "2026-01-01T00:00:00.000Z", "exec.finished", f"r{i}", body.decode(), prev, digest),
        )
        conn.execute("COMMIT")
        prev = digest
    seconds = time.perf_counter() - start
    conn.close()
    return Result("bare SQLite, 1 commit/row", count, seconds, count)


async def through_store(path: Path, count: int, writers: int) -> Result:
    store = Store.open(path)
    per_writer = [count // writers + (1 if w < count % writers else 0) for w in range(writers)]

    async def writer(w: int, n: int) -> None:
        for i in range(n):
            await store.append(writer="runner", kind="exec.finished", request_id=f"w{w}-{i}", payload=payload(i))

    try:
        start = time.perf_counter()
        await asyncio.gather(*(writer(w, n) for w, n in enumerate(per_writer)))
        seconds = time.perf_counter() - start
        stats = store.stats
        if not store.verify().ok:
            raise SystemExit("chain did not verify after the run")
    finally:
        await store.close()
    label = "writer" if writers == 1 else "writers"
    return Result(f"Store, {writers} concurrent {label}", count, seconds, stats.transactions)


def measure(count: int, directory: Path | None = None) -> list[Result]:
    """Bare SQLite, the Store with one writer and with 32, in that order, in one temp dir."""
    with tempfile.TemporaryDirectory(dir=directory, prefix="journal-bench-") as tmp:
        root = Path(tmp)
        return [
            bare_sqlite(root / "bare.db", count),
            asyncio.run(through_store(root / "one.db", count, 1)),
            asyncio.run(through_store(root / "many.db", count, 32)),
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--count", type=int, default=2000, help="appends per measurement (default 2000)")
    parser.add_argument("--dir", type=Path, default=None, help="where the databases go (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error("--count must be positive")
    results = measure(args.count, args.dir)
    base = results[0].rate
    where = args.dir or Path(tempfile.gettempdir())
    print(f"journal append throughput, {args.count} appends each, databases in {where}")
    print(f"{'mode':<34} {'seconds':>8} {'appends/s':>10} {'transactions':>12} {'vs bare':>8}")
    for r in results:
        print(f"{r.name:<34} {r.seconds:>8.3f} {r.rate:>10.0f} {r.transactions:>12} {r.rate / base:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

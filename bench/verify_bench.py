"""Chain verification speed: a full walk in records/s, and an incremental verify of a day's records.

Builds a journal database of ``--records`` records shaped like a dev stack's
(six records per exec: request, decision, exec start and end, reply, with
the spec, argv, environment digest and output summaries in the payloads),
chained exactly as the journal chains them, then times:

- the full walk as ``airlock audit verify --full`` runs it (`Reader.verify`:
  SQLite in batches, `chain.verify_stored`), beside the reference
  (`chain.verify_rows` over one dict per row, what verify ran before issue 38);
- an incremental verify (`Reader.audit` from the last verified point, as
  ``airlock audit verify`` runs it) over ``--day`` new records.

    .venv/bin/python bench/verify_bench.py [--records N] [--day N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airlock.common.codec import canonical_json
from airlock.journal import chain
from airlock.journal.chain import GENESIS, Anchor
from airlock.journal.schema import _COLUMNS
from airlock.journal.store import Store
from airlock.journal.verification import VERIFIED_KIND


def _story(i: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The records of one exec of ``true``, roughly as a dev stack writes them: (kind, writer, payload)."""
    digest = hashlib.sha256(str(i).encode()).hexdigest()
    spec = {
        "argv": ["/usr/bin/true"],
        "cwd": "/home/agent/project",
        "env": {"LANG": "C.UTF-8", "PATH": "/usr/local/bin:/usr/bin:/bin"},
        "privileged": True,
        "run_as": "root",
        "stdin": None,
        "timeout_seconds": 30,
    }
    return [
        ("request.received", "intake", {"verb": "exec", "spec": spec, "digest": digest, "peer": {"uid": 1000}}),
        ("approval.decided", "approval", {"decision": "allow", "by": "policy", "rule": "bench-true", "spec": spec}),
        ("exec.started", "runner", {"pid": 10_000 + i % 50_000, "spec": spec, "digest": digest, "cgroup": "x"}),
        ("exec.finished", "runner", {"exit_code": 0, "duration_ms": 3 + i % 7, "stdout": {"bytes": 0}, "signal": None}),
        ("request.replied", "intake", {"ok": True, "exit_code": 0, "duration_ms": 5 + i % 11}),
        ("operation.completed", "intake", {"state": "completed", "digest": digest}),
    ]


def rows(start_seq: int, prev: str, count: int) -> Iterator[tuple[Any, ...]]:
    """``count`` chained rows in `schema._COLUMNS` order, from ``start_seq`` after ``prev``."""
    seq = start_seq
    i = start_seq // 6
    while seq < start_seq + count:
        for kind, writer, payload in _story(i):
            if seq >= start_seq + count:
                break
            record = {
                "seq": seq,
                "time": f"2026-12-03T{(seq // 3600) % 24:02d}:{(seq // 60) % 60:02d}:{seq % 60:02d}.{seq % 1000:03d}Z",
                "kind": kind,
                "request_id": f"req-{i:08d}",
                "operation_id": f"op-{i:08d}-{hashlib.sha256(str(i).encode()).hexdigest()[:12]}",
                "peer_uid": 1000,
                "session": f"sess-{i // 100:06d}",
                "writer": writer,
                "payload": payload,
                "prev_hash": prev,
            }
            digest = chain.compute_hash(record)
            yield (
                *(record[name] for name in chain.RECORD_FIELDS[:8]),
                canonical_json(payload).decode(),
                prev,
                digest,
            )
            prev = digest
            seq += 1
        i += 1


def build(path: Path, count: int, start_seq: int = 1, prev: str = GENESIS) -> tuple[int, str]:
    """Append ``count`` records to the journal database at ``path`` (created as the journal creates it)."""
    return _insert(path, rows(start_seq, prev, count), (start_seq - 1, prev))


def record_verified(path: Path, head: tuple[int, str]) -> tuple[int, str]:
    """The journal's ``chain.verified`` record naming ``head``, appended after it; its own (seq, hash)."""
    seq, prev = head[0] + 1, head[1]
    record = {
        "seq": seq,
        "time": "2026-12-03T23:59:59.000Z",
        "kind": VERIFIED_KIND,
        "request_id": None,
        "operation_id": None,
        "peer_uid": None,
        "session": None,
        "writer": "journal",
        "payload": {"seq": head[0], "hash": head[1], "checked": head[0], "mode": "full", "from_seq": 1},
        "prev_hash": prev,
    }
    digest = chain.compute_hash(record)
    row = (*(record[name] for name in chain.RECORD_FIELDS[:8]), canonical_json(record["payload"]).decode(), prev)
    return _insert(path, iter([(*row, digest)]), head)


def _insert(path: Path, new: Iterator[tuple[Any, ...]], head: tuple[int, str]) -> tuple[int, str]:
    if not path.exists():

        async def create() -> None:
            await Store.open(path).close()

        asyncio.run(create())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN")
    insert = f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)"  # noqa: S608
    batch: list[tuple[Any, ...]] = []
    for row in new:
        batch.append(row)
        head = (row[0], row[-1])
        if len(batch) == 10_000:
            conn.executemany(insert, batch)
            batch.clear()
    conn.executemany(insert, batch)
    conn.execute("UPDATE chain_high SET seq = ?", (head[0],))
    conn.execute("COMMIT")
    conn.close()
    return head


@dataclass(frozen=True, slots=True)
class Result:
    records: int
    full_seconds: float
    reference_seconds: float
    day: int
    incremental_seconds: float

    @property
    def full_rate(self) -> float:
        return self.records / self.full_seconds

    @property
    def reference_rate(self) -> float:
        return self.records / self.reference_seconds


def reference_walk(path: Path) -> chain.VerifyResult:
    """What verify ran before: one dict per row into `chain.verify_rows`."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        cursor = conn.execute(f"SELECT {_COLUMNS} FROM events ORDER BY seq")  # noqa: S608
        names = [d[0] for d in cursor.description]
        return chain.verify_rows(dict(zip(names, row, strict=True)) for row in cursor)
    finally:
        conn.close()


def measure(records: int, day: int, directory: Path | None = None, *, reference: bool = True) -> Result:
    """Full walk (and the reference's), then an incremental verify of ``day`` records after a verified point."""
    with tempfile.TemporaryDirectory(dir=directory, prefix="verify-bench-") as tmp:
        path = Path(tmp) / "journal.sqlite"
        head = build(path, records)
        store = asyncio.run(_open(path))
        started = time.perf_counter()
        full = store.verify()
        full_seconds = time.perf_counter() - started
        if not full.ok or full.checked != records:
            raise SystemExit(f"the full verify failed: {full}")
        reference_seconds = float("nan")
        if reference:
            started = time.perf_counter()
            ref = reference_walk(path)
            reference_seconds = time.perf_counter() - started
            if ref != full:
                raise SystemExit(f"the reference disagrees: {ref} != {full}")
        # A verified point at the head, anchored as the journal anchors it; then a day's records.
        mark = record_verified(path, head)
        build(path, day, mark[0] + 1, mark[1])
        started = time.perf_counter()
        result = store.audit([Anchor(*mark)], incremental=True)
        incremental_seconds = time.perf_counter() - started
        asyncio.run(store.close())
        if not result["ok"] or result["mode"] != "incremental" or result["checked"] != day + 2:
            raise SystemExit(f"the incremental verify failed or was not incremental: {result}")
        return Result(records, full_seconds, reference_seconds, day, incremental_seconds)


async def _open(path: Path) -> Store:
    return Store.open(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=200_000, help="records in the journal (default 200,000)")
    parser.add_argument("--day", type=int, default=60_000, help="new records for the incremental verify")
    parser.add_argument("--dir", type=Path, default=None, help="where the database goes (default: a temp dir)")
    args = parser.parse_args(argv)
    r = measure(args.records, args.day, args.dir)
    print(f"full verify: {r.records:,} records in {r.full_seconds:.2f} s = {r.full_rate:,.0f} records/s")
    print(f"reference:   {r.records:,} records in {r.reference_seconds:.2f} s = {r.reference_rate:,.0f} records/s")
    print(f"incremental: {r.day:,} new records in {r.incremental_seconds:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Soak (issue 38): a journal that seals many small segments under load loses nothing.

Two parts, so the whole stays within a few minutes on a small machine:

- **records**: ``AIRLOCK_SOAK_RECORDS`` (default 300,000) records from 64
  concurrent writers into a real store (SQLite, the group-commit writer) whose
  segments are sealed every ``AIRLOCK_SOAK_SEGMENT_BYTES`` (default 4 MiB);
  at the end every record is in exactly one file, every seq once, and the
  chain verifies across every segment (``verify --full``);
- **stack**: a live ``airlock dev up`` stack with 256 KiB segments takes
  ``AIRLOCK_STRESS_N`` (a tenth, at least 300) execs from many clients: 0 lost,
  0 unaudited with the journal index read across the sealed files, the
  lifecycle check across segments, and ``airlock audit verify --full``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path

from airlock.journal import segments
from airlock.journal.store import Store

from stress_support import RequestMaker, Tally, audit, run_load, running_stack, stress_clients, stress_n, verify_chain


def soak_records() -> int:
    return max(1000, int(os.environ.get("AIRLOCK_SOAK_RECORDS", "300000")))


def soak_segment_bytes() -> int:
    return max(64 * 1024, int(os.environ.get("AIRLOCK_SOAK_SEGMENT_BYTES", str(4 * 1024 * 1024))))


def test_soak_records_across_many_segments(tmp_path: Path) -> None:
    total, writers = soak_records(), 64
    db = tmp_path / "state" / "journal.sqlite"

    async def main() -> dict[str, object]:
        store = Store.open(db, segment_max_bytes=soak_segment_bytes())
        try:

            async def writer(w: int) -> None:
                for i in range(w, total, writers):
                    await store.append(
                        writer="intake",
                        kind="request.received",
                        request_id=f"soak-{i}",
                        payload={"i": i, "pad": "x" * 64},
                    )

            started = time.perf_counter()
            await asyncio.gather(*(writer(w) for w in range(writers)))
            elapsed = time.perf_counter() - started
        finally:
            await store.close()
        return {"elapsed": elapsed}

    timing = asyncio.run(main())
    store_report = asyncio.run(_full(db))
    files = segments.list_files(segments.segments_dir(db))
    seen: dict[str, int] = {}
    seqs: list[int] = []
    for path in [*files, db]:
        conn = segments.connect_sealed(path) if path != db else sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        for seq, rid in conn.execute("SELECT seq, request_id FROM events"):
            seqs.append(seq)
            if rid is not None:
                seen[rid] = seen.get(rid, 0) + 1
        conn.close()
    lost = [f"soak-{i}" for i in range(total) if f"soak-{i}" not in seen]
    doubled = [rid for rid, n in seen.items() if n != 1]
    print(
        f"\nsoak: {total} records in {timing['elapsed']:.1f} s across {len(files)} sealed segment(s); "
        f"verify --full {store_report['checked']} records: {'ok' if store_report['ok'] else store_report['reason']}; "
        f"lost {len(lost)}, duplicated {len(doubled)}"
    )
    assert len(files) >= 5, "the soak should cross many rollovers"
    assert lost == [] and doubled == []
    assert sorted(seqs) == list(range(1, len(seqs) + 1))
    assert store_report["ok"], store_report


async def _full(db: Path) -> dict[str, object]:
    store = Store.open(db)
    try:
        return await asyncio.to_thread(store.verify_full)
    finally:
        await store.close()


def test_soak_stack_across_segments(tmp_path: Path, tally: Tally) -> None:
    n = max(300, stress_n() // 10)
    with running_stack(tmp_path / "s", journal={"segment_max_bytes": 256 * 1024}) as stack:
        maker = RequestMaker(tmp_path / "markers")
        planned = [maker.make("marker") for _ in range(n)]
        results = asyncio.run(run_load(stack.agent, planned, stress_clients()))
        found = audit(stack, results, maker.markers)
        chain = verify_chain(stack)
        full = stack.cli("audit", "verify", "--full", "--anchors", "none", "--json", timeout=300)
        tally.add("soak (segments)", results, found)
        sealed = segments.list_files(stack.database.parent / "segments")
    data = json.loads(full.stdout)["data"]
    assert found.lost == [] and found.unaudited == [], found
    assert chain["ok"], chain
    assert len(sealed) >= 2, "the stack should have sealed segments"
    assert full.returncode == 0 and data["full"]["ok"], data.get("full")

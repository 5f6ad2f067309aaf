"""SIGKILL the journal under concurrent appends: every acknowledged event survives exactly once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from journal_support import with_store

from airlock.journal.store import Store

CHILD = r"""
import asyncio, sys
from pathlib import Path
from airlock.journal.store import Store

async def worker(store, task):
    i = 0
    while True:
        event = await store.append(writer="runner", kind="exec.finished", request_id=f"t{task}-{i}",
                                   payload={"task": task, "i": i, "pad": "x" * (i % 50) * 20})
        sys.stdout.write(f"{event.seq} t{task}-{i}\n")
        sys.stdout.flush()
        i += 1

async def settler(store):
    i = 0
    while True:
        await store.op_begin(f"op-{i}", "digest")
        await store.op_complete(f"op-{i}", "digest", {"exit_code": i % 3})
        sys.stdout.write(f"op op-{i}\n")
        sys.stdout.flush()
        i += 1

async def main():
    store = Store.open(Path(sys.argv[1]))
    await asyncio.gather(settler(store), *(worker(store, t) for t in range(24)))

asyncio.run(main())
"""


def test_sigkill_under_load_loses_no_acknowledged_event(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert child.stdout is not None
    acked: dict[int, str] = {}
    settled: list[str] = []

    def take(line: str) -> None:
        first, second = line.split()
        if first == "op":
            settled.append(second)
        else:
            acked[int(first)] = second

    deadline = time.monotonic() + 20
    try:
        while len(acked) < 1500 and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            take(line.decode())
    finally:
        child.send_signal(signal.SIGKILL)
        rest, err = child.communicate()
    # Lines already written before the kill are acknowledgements too.
    for text in rest.decode().splitlines(keepends=True):
        if text.endswith("\n"):
            take(text)
    assert child.returncode == -signal.SIGKILL
    assert len(acked) >= 200 and settled, err.decode()[-2000:]

    conn = sqlite3.connect(db)
    rows = dict(conn.execute("SELECT seq, request_id FROM events").fetchall())
    counts = dict(conn.execute("SELECT request_id, COUNT(*) FROM events GROUP BY request_id").fetchall())
    conn.close()
    for seq, token in acked.items():
        assert rows.get(seq) == token, seq
        assert counts[token] == 1, token

    async def check(store: Store) -> None:
        result = store.verify()
        assert result.ok, result
        assert result.head_seq >= max(acked)
        event = await store.append(writer="journal", kind="service.started", payload={})
        assert event.seq == result.head_seq + 1
        # Acknowledged outcomes replay after the crash; at most one more (in
        # flight at the kill) may have committed, so the newest 255 must fit.
        for operation_id in settled[-255:]:
            assert (await store.op_begin(operation_id, "digest")).state == "replay", operation_id

    with_store(db, check)

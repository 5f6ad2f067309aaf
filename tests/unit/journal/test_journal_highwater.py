"""The store against a cut or rewritten tail: the high-water mark, re-created triggers, anchors, acknowledgement."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from journal_support import fill, tamper, with_store

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal import anchors
from airlock.journal.chain import ACK_KIND, Anchor, compute_hash
from airlock.journal.store import SCHEMA_VERSION, Store, acknowledge


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.sqlite"


def _high(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT seq FROM chain_high").fetchone()[0])


def _triggers(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}


def test_seqs_are_never_reused_after_the_tail_is_deleted(db: Path) -> None:
    with_store(db, lambda store: fill(store, 8))
    tamper(db, "DELETE FROM events WHERE seq > 5")

    async def body(store: Store) -> int:
        assert store.head()[0] == 5
        return (await store.append(writer="intake", kind="request.received", payload={})).seq

    assert with_store(db, body) == 9  # not 6
    assert _high(db) == 9


def test_the_high_water_mark_cannot_be_lowered_or_deleted_with_its_triggers(db: Path) -> None:
    with_store(db, lambda store: fill(store, 3))
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        with pytest.raises(sqlite3.DatabaseError, match="never goes down"):
            conn.execute("UPDATE chain_high SET seq = 1")
        with pytest.raises(sqlite3.DatabaseError, match="never goes down"):
            conn.execute("DELETE FROM chain_high")
    finally:
        conn.close()


def test_dropped_triggers_are_recreated_and_named(db: Path) -> None:
    with_store(db, lambda store: fill(store, 2))
    full = _triggers(db)
    assert {"events_no_update", "events_no_delete"} <= full
    tamper(db)  # drops events_no_update and events_no_delete
    assert with_store(db, lambda store: _restored(store)) == ("events_no_update", "events_no_delete")
    assert _triggers(db) == full
    assert with_store(db, lambda store: _restored(store)) == ()


async def _restored(store: Store) -> tuple[str, ...]:
    return store.restored_triggers


def test_a_schema_2_journal_gains_the_high_water_mark(db: Path) -> None:
    with_store(db, lambda store: fill(store, 4))
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("DROP TRIGGER chain_high_no_lower")
        conn.execute("DROP TRIGGER chain_high_no_delete")
        conn.execute("DROP TABLE chain_high")
        conn.execute("PRAGMA user_version = 2")
    assert with_store(db, lambda store: _restored(store)) == ()  # the migration brings its own triggers
    assert _high(db) == 4
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_check_tail_against_the_newest_anchor(db: Path) -> None:
    events = with_store(db, lambda store: fill(store, 6))
    last = Anchor(6, events[-1].hash)
    assert with_store(db, lambda store: _tail(store, last)).ok
    assert with_store(db, lambda store: _tail(store, None)).ok
    tamper(db, "DELETE FROM events WHERE seq > 4", "DROP TRIGGER chain_high_no_lower", "UPDATE chain_high SET seq = 4")
    cut = with_store(db, lambda store: _tail(store, last))
    assert not cut.ok and cut.first_bad_seq == 5
    unanchored = with_store(db, lambda store: _tail(store, None))
    assert unanchored.ok  # without an anchor and with the mark lowered, nothing is left to tell


async def _tail(store: Store, last: Anchor | None):  # type: ignore[no-untyped-def]
    return store.check_tail(last)


def test_a_refusing_store_fails_every_write_closed(db: Path) -> None:
    async def body(store: Store) -> None:
        store.refuse("chain mismatch")
        for attempt in (
            store.append(writer="intake", kind="request.received", payload={}),
            store.claim_request_id("0:x", 60),
        ):
            with pytest.raises(AirlockError) as info:
                await attempt
            assert info.value.code is ErrorCode.AUDIT_UNAVAILABLE

    with_store(db, body)


def _rehash_from(db: Path, seq: int) -> None:
    """An attacker's rewrite: change record ``seq`` and recompute every later hash."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        rows = [dict(r) for r in conn.execute("SELECT * FROM events WHERE seq >= ? ORDER BY seq", (seq - 1,))]
        prev = rows[0]["hash"]
        for row in rows[1:]:
            if row["seq"] == seq:
                row["payload"] = '{"i":999}'
            record = dict(row) | {"payload": json.loads(row["payload"]), "prev_hash": prev}
            digest = compute_hash(record)
            conn.execute(
                "UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                (row["payload"], prev, digest, row["seq"]),
            )
            prev = digest
    finally:
        conn.close()


def test_rewrite_with_rehash_passes_the_chain_but_not_the_anchors(db: Path) -> None:
    events = with_store(db, lambda store: fill(store, 8))
    given = [Anchor(e.seq, e.hash) for e in events if e.seq in (3, 6, 8)]
    _rehash_from(db, 5)

    async def body(store: Store) -> dict:  # type: ignore[type-arg]
        return store.audit(given)

    result = with_store(db, body)
    assert result["chain"]["ok"] is True  # the chain alone cannot tell
    assert (result["ok"], result["first_bad_seq"]) == (False, 6)
    assert "after seq 3" in result["reason"]


def test_acknowledge_starts_a_segment_that_verify_accepts(db: Path) -> None:
    events = with_store(db, lambda store: fill(store, 8))
    given = [Anchor(8, events[-1].hash)]
    with pytest.raises(AirlockError, match="nothing to acknowledge") as info:
        acknowledge(db, given, operator="root", uid=0, reason="checking")
    assert info.value.code is ErrorCode.CONFLICT
    tamper(db, "DELETE FROM events WHERE seq > 5")
    done = acknowledge(db, given, operator="alice (as root)", uid=0, reason="disk restored from backup")
    assert done.event.seq == 9 and done.event.kind == ACK_KIND and done.event.prev_hash == events[4].hash
    assert done.event.payload["previous"] == {"seq": 5, "hash": events[4].hash}
    assert done.event.payload["operator"] == "alice (as root)"
    assert done.mismatch.first_bad_seq == 6
    mark = Anchor(done.event.seq, done.event.hash, ack=True)

    async def body(store: Store) -> dict:  # type: ignore[type-arg]
        assert store.check_tail(mark).ok
        assert (await store.append(writer="intake", kind="request.received", payload={})).seq == 10
        return store.audit([*given, mark])

    result = with_store(db, body)
    assert result["ok"] is True and result["anchors"]["acknowledged"] == 1
    assert [s["seq"] for s in result["segments"]] == [9] and result["segments"][0]["confirmed"] is True
    # The same database against anchors that lack the ack anchor: the cut still shows.
    unconfirmed = with_store(db, lambda store: _audit(store, given))
    assert unconfirmed["ok"] is False and unconfirmed["first_bad_seq"] == 6


async def _audit(store: Store, given: list[Anchor]) -> dict:  # type: ignore[type-arg]
    return store.audit(given)


def test_acknowledge_refuses_a_chain_broken_inside(db: Path) -> None:
    events = with_store(db, lambda store: fill(store, 6))
    tamper(db, """UPDATE events SET payload = '{"i":42}' WHERE seq = 3""")
    with pytest.raises(AirlockError, match="broken inside at seq 3"):
        acknowledge(db, [Anchor(6, events[-1].hash)], operator="root", uid=0, reason="x")


def test_anchor_file_append_and_tail(tmp_path: Path) -> None:
    path = tmp_path / anchors.FILE_NAME
    assert anchors.last_in_file(path) is None and anchors.read_file(path) == ([], 0)
    for seq in range(1, 3000):
        anchors.append(path, Anchor(seq, f"{seq:064x}"), "records", 1_790_000_000.0)
    assert path.stat().st_mode & 0o777 == 0o600
    assert anchors.last_in_file(path) == Anchor(2999, f"{2999:064x}")  # read from the tail only
    assert len(anchors.read_file(path)[0]) == 2999
    with open(path, "a") as f:
        f.write('{"seq": 3000, "ha')  # a write cut short
    assert anchors.last_in_file(path) == Anchor(2999, f"{2999:064x}")


def test_an_unreadable_anchors_file_fails_closed(db: Path, tmp_path: Path) -> None:
    with_store(db, lambda store: fill(store, 2))
    blocked = tmp_path / "anchors-dir"
    blocked.mkdir()  # a directory where the file should be: reading it fails
    refusal = with_store(db, lambda store: _start_check(store, blocked))
    assert refusal is not None and "cannot check the chain" in refusal
    ok = with_store(db, lambda store: _start_check(store, tmp_path / "absent"))
    assert ok is None  # no anchors file at all (a first start): nothing to hold against it


async def _start_check(store: Store, path: Path) -> str | None:
    from airlock.journal.anchoring import check_at_start

    check_at_start(store, path)
    return store.refusal

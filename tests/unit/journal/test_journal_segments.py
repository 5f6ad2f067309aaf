"""Segments (issue 38): rollover under load, one chain across files, sealed files, retention."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from journal_support import with_store

from airlock.journal import retention, rollover, segments
from airlock.journal.chain import Anchor
from airlock.journal.store import Store

SMALL = 64 * 1024


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.sqlite"


def _all_rows(db: Path) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for path in segments.list_files(segments.segments_dir(db), segments.default_archive_dir(db)):
        conn = segments.connect_sealed(path)
        rows += conn.execute("SELECT seq, kind, request_id, payload FROM events").fetchall()
        conn.close()
    conn = sqlite3.connect(db)
    rows += conn.execute("SELECT seq, kind, request_id, payload FROM events").fetchall()
    conn.close()
    return sorted(rows)


async def _load(store: Store, tasks: int, each: int) -> None:
    async def agent(t: int) -> None:
        for i in range(each):
            await store.append(
                writer="intake", kind="request.received", request_id=f"t{t}-{i}", payload={"pad": "x" * 120}
            )

    await asyncio.gather(*(agent(t) for t in range(tasks)))


def test_rollover_under_load_loses_and_duplicates_nothing(db: Path) -> None:
    with_store(db, lambda s: _load(s, 40, 60), segment_max_bytes=SMALL)
    report = with_store(db, lambda s: asyncio.to_thread(s.verify_full))
    files = segments.list_files(segments.segments_dir(db))
    assert len(files) >= 3, "the load should have crossed several rollovers"
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o440 for f in files)
    rows = _all_rows(db)
    seqs = [r[0] for r in rows]
    assert seqs == list(range(1, len(seqs) + 1)), "every seq once, none missing"
    ids = [r[2] for r in rows if r[1] == "request.received"]
    assert sorted(ids) == sorted(f"t{t}-{i}" for t in range(40) for i in range(60))
    assert report["ok"], report
    assert report["segments"] == len(files)
    assert report["checked"] == len(rows)
    for f in files:
        assert segments.verify_file(f)["ok"]


def test_a_story_spanning_the_rollover_is_one_story(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.append(writer="intake", kind="request.received", request_id="span", payload={"step": 1})
        await _load(store, 4, 60)  # several rollovers
        assert segments.list_files(segments.segments_dir(db)), "a rollover happened"
        await store.append(writer="approval", kind="approval.decided", request_id="span", payload={"step": 2})
        story = store.events(scope={"request_id": "span"}, limit=10).events
        assert [(e.kind, e.payload["step"]) for e in story] == [("request.received", 1), ("approval.decided", 2)]
        # The whole feed pages across files, in order, without a gap.
        seen: list[int] = []
        cursor = 0
        while True:
            page = store.events(after=cursor, limit=37)
            seen += [e.seq for e in page.events]
            if not page.events:
                break
            cursor = page.next_cursor
        assert seen == list(range(1, store.head()[0] + 1))

    with_store(db, body, segment_max_bytes=SMALL)


def test_the_live_segment_verifies_and_restarts_after_a_rollover(db: Path) -> None:
    async def body(store: Store) -> None:
        await _load(store, 4, 60)

    with_store(db, body, segment_max_bytes=SMALL)

    async def again(store: Store) -> None:
        result = store.verify()
        assert result.ok, result
        assert store.verify_full()["ok"]
        await store.append(writer="intake", kind="request.received", payload={})

    with_store(db, again)


def _edit_sealed(path: Path, statement: str) -> None:
    os.chmod(path, 0o600)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER IF EXISTS events_no_update")
    conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
    conn.execute(statement)
    conn.close()


def test_a_tampered_sealed_segment_is_caught(db: Path) -> None:
    with_store(db, lambda s: _load(s, 4, 60), segment_max_bytes=SMALL)
    first = segments.list_files(segments.segments_dir(db))[0]
    assert segments.verify_file(first)["ok"]  # control
    _edit_sealed(first, 'UPDATE events SET payload = \'{"pad":"y"}\' WHERE seq = 5')
    checked = segments.verify_file(first)
    assert not checked["ok"] and checked["first_bad_seq"] == 5
    full = with_store(db, lambda s: asyncio.to_thread(s.verify_full))
    assert not full["ok"] and full["first_bad_seq"] == 5


def test_a_deleted_or_swapped_segment_is_caught(db: Path, tmp_path: Path) -> None:
    with_store(db, lambda s: _load(s, 4, 60), segment_max_bytes=SMALL)
    files = segments.list_files(segments.segments_dir(db))
    assert len(files) >= 3
    assert with_store(db, lambda s: asyncio.to_thread(s.verify_full))["ok"]  # control
    # Removing a middle segment leaves a gap no deletion record accounts for.
    aside = tmp_path / files[1].name
    os.rename(files[1], aside)
    full = with_store(db, lambda s: asyncio.to_thread(s.verify_full))
    assert not full["ok"] and "missing" in full["reason"]
    # Putting another (valid on its own) segment in its place: it does not link.
    other = tmp_path / "other" / "state" / "journal.sqlite"
    with_store(other, lambda s: _load(s, 4, 60), segment_max_bytes=SMALL)
    os.link(segments.list_files(segments.segments_dir(other))[1], files[1])
    assert segments.verify_file(files[1])["ok"]
    full = with_store(db, lambda s: asyncio.to_thread(s.verify_full))
    assert not full["ok"] and "link" in full["reason"]


def test_a_rollover_cut_short_is_finished_and_nothing_is_written_between(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.rename
    fails = {"left": 1}

    def flaky(src: Any, dst: Any) -> None:
        if str(src).endswith(".next") and fails["left"]:
            fails["left"] -= 1
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(os, "rename", flaky)

    async def body(store: Store) -> None:
        await _load(store, 1, 200)  # the first rollover fails once after its seal; the next batch finishes it

    with_store(db, body, segment_max_bytes=SMALL)
    rows = _all_rows(db)
    assert [r[0] for r in rows] == list(range(1, len(rows) + 1))
    seals = [r for r in rows if r[1] == "segment.sealed"]
    assert seals
    # Nothing was written after a seal in its own file: each seal is its file's last record.
    for path in segments.list_files(segments.segments_dir(db)):
        assert segments.verify_file(path)["ok"]
    assert with_store(db, lambda s: asyncio.to_thread(s.verify_full))["ok"]


def test_a_crash_after_the_seal_is_finished_at_open(db: Path) -> None:
    with_store(db, lambda s: _load(s, 1, 20))
    # The seal written, the process gone before the next database was in place.
    conn = sqlite3.connect(db, isolation_level=None)
    head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    conn.execute("PRAGMA journal_mode=DELETE")
    from airlock.journal.schema import _COLUMNS

    row, _ = rollover._record(
        head[0] + 1,
        "2026-01-01T00:00:00.000Z",
        "segment.sealed",
        {"segment": 1, "file": "journal-000001.db", "first_seq": 1, "last_seq": head[0] + 1},
        head[1],
    )
    conn.execute(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", row)
    conn.close()

    async def body(store: Store) -> dict[str, Any]:
        await store.append(writer="intake", kind="request.received", payload={})
        return store.verify_full()

    report = with_store(db, body)
    assert report["ok"], report
    assert report["segments"] == 1


def _limits(**kw: Any) -> retention.Limits:
    return retention.Limits(**kw)


def test_retention_archives_and_deletes_only_when_the_condition_holds(db: Path) -> None:
    async def body(store: Store) -> None:
        await _load(store, 4, 60)
        archive = store.archive_dir
        assert archive is not None
        sealed = segments.list_files(segments.segments_dir(db))
        assert len(sealed) >= 3

        anchored: list[Anchor] = []

        async def deletion(payload: dict[str, Any]) -> None:
            event = await store.append(writer="journal", kind="segment.deleted", payload=payload)
            anchored.append(Anchor(event.seq, event.hash))  # as the journal's retention anchors each one

        # Archive everything; the archive's limit is passed but deleting is 'never': nothing goes.
        limits = _limits(retention_max_bytes=1, archive_max_bytes=1, delete_when="never")
        report = await retention.apply(db, archive, limits, 0.0, deletion)
        assert len(report["archived"]) == len(sealed) and not report["deleted"]
        assert len(segments.list_files(archive)) == len(sealed)
        assert len(report["kept"]) == len(sealed)
        assert (await asyncio.to_thread(store.verify_full))["ok"]
        # 'confirmed' without the confirmation: still nothing.
        limits = _limits(archive_max_bytes=1, delete_when="confirmed")
        report = await retention.apply(db, archive, limits, 0.0, deletion)
        assert not report["deleted"] and len(segments.list_files(archive)) == len(sealed)
        # 'shipped' with a mark covering the first segment only: that one goes.
        first = segments.read_info(segments.list_files(archive)[0])
        retention.write_shipped(db, first.last_seq, first.final_hash)
        limits = _limits(archive_max_bytes=1, delete_when="shipped")
        report = await retention.apply(db, archive, limits, 0.0, deletion)
        assert [d["segment"] for d in report["deleted"]] == [first.number]
        # Confirmed: the rest go, each journaled with its range and final hash.
        limits = _limits(archive_max_bytes=1, delete_when="confirmed")
        report = await retention.apply(db, archive, limits, 0.0, deletion, confirmed=True)
        assert len(report["deleted"]) == len(sealed) - 1
        assert segments.list_files(archive) == []
        full = await asyncio.to_thread(store.verify_full, anchored)
        assert full["ok"], full
        assert [d["segment"] for d in full["deleted"]] == list(range(1, len(sealed) + 1))
        assert all(set(d) >= {"first_seq", "last_seq", "final_hash"} for d in full["deleted"])
        # Issue 51: a deletion no anchor names excuses nothing (a record slipped into the database).
        bare = await asyncio.to_thread(store.verify_full)
        assert not bare["ok"] and "segment 1 is missing" in bare["reason"], bare
        assert "has no anchor of its own" in bare["reason"] and len(bare["unanchored_deletions"]) == len(sealed)

    with_store(db, body, segment_max_bytes=SMALL)


def test_a_tampered_archived_segment_is_caught(db: Path) -> None:
    async def body(store: Store) -> None:
        await _load(store, 4, 60)
        assert store.archive_dir is not None

        async def deletion(payload: dict[str, Any]) -> None:
            raise AssertionError("nothing is deleted here")

        await retention.apply(db, store.archive_dir, _limits(retention_max_bytes=1), 0.0, deletion)

    with_store(db, body, segment_max_bytes=SMALL)
    archived = segments.list_files(segments.default_archive_dir(db))
    assert archived
    assert with_store(db, lambda s: asyncio.to_thread(s.verify_full))["ok"]  # control
    _edit_sealed(archived[-1], "DELETE FROM events WHERE seq = (SELECT MIN(seq) + 3 FROM events)")
    full = with_store(db, lambda s: asyncio.to_thread(s.verify_full))
    assert not full["ok"] and archived[-1].name in full["reason"]


def test_anchors_in_sealed_segments_still_check(db: Path) -> None:
    from airlock.journal.chain import Anchor

    async def body(store: Store) -> None:
        first = await store.append(writer="intake", kind="request.received", payload={})
        await _load(store, 4, 60)
        assert store.audit([Anchor(first.seq, first.hash)])["ok"]
        bad = store.audit([Anchor(first.seq, "0" * 64)])
        assert not bad["ok"] and bad["first_bad_seq"] == first.seq
        assert store.check_tail(Anchor(first.seq, first.hash)).ok

    with_store(db, body, segment_max_bytes=SMALL)


def test_a_segment_is_sealed_by_age(db: Path) -> None:
    from journal_support import FakeClock

    clock = FakeClock()

    async def body(store: Store) -> None:
        await store.append(writer="intake", kind="request.received", payload={})
        await store.append(writer="intake", kind="request.received", payload={})
        await store.sync([])  # the writer has looked at the segment after those batches
        assert segments.list_files(segments.segments_dir(db)) == []  # young: not sealed
        clock.now += 61
        await store.append(writer="intake", kind="request.received", payload={})
        await store.sync([])
        assert len(segments.list_files(segments.segments_dir(db))) == 1
        assert store.verify_full()["ok"]

    with_store(db, body, segment_max_age=60.0, clock=clock)


def test_the_hold_and_the_grants_in_force_survive_a_rollover(db: Path) -> None:
    """approval restores the hold and its grants from the journal at start: a rollover must not lose them."""
    from airlock.approval import restore
    from airlock.journal import select

    def latest_hold(db: Path) -> dict[str, Any] | None:
        return restore.hold_from(select.records(db, restore.HOLD_QUERY))

    def grant_records(db: Path) -> list[dict[str, Any]]:
        return restore.grants_from(select.records(db, restore.GRANTS_QUERY))

    def grant(grant_id: str) -> dict[str, Any]:
        return {"action": "grant", "grant_id": grant_id, "grant": {"grant_id": grant_id, "rule": "r"}}

    async def body(store: Store) -> None:
        await store.append(writer="approval", kind="operator.action", payload={"action": "hold", "reason": "x"})
        for g in ("g1", "g2", "g3"):
            await store.append(writer="approval", kind="operator.action", payload=grant(g))
        await store.append(
            writer="approval", kind="operator.action", payload={"action": "grant.revoke", "grant_id": "g2"}
        )
        before = (latest_hold(db), grant_records(db))
        await _load(store, 4, 60)  # several rollovers
        assert len(segments.list_files(segments.segments_dir(db))) >= 2
        held = latest_hold(db)
        assert held is not None and before[0] is not None
        assert (held["action"], held["reason"], held["seq"]) == ("hold", "x", before[0]["seq"])
        carried = grant_records(db)
        made = {r["grant_id"] for r in carried if r["action"] == "grant"}
        ended = {r["grant_id"] for r in carried if r["action"] != "grant"}
        assert made - ended == {"g1", "g3"}  # the grants in force, as approval reads them from the records
        assert [r["seq"] for r in carried] == [r["seq"] for r in before[1]]  # every record, carried across
        # A release after the rollover is the newest again.
        await store.append(writer="approval", kind="operator.action", payload={"action": "release"})
        released = latest_hold(db)
        assert released is not None and released["action"] == "release"

    with_store(db, body, segment_max_bytes=SMALL)


def test_peoples_denials_survive_a_rollover(db: Path) -> None:
    """Issue 45: approval reads every person's denial back at start; a rollover carries them over."""
    from airlock.approval import restore
    from airlock.journal import select

    class Reader:
        async def call(self, verb: Any, args: Any, *, timeout: float | None = None) -> Any:
            return select.records(db, args)

    def denial(n: int) -> dict[str, Any]:
        stage = {"path": "/usr/bin/id", "dev": 1, "ino": n, "args": ["-u"]}
        return {"decision": "deny", "remembered": "denial", "denial": {"uid": 1000, "run_as": 0, "stages": [stage]}}

    async def body(store: Store) -> None:
        for n in range(3):
            await store.append(writer="approval", kind="approval.decided", payload=denial(n))
        await _load(store, 4, 60)  # several rollovers
        assert len(segments.list_files(segments.segments_dir(db))) >= 2
        await store.append(writer="approval", kind="approval.decided", payload=denial(3))
        found = await restore.denial_records(Reader(), 5)  # type: ignore[arg-type]
        assert [d["stages"][0]["ino"] for d in found] == [0, 1, 2, 3]

    with_store(db, body, segment_max_bytes=SMALL)


def test_the_tail_reaches_into_sealed_segments_after_a_rollover(db: Path) -> None:
    async def body(store: Store) -> None:
        await _load(store, 4, 60)
        await store.sync([])
        first_live = int(sqlite3.connect(db).execute("SELECT MIN(seq) FROM events").fetchone()[0])
        assert first_live > 1
        head = store.head()[0]
        want = head - first_live + 1 + 10  # more than the live segment holds
        assert want <= 256
        page = store.events(tail=want, limit=want)
        assert [e.seq for e in page.events] == list(range(head - want + 1, head + 1))
        scoped = store.events(tail=5, limit=5, scope={"request_id": "t0-0"}).events
        assert [e.request_id for e in scoped] == ["t0-0"]

    with_store(db, body, segment_max_bytes=SMALL)

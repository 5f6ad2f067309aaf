from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
from pathlib import Path

import pytest
from journal_support import fill, run, tamper, with_store

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.chain import GENESIS, compute_hash
from airlock.journal.store import MAX_PAYLOAD_BYTES, Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


def test_empty_store(db: Path) -> None:
    async def body(store: Store) -> None:
        assert store.head() == (0, GENESIS)
        assert store.verify().ok
        page = store.events()
        assert (page.events, page.next_cursor, page.latest) == ([], 0, 0)

    with_store(db, body)


def test_append_returns_the_chained_event(db: Path) -> None:
    async def body(store: Store) -> None:
        first = await store.append(
            writer="intake",
            kind="request.received",
            request_id="r1",
            operation_id="op1",
            peer_uid=1000,
            session="s1",
            payload={"argv": ["id"], "n": (1, 2)},
        )
        assert (first.seq, first.prev_hash, first.writer) == (1, GENESIS, "intake")
        assert first.payload == {"argv": ["id"], "n": [1, 2]}  # as it will read back
        assert first.time.endswith("Z") and len(first.time) == len("2026-12-02T13:00:00.000Z")
        record = first.to_dict()
        assert compute_hash({k: v for k, v in record.items() if k != "hash"}) == first.hash
        second = await store.append(writer="runner", kind="exec.started", request_id="r1", payload={})
        assert second.prev_hash == first.hash
        assert store.head() == (2, second.hash)
        assert store.events().events == [first, second]

    with_store(db, body)


def test_a_payload_with_number_keys_is_stored_in_its_canonical_form(db: Path) -> None:
    # 9 sorts before 10 as a number but after "10" as a string: the stored text is the one verify parses back.
    async def body(store: Store) -> None:
        event = await store.append(writer="intake", kind="request.received", payload={"m": {10: "a", 9: "b"}})
        assert event.payload == {"m": {"10": "a", "9": "b"}}
        stored = sqlite3.connect(db).execute("SELECT payload FROM events WHERE seq = ?", (event.seq,)).fetchone()
        assert stored == ('{"m":{"10":"a","9":"b"}}',)
        assert store.verify().ok

    with_store(db, body)


def test_file_modes_are_private(db: Path) -> None:
    async def body(store: Store) -> None:
        await fill(store, 3)
        for name in ("journal.db", "journal.db-wal", "journal.db-shm"):
            mode = stat.S_IMODE(os.stat(db.parent / name).st_mode)
            assert mode == 0o600, (name, oct(mode))

    with_store(db, body)


def test_existing_file_is_tightened(db: Path) -> None:
    db.parent.mkdir()
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    with_store(db, lambda store: fill(store, 1))
    assert stat.S_IMODE(os.stat(db).st_mode) == 0o600


def test_storage_settings(db: Path) -> None:
    with_store(db, lambda store: fill(store, 1))
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    source = (Path(__file__).resolve().parents[3] / "services/airlock/journal/store.py").read_text()
    assert "PRAGMA synchronous=FULL" in source


@pytest.mark.parametrize(
    ("writer", "kind", "code"),
    [
        ("intake", "exec.finished", ErrorCode.UNAUTHORIZED),
        ("runner", "approval.decided", ErrorCode.UNAUTHORIZED),
        ("approval", "request.received", ErrorCode.UNAUTHORIZED),
        ("mallory", "service.started", ErrorCode.UNAUTHORIZED),
        ("intake", "no.such", ErrorCode.INVALID_ARGUMENTS),
    ],
)
def test_append_refuses_foreign_and_unknown_kinds(db: Path, writer: str, kind: str, code: ErrorCode) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as info:
            await store.append(writer=writer, kind=kind, payload={})
        assert info.value.code is code
        assert store.head() == (0, GENESIS)

    with_store(db, body)


@pytest.mark.parametrize(
    "fields",
    [
        {"payload": {"x": "a" * MAX_PAYLOAD_BYTES}},
        {"payload": {"x": float("nan")}},
        {"payload": {"x": object()}},
        {"payload": ["not", "an", "object"]},
        {"payload": {}, "request_id": ""},
        {"payload": {}, "request_id": "x" * 257},
        {"payload": {}, "session": 5},
        {"payload": {}, "peer_uid": -1},
        {"payload": {}, "peer_uid": True},
        {"payload": {"s": "\ud800"}},
    ],
)
def test_append_validates_fields(db: Path, fields: dict[str, object]) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as info:
            await store.append(writer="intake", kind="request.received", **fields)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_ARGUMENTS
        assert store.head() == (0, GENESIS)

    with_store(db, body)


def test_group_commit_200_concurrent_appends(db: Path) -> None:
    async def body(store: Store) -> None:
        async def one(i: int) -> int:
            await asyncio.sleep(0.0005 * (i % 7))  # arrive spread out, not in one tick
            event = await store.append(writer="runner", kind="exec.finished", request_id=f"r{i}", payload={"i": i})
            return event.seq

        seqs = await asyncio.gather(*(one(i) for i in range(200)))
        assert sorted(seqs) == list(range(1, 201))
        stats = store.stats
        assert stats.appends == 200
        assert stats.transactions < 50, stats
        assert stats.largest_batch > 1
        assert store.verify().ok

    with_store(db, body)
    conn = sqlite3.connect(db)
    payloads = [row[0] for row in conn.execute("SELECT payload FROM events ORDER BY seq")]
    conn.close()
    assert sorted(payloads) == sorted(f'{{"i":{i}}}' for i in range(200))


def test_restart_continues_the_chain(db: Path) -> None:
    with_store(db, lambda store: fill(store, 5))

    async def body(store: Store) -> None:
        head = store.head()
        assert head[0] == 5
        event = await store.append(writer="journal", kind="service.started", payload={})
        assert (event.seq, event.prev_hash) == (6, head[1])
        assert store.verify().ok and store.verify().checked == 6

    with_store(db, body)


def test_closed_store_refuses_appends(db: Path) -> None:
    async def body() -> None:
        store = Store.open(db)
        await fill(store, 1)
        await store.close()
        await store.close()  # idempotent
        with pytest.raises(AirlockError) as info:
            await store.append(writer="intake", kind="request.received", payload={})
        assert info.value.code is ErrorCode.AUDIT_UNAVAILABLE

    run(body())


def test_close_commits_what_was_queued(db: Path) -> None:
    async def body() -> None:
        store = Store.open(db)
        tasks = [
            asyncio.create_task(store.append(writer="intake", kind="request.received", payload={"i": i}))
            for i in range(50)
        ]
        await asyncio.sleep(0)
        await store.close()
        assert all(t.done() and t.exception() is None for t in tasks)

    run(body())
    assert with_store(db, lambda store: _verify(store)).checked == 50


async def _verify(store: Store):  # type: ignore[no-untyped-def]
    return store.verify()


# -- tampering: the chain names the first bad row ---------------------------


def _tampered(db: Path, *statements: str):  # type: ignore[no-untyped-def]
    with_store(db, lambda store: fill(store, 8))
    tamper(db, *statements)
    return with_store(db, _verify)


def test_untouched_database_verifies(db: Path) -> None:
    result = _tampered(db)
    assert (result.ok, result.checked, result.head_seq) == (True, 8, 8)


def test_triggers_refuse_updates(db: Path) -> None:
    with_store(db, lambda store: fill(store, 2))
    conn = sqlite3.connect(db)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("UPDATE events SET kind = 'x' WHERE seq = 1")
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        conn.execute("DELETE FROM events WHERE seq = 1")
    conn.close()


@pytest.mark.parametrize(
    "statement",
    [
        """UPDATE events SET payload = '{"i":42}' WHERE seq = 5""",
        "UPDATE events SET kind = 'request.rejected' WHERE seq = 5",
        "UPDATE events SET peer_uid = 0 WHERE seq = 5",
        "UPDATE events SET writer = 'runner' WHERE seq = 5",
        "UPDATE events SET time = '2020-01-01T00:00:00.000Z' WHERE seq = 5",
        "UPDATE events SET request_id = NULL WHERE seq = 5",
        """UPDATE events SET payload = '{"i": 4}' WHERE seq = 5""",
    ],
)
def test_edited_row_is_named(db: Path, statement: str) -> None:
    result = _tampered(db, statement)
    assert (result.ok, result.first_bad_seq, result.head_seq) == (False, 5, 4)


def test_deleted_row_is_named(db: Path) -> None:
    result = _tampered(db, "DELETE FROM events WHERE seq = 5")
    assert (result.ok, result.first_bad_seq) == (False, 5)
    assert "missing" in (result.reason or "")


def test_deleted_and_renumbered_row_is_named(db: Path) -> None:
    result = _tampered(db, "DELETE FROM events WHERE seq = 5", "UPDATE events SET seq = seq - 1 WHERE seq > 5")
    assert (result.ok, result.first_bad_seq) == (False, 5)


def test_reordered_rows_are_named(db: Path) -> None:
    result = _tampered(
        db,
        "UPDATE events SET seq = 100 WHERE seq = 4",
        "UPDATE events SET seq = 4 WHERE seq = 6",
        "UPDATE events SET seq = 6 WHERE seq = 100",
    )
    assert (result.ok, result.first_bad_seq) == (False, 4)


def test_truncation_needs_the_anchor(db: Path) -> None:
    with_store(db, lambda store: fill(store, 8))
    conn = sqlite3.connect(db)
    anchor_seq, anchor = conn.execute("SELECT seq, hash FROM events WHERE seq = 8").fetchone()
    conn.close()
    tamper(db, "DELETE FROM events WHERE seq > 6")

    async def body(store: Store) -> None:
        assert store.verify().ok  # the tail is gone without a trace in the file itself...
        result = store.verify(from_seq=anchor_seq, anchor=anchor)  # ...but not against a head kept elsewhere
        assert (result.ok, result.first_bad_seq) == (False, 8)
        with pytest.raises(AirlockError):
            store.verify(anchor=anchor)
        assert store.head()[0] == 6

    with_store(db, body)


def test_verify_from_anchor(db: Path) -> None:
    async def body(store: Store) -> None:
        await fill(store, 4)
        seq, anchor = store.head()
        await fill(store, 4)
        assert store.verify(from_seq=seq, anchor=anchor).ok
        assert not store.verify(from_seq=seq, anchor="0" * 64).ok

    with_store(db, body)


# -- events feed ---------------------------------------------------------------


def test_events_paging(db: Path) -> None:
    async def body(store: Store) -> None:
        await fill(store, 10)
        page = store.events(limit=4)
        assert [e.seq for e in page.events] == [1, 2, 3, 4]
        assert (page.next_cursor, page.latest) == (4, 10)
        page = store.events(after=page.next_cursor, limit=4)
        assert [e.seq for e in page.events] == [5, 6, 7, 8]
        page = store.events(after=page.next_cursor, limit=4)
        assert [e.seq for e in page.events] == [9, 10]
        assert page.next_cursor == 10
        page = store.events(after=10)
        assert (page.events, page.next_cursor, page.latest) == ([], 10, 10)
        await fill(store, 1)
        assert [e.seq for e in store.events(after=10).events] == [11]

    with_store(db, body)


def test_events_tail(db: Path) -> None:
    async def body(store: Store) -> None:
        await fill(store, 10)
        page = store.events(tail=3)
        assert [e.seq for e in page.events] == [8, 9, 10]
        assert (page.next_cursor, page.latest) == (10, 10)
        assert [e.seq for e in store.events(tail=5, limit=2).events] == [9, 10]
        assert [e.seq for e in store.events(tail=2, after=1).events] == [9, 10]  # tail wins
        page = store.events(tail=0)
        assert (page.events, page.next_cursor) == ([], 10)

    with_store(db, body)


def test_events_scope(db: Path) -> None:
    async def body(store: Store) -> None:
        for i in range(12):
            await store.append(
                writer="intake",
                kind="request.received",
                request_id=f"r{i % 3}",
                operation_id=f"op{i % 4}",
                session="s-even" if i % 2 == 0 else None,
                peer_uid=1000 + i % 2,
                payload={"i": i},
            )
        assert [e.payload["i"] for e in store.events(scope={"request_id": "r1"}).events] == [1, 4, 7, 10]
        assert [e.payload["i"] for e in store.events(scope={"operation_id": "op2"}).events] == [2, 6, 10]
        assert [e.payload["i"] for e in store.events(scope={"session": "s-even"}, tail=2).events] == [8, 10]
        assert [e.payload["i"] for e in store.events(scope={"peer_uid": 1001}, limit=2).events] == [1, 3]
        both = store.events(scope={"peer_uid": 1000, "request_id": "r0"})
        assert [e.payload["i"] for e in both.events] == [0, 6]
        # A short scoped page has seen everything up to `latest`.
        assert both.next_cursor == both.latest == 12
        full = store.events(scope={"request_id": "r1"}, limit=2)
        assert full.next_cursor == 5 and [
            e.seq for e in store.events(scope={"request_id": "r1"}, after=full.next_cursor).events
        ] == [8, 11]

    with_store(db, body)


def test_events_scope_by_request_prefix_and_kind(db: Path) -> None:
    """Issue 44: `show PREFIX` finds the requests whose ID starts so (an index range: no pattern characters)."""

    async def body(store: Store) -> None:
        for i, rid in enumerate(["ab-1", "ab-2", "abc", "ab%", "a_b", "b", "ab\U0010fffe", "ac"]):
            for kind in ("request.received", "request.replied"):
                await store.append(writer="intake", kind=kind, request_id=rid, payload={"i": i})

        def ids(prefix: str) -> list[str]:
            scope = {"request_prefix": prefix, "kind": "request.received"}
            return [str(e.request_id) for e in store.events(scope=scope).events]

        assert ids("ab") == ["ab-1", "ab-2", "abc", "ab%", "ab\U0010fffe"]
        assert ids("ab-") == ["ab-1", "ab-2"] and ids("ab%") == ["ab%"] and ids("a_") == ["a_b"]
        assert ids("z") == []

    with_store(db, body)


@pytest.mark.parametrize(
    "arguments",
    [
        {"limit": 0},
        {"limit": 257},
        {"limit": True},
        {"tail": -1},
        {"tail": 300},
        {"after": -1},
        {"after": "3"},
        {"scope": {"nonsense": "x"}},
        {"scope": {"request_prefix": ""}},
        {"scope": {"request_prefix": 5}},
        {"scope": {"peer_uid": "1000"}},
        {"scope": {"request_id": 5}},
        {"scope": "r1"},
    ],
)
def test_events_rejects_bad_arguments(db: Path, arguments: dict[str, object]) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as info:
            store.events(**arguments)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_ARGUMENTS

    with_store(db, body)


# -- failure: the disk is full -------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0700", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill_disk(directory: Path) -> Path:
    filler = directory / "filler"
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError:
            pass
    return filler


def test_full_disk_fails_appends_and_keeps_the_chain(tiny_fs: Path) -> None:
    db = tiny_fs / "journal.db"

    async def body(store: Store) -> None:
        await fill(store, 3)
        head = store.head()
        filler = _fill_disk(tiny_fs)
        big = {"blob": "x" * 60_000}
        results = await asyncio.gather(
            *(store.append(writer="intake", kind="request.received", payload=big) for _ in range(4)),
            return_exceptions=True,
        )
        assert all(isinstance(r, AirlockError) and r.code is ErrorCode.AUDIT_UNAVAILABLE for r in results), results
        assert store.head() == head
        assert store.stats.failed_transactions >= 1
        filler.unlink()
        event = await store.append(writer="intake", kind="request.received", payload={"after": "recovery"})
        assert (event.seq, event.prev_hash) == (head[0] + 1, head[1])
        result = store.verify()
        assert result.ok and result.checked == 4

    with_store(db, body)


def test_unwritable_database_fails_appends_and_recovers(db: Path) -> None:
    """The database refuses writes (as a read-only file would): appends and
    settled operations fail with audit_unavailable; nothing half-happens."""

    async def body(store: Store) -> None:
        await fill(store, 2)
        head = store.head()
        await store.op_begin("op-1", "d")
        store.writer._wconn.execute("PRAGMA query_only = ON")  # the writer is idle: no race with its thread
        results = await asyncio.gather(
            *(store.append(writer="intake", kind="request.received", payload={"i": i}) for i in range(5)),
            return_exceptions=True,
        )
        assert all(isinstance(r, AirlockError) and r.code is ErrorCode.AUDIT_UNAVAILABLE for r in results), results
        with pytest.raises(AirlockError) as info:
            await store.op_complete("op-1", "d", {"exit_code": 0})
        assert info.value.code is ErrorCode.AUDIT_UNAVAILABLE
        assert store.head() == head
        store.writer._wconn.execute("PRAGMA query_only = OFF")
        event = await store.append(writer="intake", kind="request.received", payload={})
        assert (event.seq, event.prev_hash) == (3, head[1])
        assert store.verify().ok
        assert (await store.op_begin("op-1", "d")).state == "new"  # the failed completion did not leave it running

    with_store(db, body)


def test_pure_modules_do_no_io() -> None:
    """chain and operations are shared with the CLI and tests: no I/O imports."""
    import ast

    package = Path(__file__).resolve().parents[3] / "services/airlock/journal"
    forbidden = {"asyncio", "os", "socket", "sqlite3", "subprocess", "threading"}
    for name in ("chain.py", "operations.py"):
        tree = ast.parse((package / name).read_text())
        imported = {
            alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert not imported & forbidden, (name, imported & forbidden)

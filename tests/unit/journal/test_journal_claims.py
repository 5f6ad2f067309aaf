"""The journal's request-ID claims: intake's replay guard, durable and atomic."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable
from pathlib import Path

import pytest
from journal_support import FakeClock, with_store

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.store import SCHEMA_VERSION, Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


def test_claim_then_reclaim_is_refused(db: Path) -> None:
    async def body(store: Store) -> None:
        assert await store.claim_request_id("1000:r1", 300) is True
        assert await store.claim_request_id("1000:r1", 300) is False
        # Another peer's uid is another key: IDs are per peer.
        assert await store.claim_request_id("1001:r1", 300) is True

    with_store(db, body)


def test_claim_expires_after_the_window(db: Path) -> None:
    clock = FakeClock()

    async def body(store: Store) -> None:
        assert await store.claim_request_id("0:r", 10) is True
        clock.now += 9.9
        assert await store.claim_request_id("0:r", 10) is False
        clock.now += 0.2
        assert await store.claim_request_id("0:r", 10) is True  # expired: claimed again, for a new window
        clock.now += 5
        assert await store.claim_request_id("0:r", 10) is False

    with_store(db, body, clock=clock)


def test_expired_claims_are_pruned(db: Path) -> None:
    clock = FakeClock()

    async def body(store: Store) -> None:
        for i in range(50):
            assert await store.claim_request_id(f"0:old-{i}", 10)
        clock.now += 11
        assert await store.claim_request_id("0:new", 10)

    with_store(db, body, clock=clock)
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT key FROM request_ids")] == ["0:new"]


def test_claim_survives_reopen(db: Path) -> None:
    clock = FakeClock()

    async def first(store: Store) -> None:
        assert await store.claim_request_id("1000:r1", 300) is True

    async def second(store: Store) -> bool:
        return await store.claim_request_id("1000:r1", 300)

    with_store(db, first, clock=clock)
    assert with_store(db, second, clock=clock) is False
    clock.now += 301
    assert with_store(db, second, clock=clock) is True


def test_concurrent_claims_of_one_key_have_one_winner(db: Path) -> None:
    async def body(store: Store) -> list[bool]:
        return list(await asyncio.gather(*(store.claim_request_id("0:same", 60) for _ in range(64))))

    results = with_store(db, body)
    assert results.count(True) == 1


def test_claims_share_transactions_with_appends(db: Path) -> None:
    async def body(store: Store) -> None:
        await asyncio.gather(
            *(store.claim_request_id(f"0:r{i}", 60) for i in range(20)),
            *(
                store.append(writer="intake", kind="request.received", request_id=f"r{i}", payload={})
                for i in range(20)
            ),
        )
        assert store.stats.transactions < 40
        assert store.verify().ok

    with_store(db, body)


def test_a_claimed_append_is_written_only_when_its_claim_wins(db: Path) -> None:
    async def body(store: Store) -> list[object]:
        def received(n: int) -> Awaitable[object]:
            return store.append_claimed(
                "0:same", 60, writer="intake", kind="request.received", request_id="same", payload={"n": n}
            )

        results = list(await asyncio.gather(*(received(n) for n in range(16))))
        assert await store.append_claimed("0:same", 60, writer="intake", kind="request.received", payload={}) is None
        assert store.verify().ok
        return results

    results = with_store(db, body)
    winners = [r for r in results if r is not None]
    assert len(winners) == 1  # one event for sixteen attempts, and the chain has no gap
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT seq FROM events WHERE request_id = 'same'").fetchall()
    assert len(rows) == 1


@pytest.mark.parametrize(
    ("key", "window"),
    [
        ("", 60),
        ("x" * 10_000, 60),
        (7, 60),
        ("0:\udc80", 60),
        ("0:r", 0),
        ("0:r", -1),
        ("0:r", True),
        ("0:r", "60"),
        ("0:r", 10**9),
        ("0:r", float("nan")),
    ],
)
def test_claim_validates_its_arguments(db: Path, key: object, window: object) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as info:
            await store.claim_request_id(key, window)  # type: ignore[arg-type]
        assert info.value.code is ErrorCode.INVALID_ARGUMENTS

    with_store(db, body)


def test_a_schema_1_journal_gains_the_claims_table(db: Path) -> None:
    async def append(store: Store) -> None:
        await store.append(writer="intake", kind="request.received", request_id="r1", payload={})

    with_store(db, append)
    with sqlite3.connect(db, isolation_level=None) as conn:
        conn.execute("DROP TABLE request_ids")
        conn.execute("PRAGMA user_version = 1")

    async def claim(store: Store) -> bool:
        assert store.head()[0] == 1
        return await store.claim_request_id("0:r1", 60)

    assert with_store(db, claim) is True
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_failed_commit_fails_the_claim_closed(db: Path) -> None:
    async def body(store: Store) -> None:
        assert await store.claim_request_id("0:a", 60)
        await store.close()
        with pytest.raises(AirlockError) as info:
            await store.claim_request_id("0:b", 60)
        assert info.value.code is ErrorCode.AUDIT_UNAVAILABLE

    with_store(db, body)

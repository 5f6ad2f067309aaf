from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from journal_support import FakeClock, with_store

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.store import Store

OUTCOME = {"exit_code": 3, "stdout_digest": "ab" * 32, "timed_out": False}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "journal.db"


def _code(excinfo: pytest.ExceptionInfo[AirlockError]) -> ErrorCode:
    return excinfo.value.code


def test_new_then_replay(db: Path) -> None:
    async def body(store: Store) -> None:
        begun = await store.op_begin("op-1", "d1")
        assert (begun.state, begun.outcome) == ("new", None)
        await store.op_complete("op-1", "d1", OUTCOME)
        replay = await store.op_begin("op-1", "d1")
        assert (replay.state, replay.outcome) == ("replay", OUTCOME)
        replay.outcome["exit_code"] = 0  # type: ignore[index]
        again = await store.op_begin("op-1", "d1")
        assert again.outcome == OUTCOME  # each replay is a fresh copy

    with_store(db, body)


def test_conflict_in_progress_and_protected(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d1")
        with pytest.raises(AirlockError) as info:
            await store.op_begin("op-1", "d1")
        assert _code(info) is ErrorCode.OPERATION_IN_PROGRESS
        with pytest.raises(AirlockError) as info:
            await store.op_begin("op-1", "other")
        assert _code(info) is ErrorCode.OPERATION_ID_CONFLICT
        await store.op_complete("op-1", "d1", OUTCOME)
        with pytest.raises(AirlockError) as info:
            await store.op_begin("op-1", "other")
        assert _code(info) is ErrorCode.OPERATION_ID_CONFLICT
        with pytest.raises(AirlockError) as info:
            await store.op_begin("op-1", "d1", has_protected=True)
        assert _code(info) is ErrorCode.PROTECTED_REDELIVERY_FORBIDDEN
        # A fresh operation may carry protected values.
        assert (await store.op_begin("op-2", "d2", has_protected=True)).state == "new"

    with_store(db, body)


def test_complete_rules(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d1")
        with pytest.raises(AirlockError) as info:
            await store.op_complete("op-1", "other", OUTCOME)
        assert _code(info) is ErrorCode.OPERATION_ID_CONFLICT
        await store.op_complete("op-1", "d1", OUTCOME)
        await store.op_complete("op-1", "d1", {"different": True})  # repeated completion: first one stays
        assert (await store.op_begin("op-1", "d1")).outcome == OUTCOME
        # Begun before a journal restart (active state lost): still stored.
        await store.op_complete("op-9", "d9", OUTCOME)
        assert (await store.op_begin("op-9", "d9")).state == "replay"
        with pytest.raises(AirlockError) as info:
            await store.op_complete("op-3", "d3", {"x": float("inf")})
        assert _code(info) is ErrorCode.INVALID_ARGUMENTS
        for bad in ("", "x" * 257):
            with pytest.raises(AirlockError) as info:
                await store.op_begin(bad, "d")
            assert _code(info) is ErrorCode.INVALID_ARGUMENTS

    with_store(db, body)


def test_abandon_allows_a_rerun(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d1")
        await store.op_abandon("op-1")
        assert (await store.op_begin("op-1", "d1")).state == "new"
        await store.op_abandon("op-1")
        assert (await store.op_begin("op-1", "another digest is fine now")).state == "new"

    with_store(db, body)


def test_expiry_counts_from_completion_and_replay_does_not_refresh(db: Path) -> None:
    clock = FakeClock()

    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d1")
        clock.now += 50  # a long run: retention starts at completion
        await store.op_complete("op-1", "d1", OUTCOME)
        clock.now += 99
        assert (await store.op_begin("op-1", "d1")).state == "replay"
        clock.now += 0.5
        assert (await store.op_begin("op-1", "d1")).state == "replay"
        clock.now += 0.5  # 100 s after completion, despite the replays
        begun = await store.op_begin("op-1", "other digest: not a conflict once expired")
        assert begun.state == "new"

    with_store(db, body, operation_retention=100, clock=clock)


def test_capacity_evicts_oldest_first(db: Path) -> None:
    clock = FakeClock()

    async def body(store: Store) -> None:
        for i in range(5):
            clock.now += 1
            await store.op_begin(f"op-{i}", "d")
            await store.op_complete(f"op-{i}", "d", {"i": i})
        assert (await store.op_begin("op-0", "d")).state == "new"
        assert (await store.op_begin("op-1", "d")).state == "new"
        for i in (2, 3, 4):
            assert (await store.op_begin(f"op-{i}", "d")).outcome == {"i": i}

    with_store(db, body, operation_capacity=3, clock=clock)
    conn = sqlite3.connect(db)
    assert [r[0] for r in conn.execute("SELECT operation_id FROM operations ORDER BY ord")] == ["op-2", "op-3", "op-4"]
    conn.close()


def test_one_agents_operations_never_evict_anothers(db: Path) -> None:
    """Issue 39 item 11: each agent (intake's u<uid>: key) has its own share; a flood evicts only its own."""
    clock = FakeClock()

    async def body(store: Store) -> None:
        await store.op_begin("u1:a", "d")
        await store.op_complete("u1:a", "d", {"who": "a"})
        for i in range(6):
            clock.now += 1
            await store.op_begin(f"u2:{i}", "d")
            await store.op_complete(f"u2:{i}", "d", {"i": i})
        assert (await store.op_begin("u1:a", "d")).outcome == {"who": "a"}
        assert [(await store.op_begin(f"u2:{i}", "d")).state for i in (4, 5)] == ["replay", "replay"]
        assert (await store.op_begin("u2:3", "d")).state == "new"  # its own oldest went

    with_store(db, body, operation_capacity=100, operation_capacity_per_agent=2, clock=clock)
    conn = sqlite3.connect(db)
    # The stored table holds what memory holds (u2:3 was begun again, not settled).
    assert sorted(r[0] for r in conn.execute("SELECT operation_id FROM operations")) == ["u1:a", "u2:4", "u2:5"]
    conn.close()


def test_a_full_store_refuses_new_work_busy_instead_of_evicting(db: Path) -> None:
    clock = FakeClock()

    async def body(store: Store) -> None:
        for i in range(3):
            clock.now += 1
            await store.op_begin(f"u1:{i}", "d")
            await store.op_complete(f"u1:{i}", "d", {"i": i})
        with pytest.raises(AirlockError) as refused:
            await store.op_begin("u2:x", "d")  # nothing of its own to give up: busy
        assert _code(refused) is ErrorCode.BUSY
        assert (await store.op_begin("u1:0", "d")).state == "replay"  # nothing was evicted
        # u1 may go on: its own oldest makes room.
        await store.op_begin("u1:3", "d")
        await store.op_complete("u1:3", "d", {"i": 3})
        assert (await store.op_begin("u1:0", "d")).state == "new"
        assert (await store.op_begin("u1:3", "d")).state == "replay"
        clock.now += 400  # expired outcomes free the store
        assert (await store.op_begin("u2:x", "d")).state == "new"

    with_store(db, body, operation_capacity=3, operation_capacity_per_agent=3, clock=clock)


def test_restart_keeps_settled_operations_not_active_ones(db: Path) -> None:
    clock = FakeClock()

    async def first(store: Store) -> None:
        await store.op_begin("done", "d")
        await store.op_complete("done", "d", OUTCOME)
        await store.op_begin("running", "d")

    with_store(db, first, clock=clock)

    async def second(store: Store) -> None:
        assert (await store.op_begin("done", "d")).outcome == OUTCOME
        assert (await store.op_begin("running", "d")).state == "new"

    with_store(db, second, clock=clock)

    clock.now += 301

    async def third(store: Store) -> None:
        assert (await store.op_begin("done", "d")).state == "new"

    with_store(db, third, clock=clock)


def test_restart_applies_a_smaller_capacity(db: Path) -> None:
    clock = FakeClock()

    async def fill(store: Store) -> None:
        for i in range(4):
            clock.now += 1
            await store.op_complete(f"op-{i}", "d", {"i": i})

    with_store(db, fill, clock=clock)

    async def check(store: Store) -> None:
        assert (await store.op_begin("op-3", "d")).state == "replay"
        assert (await store.op_begin("op-2", "d")).state == "replay"
        assert (await store.op_begin("op-1", "d")).state == "new"

    with_store(db, check, operation_capacity=2, clock=clock)


def test_concurrent_begin_one_wins(db: Path) -> None:
    async def body(store: Store) -> None:
        results = await asyncio.gather(*(store.op_begin("op-1", "d") for _ in range(10)), return_exceptions=True)
        assert sum(1 for r in results if not isinstance(r, BaseException)) == 1
        assert all(r.code is ErrorCode.OPERATION_IN_PROGRESS for r in results if isinstance(r, AirlockError))

    with_store(db, body)


def test_in_progress_while_the_outcome_commits(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d")
        completing = asyncio.create_task(store.op_complete("op-1", "d", OUTCOME))
        await asyncio.sleep(0)
        with pytest.raises(AirlockError) as info:
            await store.op_begin("op-1", "d")
        assert _code(info) is ErrorCode.OPERATION_IN_PROGRESS
        await completing
        assert (await store.op_begin("op-1", "d")).state == "replay"

    with_store(db, body)


def test_a_full_store_says_busy_before_anything_is_written(db: Path) -> None:
    async def body(store: Store) -> None:
        await store.op_begin("u1:a", "d")
        await store.op_complete("u1:a", "d", OUTCOME)
        with pytest.raises(AirlockError) as refused:
            store.op_room("u2:b")  # journal.service checks this before the claim and request.received
        assert _code(refused) is ErrorCode.BUSY
        store.op_room("u1:a")  # control: a replay always has room
        store.op_room("u1:c")  # and an owner with an outcome of its own to give up

    with_store(db, body, operation_capacity=1, operation_capacity_per_agent=1)

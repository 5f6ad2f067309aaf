"""Deferred appends (issue 21): queued without waiting, durable with a later durable commit that names them."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest
from journal_support import with_store

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.store import DEFER_LINGER, Store


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "journal.db"


def _kinds(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [row[0] for row in conn.execute("SELECT kind FROM events WHERE request_id = 'r1' ORDER BY seq")]
    finally:
        conn.close()


def _defer(store: Store, kind: str, writer: str, **extra: Any) -> str | None:
    return store.append_deferred(writer=writer, kind=kind, request_id="r1", payload={"k": kind}, **extra)


def test_a_request_its_decision_and_exec_started_cost_one_commit(db: Path) -> None:
    async def body(store: Store) -> None:
        before = store.stats.transactions
        received = _defer(store, "request.received", "intake", claim=("1000:r1", 300))
        decided = _defer(store, "approval.decided", "approval")
        assert received and decided and received.startswith(store.boot + ":")
        started = await store.append(
            writer="runner",
            kind="exec.started",
            request_id="r1",
            payload={},
            after=store.parse_marks([received, decided]),
        )
        assert store.stats.transactions - before == 1  # one fsync for all three
        assert started.seq == 3
        assert await store.sync([received, decided]) == []

    with_store(db, body)
    assert _kinds(db) == ["request.received", "approval.decided", "exec.started"]


def test_a_failed_transaction_fails_the_durable_append_that_names_its_marks(db: Path) -> None:
    async def body(store: Store) -> None:
        real = store.writer._write
        calls = 0

        def failing_once(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise sqlite3.OperationalError("database or disk is full")
            return real(*args)

        store.writer._write = failing_once  # type: ignore[method-assign,assignment]
        received = _defer(store, "request.received", "intake")
        assert received is not None
        assert await store.sync([received]) == [received]  # its transaction failed
        with pytest.raises(AirlockError) as err:
            await store.append(
                writer="runner", kind="exec.started", request_id="r1", payload={}, after=store.parse_marks([received])
            )
        assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
        # Control: the same append without the lost mark commits (the store itself works again).
        await store.append(writer="runner", kind="exec.refused", request_id="r1", payload={})

    with_store(db, body)
    assert _kinds(db) == ["exec.refused"]  # no exec.started for a request whose records were lost


def test_the_failure_is_found_even_when_the_durable_append_is_queued_before_it_is_known(db: Path) -> None:
    """exec.started queued while the deferred record's transaction is still running, and failing."""

    async def body(store: Store) -> None:
        real = store.writer._write
        release = threading.Event()
        calls = 0

        def failing_once(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                release.wait(10)
                raise sqlite3.OperationalError("disk I/O error")
            return real(*args)

        store.writer._write = failing_once  # type: ignore[method-assign,assignment]
        received = _defer(store, "request.received", "intake")
        assert received is not None
        await asyncio.sleep(DEFER_LINGER + 0.1)  # the writer now holds it in a transaction
        after = store.parse_marks([received])  # not known to have failed yet: accepted
        started = asyncio.ensure_future(
            store.append(writer="runner", kind="exec.started", request_id="r1", payload={}, after=after)
        )
        await asyncio.sleep(0.05)
        release.set()
        with pytest.raises(AirlockError) as err:
            await started
        assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
        assert calls == 1  # refused before its own transaction, not failed with it

    with_store(db, body)
    assert _kinds(db) == []


def test_marks_of_an_earlier_journal_process_are_refused(db: Path) -> None:
    async def first(store: Store) -> str:
        mark = _defer(store, "request.received", "intake")
        assert mark is not None
        return mark

    old = with_store(db, first)
    assert _kinds(db) == ["request.received"]  # closing commits what was queued

    async def second(store: Store) -> None:
        assert store.boot != old.split(":")[0]
        # Whether it was committed before the restart is unknown to this process: refused, reported lost.
        with pytest.raises(AirlockError) as err:
            store.parse_marks([old])
        assert err.value.code is ErrorCode.AUDIT_UNAVAILABLE
        assert await store.sync([old]) == [old]
        # A mark this process never issued is refused too.
        with pytest.raises(AirlockError):
            store.parse_marks([f"{store.boot}:99"])
        with pytest.raises(AirlockError) as bad:
            store.parse_marks(["nonsense"])
        assert bad.value.code is ErrorCode.INVALID_ARGUMENTS

    with_store(db, second)


def test_a_deferred_claim_is_decided_at_once_and_holds_while_queued(db: Path) -> None:
    async def body(store: Store) -> None:
        assert _defer(store, "request.received", "intake", claim=("1000:r1", 300)) is not None
        # Still queued: a second claim of the key loses, deferred or durable.
        assert _defer(store, "request.received", "intake", claim=("1000:r1", 300)) is None
        assert await store.claim_request_id("1000:r1", 300) is False
        # Committed now: still held.
        assert _defer(store, "request.received", "intake", claim=("1000:r1", 300)) is None
        assert _defer(store, "request.received", "intake", claim=("1001:r1", 300)) is not None

    with_store(db, body)
    assert _kinds(db) == ["request.received", "request.received"]


def test_a_deferred_record_naming_a_lost_mark_is_not_written_and_its_own_mark_is_lost(db: Path) -> None:
    """approval's deferred decision names intake's mark: a decision for a request the journal lost is lost too."""

    async def body(store: Store) -> None:
        real = store.writer._write
        release = threading.Event()
        calls = 0

        def failing_once(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                release.wait(10)
                raise sqlite3.OperationalError("disk I/O error")
            return real(*args)

        store.writer._write = failing_once  # type: ignore[method-assign,assignment]
        received = _defer(store, "request.received", "intake")
        assert received is not None
        await asyncio.sleep(DEFER_LINGER + 0.1)  # in the writer's (failing) transaction now
        decided = store.append_deferred(
            writer="approval", kind="approval.decided", request_id="r1", payload={}, after=store.parse_marks([received])
        )
        other = store.append_deferred(writer="approval", kind="approval.decided", request_id="r1", payload={"x": 1})
        assert decided is not None and other is not None
        release.set()
        assert await store.sync([received, decided, other]) == [received, decided]
        # Control: `other` names no mark and is written in the same transaction `decided` was dropped from.

    with_store(db, body)
    assert _kinds(db) == ["approval.decided"]


def test_deferred_records_alone_wait_briefly_for_a_durable_one_then_commit(db: Path) -> None:
    async def body(store: Store) -> None:
        _defer(store, "request.received", "intake")
        await asyncio.sleep(DEFER_LINGER / 4)
        assert store.stats.transactions == 0  # lingering: a durable record may still join
        _defer(store, "approval.decided", "approval")
        await store.append(writer="runner", kind="exec.started", request_id="r1", payload={})
        assert store.stats.transactions == 1  # the three in one commit
        _defer(store, "exec.finished", "runner")
        await asyncio.sleep(DEFER_LINGER * 3)
        assert store.stats.transactions == 2  # nobody came: committed on its own

    with_store(db, body)
    assert _kinds(db) == ["request.received", "approval.decided", "exec.started", "exec.finished"]


def test_the_end_record_the_reply_and_the_outcome_cost_one_commit(db: Path) -> None:
    """Issue 50 item 2: the runner's exec.finished (deferred) and intake's request.replied with the
    settled outcome (op.complete) land in one transaction, though two services write them."""

    async def body(store: Store) -> None:
        await store.op_begin("op-1", "d1")
        before = store.stats.transactions
        finished = _defer(store, "exec.finished", "runner")
        assert finished is not None
        after = store.parse_marks([finished])
        replied = store.append(writer="intake", kind="request.replied", request_id="r1", payload={}, after=after)
        await asyncio.gather(store.op_complete("op-1", "d1", {"exit_code": 0}, after), replied)
        assert store.stats.transactions - before == 1  # one fsync for the end, the reply and the outcome

    with_store(db, body)
    assert _kinds(db) == ["exec.finished", "request.replied"]

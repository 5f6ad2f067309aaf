"""Shared helpers for the journal tests (imported from the test directory)."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from airlock.journal.store import Event, Store

T = TypeVar("T")


def run(coro: Awaitable[T]) -> T:
    async def main() -> T:
        return await coro

    return asyncio.run(main())


class FakeClock:
    def __init__(self, now: float = 1_790_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def fill(
    store: Store, count: int, *, writer: str = "intake", kind: str = "request.received", **fields: Any
) -> list[Event]:
    """Append ``count`` events one after another (seq 1..count on an empty store)."""
    out = []
    for i in range(count):
        out.append(await store.append(writer=writer, kind=kind, request_id=f"req-{i}", payload={"i": i}, **fields))
    return out


def tamper(path: Path, *statements: str) -> None:
    """Edit the database the way an attacker with the file would: triggers off first."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("DROP TRIGGER IF EXISTS events_no_update")
        conn.execute("DROP TRIGGER IF EXISTS events_no_delete")
        for statement in statements:
            conn.execute(statement)
    finally:
        conn.close()


def with_store(path: Path, body: Callable[[Store], Awaitable[T]], **options: Any) -> T:
    async def main() -> T:
        store = Store.open(path, **options)
        try:
            return await body(store)
        finally:
            await store.close()

    return asyncio.run(main())

"""approval/restore.py: approval's grants and their uses read back through the journal's generic ``records``
read (a real store answering it, journal/select.py), page by page."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from airlock.approval import restore
from airlock.common.wire.journal import RECORDS, Found, Records
from airlock.common.wire.verb import Verb
from airlock.journal import select
from airlock.journal.store import Store


class StoreJournal:
    """The journal's ``records`` verb over a real database, as a `Stub` would reach it."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.calls = 0

    async def call(self, verb: Verb[Records, Found], args: Records, *, timeout: float | None = None) -> Found:
        assert verb is RECORDS
        self.calls += 1
        return await asyncio.to_thread(select.records, self.db, Records.from_dict(args.to_dict()))


def _grant(grant_id: str, uses: int | None) -> dict[str, Any]:
    return {"action": "grant", "grant_id": grant_id, "grant": {"grant_id": grant_id, "uses": uses}}


def test_every_use_of_a_limited_grant_comes_back_across_pages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(restore, "MAX_RECORDS", 4)  # pages of 4 decisions
    db = tmp_path / "journal.sqlite"

    async def body() -> None:
        store = Store.open(db)
        await store.append(writer="approval", kind="approval.decided", payload={"by": "grant", "grant_id": "g1"})
        await store.append(writer="approval", kind="operator.action", payload=_grant("g1", 20))
        await store.append(writer="approval", kind="operator.action", payload=_grant("g2", None))
        for _ in range(9):
            await store.append(writer="approval", kind="approval.decided", payload={"by": "grant", "grant_id": "g1"})
        await store.append(writer="approval", kind="approval.decided", payload={"by": "grant", "grant_id": "g2"})
        # Not a use: a person decided, or an agent's own words in intake's records.
        await store.append(writer="approval", kind="approval.decided", payload={"by": "op1", "grant_id": "g1"})
        await store.append(writer="intake", kind="request.received", payload={"by": "grant", "grant_id": "g1"})
        journal = StoreJournal(db)
        records = await restore.grant_records(journal, 5)  # type: ignore[arg-type]
        used = [r for r in records if r["action"] == "grant.used"]
        assert len(used) == 9 and {r["grant_id"] for r in used} == {"g1"}  # the use before the grant is not its
        assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)
        assert journal.calls >= 4  # the grants, then the decisions in pages of 4
        await store.close()

    asyncio.run(body())


def test_an_older_journals_opening_record_is_still_read() -> None:
    """Before the generic read an opening record carried approval's own reading of its records; a journal
    that rolled over then still restores its hold and its grants."""
    hold = {"seq": 3, "time": "T", "peer_uid": 0, "action": "hold", "operator": "root", "reason": "x", "since": "S"}
    grant = {"seq": 4, "action": "grant", "grant_id": "g1", "grant": {"grant_id": "g1"}}
    found = Found((), {"hold": hold, "grants": [grant]})
    assert restore.hold_from(found) == hold
    assert restore.grants_from(found) == [grant]
    raw = {"seq": 9, "time": "T2", "peer_uid": 0, "kind": "operator.action", "writer": "approval"}
    live = Found((raw | {"payload": {"action": "release", "operator": "root"}},), {"hold": hold})
    released = restore.hold_from(live)
    assert released is not None and (released["action"], released["seq"]) == ("release", 9)


def test_every_denial_comes_back_across_pages_whatever_came_between(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 45: people's denials are read completely (page by page), never only the newest few records."""
    monkeypatch.setattr(restore, "MAX_RECORDS", 4)
    db = tmp_path / "journal.sqlite"

    async def body() -> None:
        store = Store.open(db)
        for n in range(11):
            denial = {"uid": 1000, "run_as": 0, "stages": [{"path": "/usr/bin/id", "dev": 1, "ino": n, "args": []}]}
            await store.append(
                writer="approval",
                kind="approval.decided",
                payload={"decision": "deny", "by": "op1", "remembered": "denial", "denial": denial | {"at": 1.0}},
            )
            for _ in range(20):  # unrelated records between them
                await store.append(writer="approval", kind="approval.decided", payload={"decision": "allow"})
        # An agent's own words in intake's records are no denial.
        await store.append(writer="intake", kind="request.received", payload={"remembered": "denial", "denial": {}})
        journal = StoreJournal(db)
        found = await restore.denial_records(journal, 5)  # type: ignore[arg-type]
        assert [d["stages"][0]["ino"] for d in found] == list(range(11))
        assert journal.calls == 3
        await store.close()

    asyncio.run(body())

"""The journal's generic ``records`` read as approval asks it for its hold: the newest hold or release, from
approval's records only (journal/select.py answers, approval/restore.py interprets)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from journal_support import with_store

from airlock.approval import restore
from airlock.journal import select
from airlock.journal.store import Store


def latest_hold(db: Path) -> dict[str, Any] | None:
    return restore.hold_from(select.records(db, restore.HOLD_QUERY))


def test_the_newest_hold_or_release_wins_and_other_records_do_not_count(tmp_path: Path) -> None:
    db = tmp_path / "journal.sqlite"

    async def body(store: Store) -> None:
        assert latest_hold(db) is None  # never held: not held
        await store.append(
            writer="approval",
            kind="operator.action",
            peer_uid=1001,
            payload={"action": "hold", "operator": "op1", "reason": "incident", "since": "T1"},
        )
        await store.append(
            writer="approval",
            kind="operator.action",
            peer_uid=1001,
            payload={"action": "approve", "operator": "op1", "reason": ""},
        )
        await store.append(
            writer="intake", kind="request.received", operation_id="hold", payload={"action": "release"}
        )  # an agent's words are not an operator's action
        held = latest_hold(db)
        assert held is not None
        assert (held["action"], held["operator"], held["peer_uid"], held["reason"], held["since"]) == (
            "hold",
            "op1",
            1001,
            "incident",
            "T1",
        )
        await store.append(
            writer="approval", kind="operator.action", peer_uid=0, payload={"action": "release", "operator": "root"}
        )
        released = latest_hold(db)
        assert released is not None and released["action"] == "release" and released["seq"] > held["seq"]

    with_store(db, body)

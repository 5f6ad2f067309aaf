"""The journal's door as `wire.serve` builds it: who may call which verb, what a malformed message gets,
and the generic ``records`` read (only the named writers' records, whatever an agent wrote)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from journal_support import with_store

from airlock.approval import restore
from airlock.common import config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.common.wire import journal as wire
from airlock.common.wire.verb import declared, serve
from airlock.journal.service import Journal
from airlock.journal.store import Store

INTAKE, APPROVAL, RUNNER = 1001, 1002, 1003


@dataclass
class FakeCall:
    peer: Peer
    args: dict[str, Any] = field(default_factory=dict)


def peer(uid: int) -> Peer:
    return Peer(pid=1, uid=uid, gid=uid, user=f"u{uid}", group_ids=(uid,), groups=frozenset())


def door(tmp_path: Path, store: Store) -> dict[str, Any]:
    cfg = config.parse_text(f"paths:\n  state_dir: {tmp_path}\n", "/t.yaml")
    journal = Journal(cfg, store)
    journal.writers = {INTAKE: {"intake"}, APPROVAL: {"approval"}, RUNNER: {"runner"}}
    return serve(wire.DOOR, journal.verbs(), caller_of=journal.callers)


def test_the_door_serves_exactly_the_declared_verbs(tmp_path: Path) -> None:
    async def body(store: Store) -> None:
        assert set(door(tmp_path, store)) == set(declared(wire.DOOR))

    with_store(tmp_path / "journal.sqlite", body)


@pytest.mark.parametrize(
    ("uid", "verb", "args"),
    [
        (RUNNER, "op.begin", {"operation_id": "1:op", "digest": "d"}),
        (APPROVAL, "request.claim", {"key": "1:r", "window_seconds": 60}),
        (INTAKE, "records", {"writers": ["approval"], "kinds": ["operator.action"]}),
        (INTAKE, "verify", {}),
        (RUNNER, "head", {}),
        (4242, "append", {"kind": "x"}),  # not a service at all
    ],
)
def test_a_verb_not_declared_for_the_caller_is_refused_before_its_arguments(
    tmp_path: Path, uid: int, verb: str, args: dict[str, Any]
) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as caught:
            await door(tmp_path, store)[verb](FakeCall(peer(uid), args))
        assert caught.value.code is ErrorCode.UNAUTHORIZED
        assert store.head()[0] == 0  # nothing written

    with_store(tmp_path / "journal.sqlite", body)


@pytest.mark.parametrize(
    ("args", "field_name"),
    [
        ({"payload": {}}, "kind"),
        ({"kind": "x", "payload": []}, "payload"),
        ({"kind": "x", "peer_uid": "0"}, "peer_uid"),
        ({"kind": "x", "after": "1:1"}, "after"),
        ({"kind": "x", "seq": 7}, "seq"),  # no caller picks its own place in the chain
        ({"kind": "k" * 65}, "kind"),
    ],
)
def test_a_malformed_append_is_refused_with_its_field_and_writes_nothing(
    tmp_path: Path, args: dict[str, Any], field_name: str
) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as caught:
            await door(tmp_path, store)["append"](FakeCall(peer(RUNNER), args))
        assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
        assert caught.value.details["field"] == field_name
        assert store.head()[0] == 0

    with_store(tmp_path / "journal.sqlite", body)


def test_the_writer_is_the_peers_service_whatever_the_message_claims(tmp_path: Path) -> None:
    async def body(store: Store) -> None:
        table = door(tmp_path, store)
        reply = await table["append"](FakeCall(peer(RUNNER), {"kind": "exec.started", "writer": "intake"}))
        assert reply["seq"] == 1
        page = await table["events"](FakeCall(peer(RUNNER), {"tail": 1}))
        assert page["events"][0]["writer"] == "runner"

    with_store(tmp_path / "journal.sqlite", body)


def test_records_returns_only_the_named_writers_records_and_approval_reads_its_hold(tmp_path: Path) -> None:
    async def body(store: Store) -> None:
        table = door(tmp_path, store)
        hold = {"action": "hold", "operator": "op1", "reason": "incident", "since": "T1"}
        await table["append"](FakeCall(peer(APPROVAL), {"kind": "operator.action", "peer_uid": 7, "payload": hold}))
        # An agent's words, in intake's records, are not an operator's action.
        release = {"kind": "request.received", "operation_id": "hold", "payload": {"action": "release"}}
        await table["append"](FakeCall(peer(INTAKE), release))
        query = restore.HOLD_QUERY.to_dict()
        found = wire.Found.from_dict(await table["records"](FakeCall(peer(APPROVAL), query)))
        assert [r["writer"] for r in found.records] == ["approval"]
        # Even asked for both kinds, only the named writers' records come back.
        query |= {"kinds": ["operator.action", "request.received"], "limit": 10}
        both = wire.Found.from_dict(await table["records"](FakeCall(peer(APPROVAL), query)))
        assert [r["seq"] for r in both.records] == [1]
        query |= {"writers": ["approval", "intake"]}
        both = wire.Found.from_dict(await table["records"](FakeCall(peer(APPROVAL), query)))
        assert [r["seq"] for r in both.records] == [1, 2]  # the control: the query reaches intake's record
        held = restore.hold_from(found)
        assert held is not None and (held["action"], held["reason"], held["peer_uid"]) == ("hold", "incident", 7)

    with_store(tmp_path / "journal.sqlite", body)


@pytest.mark.parametrize(
    "args",
    [
        {"writers": [], "kinds": ["x"]},
        {"writers": ["approval"], "kinds": ["x"], "fields": {"a') OR 1=1 --": "x"}},
        {"writers": ["approval"], "kinds": ["x"], "pick": ["$.a"]},
        {"writers": ["approval"], "kinds": ["x"], "limit": 100000},
    ],
)
def test_a_malformed_records_query_is_refused(tmp_path: Path, args: dict[str, Any]) -> None:
    async def body(store: Store) -> None:
        with pytest.raises(AirlockError) as caught:
            await door(tmp_path, store)["records"](FakeCall(peer(APPROVAL), args))
        assert caught.value.code is ErrorCode.INVALID_ARGUMENTS

    with_store(tmp_path / "journal.sqlite", body)

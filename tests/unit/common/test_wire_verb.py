"""`common.wire.verb`: what a malformed message gets, what a door table refuses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire import verb as wire
from airlock.common.wire.verb import Caller, DoorName, Empty, Message


@dataclass(frozen=True)
class Inner(Message):
    n: int


@dataclass(frozen=True)
class Sample(Message):
    name: str
    argv: tuple[str, ...] = ()
    limit: int | None = None
    ratio: float = 1.0
    flag: bool = False
    payload: dict[str, Any] = field(default_factory=dict)
    inner: Inner | None = None
    door: DoorName | None = None
    token_id: str | None = field(default=None, metadata={"key": "token.id"})

    def check(self) -> None:
        if len(self.name) > 8:
            raise AirlockError(ErrorCode.INVALID_ARGUMENTS, "name: too long", {"field": "name"})


def test_a_message_round_trips_through_its_one_encoding() -> None:
    m = Sample("a", ("x", "y"), 3, 0.5, True, {"k": [1]}, Inner(2), DoorName.RUNNER, "t")
    encoded = m.to_dict()
    assert encoded["token.id"] == "t" and encoded["door"] == "runner" and encoded["argv"] == ["x", "y"]
    assert Sample.from_dict(encoded) == m


def test_none_fields_are_left_out_of_the_encoding() -> None:
    assert Sample("a").to_dict() == {"name": "a", "argv": [], "ratio": 1.0, "flag": False, "payload": {}}


@pytest.mark.parametrize(
    ("untrusted", "field_name"),
    [
        ({}, "name"),
        ({"name": 1}, "name"),
        ({"name": "a", "argv": "ls"}, "argv"),
        ({"name": "a", "argv": ["ls", 1]}, "argv[1]"),
        ({"name": "a", "limit": True}, "limit"),
        ({"name": "a", "flag": 1}, "flag"),
        ({"name": "a", "payload": []}, "payload"),
        ({"name": "a", "inner": {"n": "1"}}, "inner.n"),
        ({"name": "a", "door": "nowhere"}, "door"),
        ({"name": "a", "extra": 1}, "extra"),
        ({"name": "a" * 9}, "name"),
    ],
)
def test_a_malformed_message_is_refused_with_its_field(untrusted: dict[str, Any], field_name: str) -> None:
    with pytest.raises(AirlockError) as caught:
        Sample.from_dict(untrusted)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENTS
    assert caught.value.details["field"] == field_name


@given(st.dictionaries(st.text(max_size=6), st.none() | st.booleans() | st.integers() | st.text(max_size=6)))
def test_any_object_decodes_or_is_refused_cleanly(untrusted: dict[str, Any]) -> None:
    try:
        m = Sample.from_dict(untrusted)
    except AirlockError as exc:
        assert exc.code is ErrorCode.INVALID_ARGUMENTS
    else:
        assert Sample.from_dict(m.to_dict()) == m


def test_a_door_table_is_exactly_the_declared_verbs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(wire._DECLARED, DoorName.AGENT, {})
    ping = wire.declare(DoorName.AGENT, "ping", {Caller.AGENT}, Empty, Empty, "liveness")
    echo = wire.declare(DoorName.AGENT, "echo", {Caller.AGENT}, Sample, Sample, "echo")
    with pytest.raises(ValueError, match="declared twice"):
        wire.declare(DoorName.AGENT, "ping", {Caller.AGENT}, Empty, Empty, "again")

    async def handle_ping(call: Any, args: Empty) -> Empty:
        return Empty()

    async def handle_echo(call: Any, args: Sample) -> Sample:
        return args

    with pytest.raises(ValueError, match="does not serve declared verbs: echo"):
        wire.serve(DoorName.AGENT, {ping: handle_ping})
    stranger = wire.Verb(DoorName.AGENT, "stranger", frozenset(), Empty, Empty, "")
    with pytest.raises(ValueError, match="not declared"):
        wire.serve(DoorName.AGENT, {ping: handle_ping, echo: handle_echo, stranger: handle_ping})
    table = wire.serve(DoorName.AGENT, {ping: handle_ping, echo: handle_echo})
    assert set(table) == {"ping", "echo"}

    class FakeCall:
        args = {"name": "n", "argv": ["a"]}

    assert asyncio.run(table["echo"](FakeCall())) == Sample("n", ("a",)).to_dict()  # type: ignore[arg-type]
    FakeCall.args = {"name": 5}  # type: ignore[dict-item]
    with pytest.raises(AirlockError):
        asyncio.run(table["echo"](FakeCall()))  # type: ignore[arg-type]


@dataclass(frozen=True)
class Shown(Message):
    name: str
    found: str | None = field(default=None, metadata={"null": True})


def test_a_field_marked_null_is_carried_as_null_and_decodes_back() -> None:
    assert Shown("a").to_dict() == {"name": "a", "found": None}
    assert Shown.from_dict(Shown("a").to_dict()) == Shown("a")
    assert Shown.from_dict({"name": "a"}) == Shown("a")

"""Time-boxed grants (issue 18): what a grant covers, and rebuilding them from the journal's records."""

from __future__ import annotations

import pytest

from airlock.approval.grants import Grant, Grants, restore
from airlock.common.validate import parse_duration


def grant(**changes: object) -> Grant:
    values: dict[str, object] = dict(
        grant_id="g-1",
        uid=1000,
        session="s1",
        scope="command",
        digest="d" * 64,
        rule="touchy",
        expires=2000.0,
        made_by="root",
        request_id="r-1",
        command="touch /x",
    )
    values.update(changes)
    return Grant(**values)  # type: ignore[arg-type]


def test_a_command_grant_covers_the_same_requester_session_and_spec_only() -> None:
    g = grant()
    assert g.covers(1000, "s1", "d" * 64, "touchy", ["touchy"])
    assert not g.covers(1001, "s1", "d" * 64, "touchy", ["touchy"])  # another uid
    assert not g.covers(1000, "s2", "d" * 64, "touchy", ["touchy"])  # another session
    assert not g.covers(1000, None, "d" * 64, "touchy", ["touchy"])
    assert not g.covers(1000, "s1", "e" * 64, "touchy", ["touchy"])  # another command
    assert grant(session=None).covers(1000, "any", "d" * 64, "x", [])  # a grant without a session: any session


def test_a_rule_grant_covers_what_every_asking_stage_owes_to_that_rule() -> None:
    g = grant(scope="rule")
    assert g.covers(1000, "s1", "other", "touchy", ["touchy", "touchy"])
    assert not g.covers(1000, "s1", "other", "touchy", ["touchy", "default"])
    assert not g.covers(1000, "s1", "other", "default", ["default"])


def test_the_store_finds_live_grants_only() -> None:
    store = Grants()
    store.add(grant())
    assert store.find(1999.0, 1000, "s1", "d" * 64, "touchy", ["touchy"]) is not None
    assert store.find(2000.0, 1000, "s1", "d" * 64, "touchy", ["touchy"]) is None
    assert [g.grant_id for g in store.expired(2000.0)] == ["g-1"]
    assert store.remove("g-1") is not None and store.live(0.0) == []


def test_restore_drops_revoked_and_expired_and_ignores_junk() -> None:
    records: list[dict[str, object]] = [
        {"action": "grant", "grant": grant().to_dict()},
        {"action": "grant", "grant": grant(grant_id="g-2").to_dict()},
        {"action": "grant", "grant": grant(grant_id="g-3").to_dict()},
        {"action": "grant.revoke", "grant_id": "g-2"},
        {"action": "grant.expired", "grant_id": "g-3"},
        {"action": "grant", "grant": {"grant_id": "g-bad"}},
        {"action": "grant", "grant": "nonsense"},
    ]
    live, ended = restore(records)
    assert [g.grant_id for g, _ in live] == ["g-1"] and ended == {"g-2", "g-3"}
    assert live[0] == (grant(), 0)


def test_a_grant_of_two_uses_is_used_up_by_the_second_and_leaves_the_live_set_at_once() -> None:
    store = Grants()
    g = grant(uses=2)
    store.add(g)
    assert store.uses_left(g) == 2
    assert store.take(g) == (1, False) and store.uses_left(g) == 1
    assert store.find(0.0, 1000, "s1", "d" * 64, "touchy", ["touchy"]) is g
    assert store.take(g) == (2, True)
    # Gone before anything is awaited: a request racing the last use finds nothing.
    assert store.find(0.0, 1000, "s1", "d" * 64, "touchy", ["touchy"]) is None
    unlimited = grant(grant_id="g-9")
    store.add(unlimited)
    assert store.take(unlimited) == (1, False) and store.uses_left(unlimited) is None


def test_restore_counts_the_uses_journaled_and_ends_a_grant_used_up() -> None:
    records: list[dict[str, object]] = [
        {"action": "grant", "grant": grant(uses=3).to_dict()},
        {"action": "grant.used", "grant_id": "g-1"},
        {"action": "grant", "grant": grant(grant_id="g-2", uses=1).to_dict()},
        {"action": "grant.used", "grant_id": "g-2"},  # stopped before its grant.exhausted record
        {"action": "grant.used", "grant_id": "g-1"},
    ]
    live, ended = restore(records)
    assert live == [(grant(uses=3), 2)] and ended == {"g-2"}
    with pytest.raises(ValueError, match="uses"):
        Grant.from_dict(grant().to_dict() | {"uses": 0})


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("8h", 28800), ("2d", 172800), ("45", 45)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "m", "0m", "-5m", "1.5h", "3w"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)

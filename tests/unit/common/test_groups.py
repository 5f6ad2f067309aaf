"""One touch, many hosts (issue 49): what makes a group, and what each host checks before it counts a vote."""

from __future__ import annotations

import dataclasses

import pytest

from airlock.approval import webauthn
from airlock.approval.statement import Statement
from airlock.common import groups
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.groups import GroupRefused as Refused
from airlock.common.wire import passkey as pk


def on(host: str, **changes: object) -> bytes:
    """The same request as pending on ``host``: its own request ID, nonce and expiry."""
    n = sum(map(ord, host))
    base = Statement(
        host,
        f"req-{host}",
        "b" * 64,
        "allow",
        1_900_000_000 + n,
        f"{n:032x}",
        "agent (uid 1000)",
        "root (uid 0)",
        "apt-get update",
        "patch Tuesday",
        cwd="/root",
        stdin="none",
        fleet_binding="f" * 64,
    )
    return dataclasses.replace(base, **changes).to_bytes()  # type: ignore[arg-type]


HOSTS = ("web1", "web2", "db1")
EXTRAS = webauthn.extras("", None, None)


def test_the_same_request_on_three_hosts_is_one_group_and_each_host_accepts_the_one_challenge() -> None:
    mine = {h: on(h) for h in HOSTS}
    assert list(groups.grouped(mine).values()) == [sorted(HOSTS)]
    group = groups.of(mine.values())
    signed = groups.challenge(group, EXTRAS)
    assert {groups.member_challenge(group, s, EXTRAS) for s in mine.values()} == {signed}
    # Not a single decision's challenge for any member.
    assert all(webauthn.decision_challenge(s, EXTRAS) != signed for s in mine.values())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fleet_binding", "c" * 64),
        ("command", "apt-get updatf"),
        ("cwd", "/root/"),
        ("stdin", "1 bytes, sha256 " + "0" * 64),
        ("run_as", "www (uid 33)"),
        ("requester", "agent (uid 1001)"),
        ("decision", "deny"),
        ("arguments", "x"),
        ("credentials", "TOKEN (run)"),
        ("reason", "patch Tuesday."),
    ],
)
def test_a_request_that_differs_in_one_bound_field_is_never_grouped(field: str, value: str) -> None:
    mine = {"web1": on("web1"), "web2": on("web2"), "db1": on("db1", **{field: value})}
    assert sorted(groups.grouped(mine).values()) == [["db1"], ["web1", "web2"]]
    with pytest.raises(Refused) as refused:
        groups.of(mine.values())
    assert refused.value.reason == "group"
    # A console that lists the odd one anyway: its own host refuses (its key is not the group's).
    same = groups.of([mine["web1"], mine["web2"]])
    slipped = groups.Group(same.key, tuple(sorted([*same.members, groups.statement_digest(mine["db1"])])))
    with pytest.raises(Refused, match="not the group's request"):
        groups.member_challenge(slipped, mine["db1"], EXTRAS)
    # Control: the others still accept the list that names them.
    assert groups.member_challenge(slipped, mine["web1"], EXTRAS) == groups.challenge(slipped, EXTRAS)


def test_a_host_dropped_from_the_list_or_whose_statement_was_altered_refuses() -> None:
    mine = [on(h) for h in ("web1", "web2", "web3")]
    dropped = groups.of(mine[:2])
    with pytest.raises(Refused, match="not in the list"):
        groups.member_challenge(dropped, mine[2], EXTRAS)
    # A statement for the same request but another nonce (asked again, or approval restarted): not listed.
    with pytest.raises(Refused, match="not in the list"):
        groups.member_challenge(groups.of(mine), on("web1", nonce="f" * 32), EXTRAS)


def test_the_challenge_covers_the_key_the_list_and_the_extras() -> None:
    group = groups.of([on(h) for h in HOSTS])
    base = groups.challenge(group, EXTRAS)
    fewer = groups.Group(group.key, group.members[:2])
    assert groups.challenge(fewer, EXTRAS) != base
    assert groups.challenge(group, webauthn.extras("", 3600, "command")) != base
    other_key = groups.Group("e" * 64, group.members)
    assert groups.challenge(other_key, EXTRAS) != base


@pytest.mark.parametrize(
    "carried",
    [
        "x",
        {"key": "a" * 64},
        {"key": "a" * 64, "members": []},
        {"key": "A" * 64, "members": ["a" * 64]},
        {"key": "a" * 64, "members": ["b" * 64, "a" * 64]},  # not sorted
        {"key": "a" * 64, "members": ["a" * 64, "a" * 64]},  # twice
        {"key": "a" * 64, "members": ["a" * 63]},
        {"key": "a" * 64, "members": ["a" * 64], "extra": 1},
        {"key": "a" * 64, "members": ["a" * 64] * (groups.MAX_MEMBERS + 1)},
    ],
)
def test_a_malformed_group_is_refused_by_the_doors_message(carried: object) -> None:
    """``passkey.decide``'s ``group`` (`wire.passkey.Group`): refused, its field named, before a handler runs."""
    with pytest.raises(AirlockError) as refused:
        pk.Decide.from_dict({"id": "r1", "decision": "allow", "group": carried})
    assert refused.value.code is ErrorCode.INVALID_ARGUMENTS
    assert str(refused.value.details["field"]).startswith("group"), refused.value.details


def test_no_group_is_a_single_decision() -> None:
    assert pk.Decide.from_dict({"id": "r1", "decision": "allow"}).group is None
    carried = {"key": "a" * 64, "members": ["a" * 64, "b" * 64]}
    group = pk.Decide.from_dict({"id": "r1", "decision": "allow", "group": carried}).group
    assert group is not None and group.group().to_dict() == carried


def test_a_value_cannot_pass_for_a_blanked_line() -> None:
    """Values are JSON strings on their own line: one that looks like a per-host line is still compared."""
    tricky = on("web1", command='x\nnonce: "0"', reason="host: anything")
    assert len(tricky.split(b"\n")) == len(on("web1").split(b"\n"))
    assert groups.request_key(tricky) != groups.request_key(on("web1"))
    assert groups.request_key(on("web2", command='x\nnonce: "0"', reason="host: anything")) == groups.request_key(
        tricky
    )
    assert groups.fields(tricky.decode())["command"] == 'x\nnonce: "0"'


def test_each_host_s_own_binding_is_per_host_and_the_fleet_binding_decides() -> None:
    """Two real hosts' binaries sit at different inode numbers, so their bindings always differ: the
    request key stands the fleet binding (the same binding less device and inode numbers) in for it."""
    assert groups.request_key(on("web1", binding="c" * 64)) == groups.request_key(on("web2", binding="d" * 64))
    assert groups.request_key(on("web1")) != groups.request_key(on("web2", fleet_binding="e" * 64))
    # A statement without a fleet binding keeps its own binding in the key: never grouped more loosely.
    bare = {h: on(h, binding=b * 64, fleet_binding="") for h, b in (("web1", "c"), ("web2", "d"))}
    assert len(groups.grouped(bare)) == 2
    assert groups.request_key(on("web1", fleet_binding="")) == groups.request_key(on("web2", fleet_binding=""))


def test_the_fleet_binding_leaves_out_device_and_inode_numbers_and_nothing_else() -> None:
    from airlock.approval.pending import fleet_binding, ticket_binding

    def bound(ino: int, **more: object) -> dict[str, object]:
        identity = {"path": "/usr/bin/touch", "dev": 65024 + ino, "ino": ino, "uid": 0, "mode": 33261}
        return {"binaries": [identity], "arguments": [{"path": "/etc/x", "dev": 1, "ino": ino}], **more}

    assert ticket_binding("a" * 64, bound(1)) != ticket_binding("a" * 64, bound(2))  # per host
    assert fleet_binding("a" * 64, bound(1)) == fleet_binding("a" * 64, bound(2))  # the same request
    for other in (
        fleet_binding("b" * 64, bound(1)),  # another spec (argv, environment, sandbox, ...)
        fleet_binding("a" * 64, bound(1, sha256="0" * 64)),  # a reviewed content hash
        fleet_binding("a" * 64, {"binaries": [{"path": "/usr/bin/touch", "uid": 0, "mode": 33260}]}),  # mode
    ):
        assert other != fleet_binding("a" * 64, bound(1))

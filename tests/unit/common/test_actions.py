"""A person's action carried by the fleet console (issue 49): the statement, the list one touch signs."""

from __future__ import annotations

import hashlib

import pytest

from airlock.common import actions, groups
from airlock.common.config import ConfigError, parse_text


def test_the_challenge_covers_the_sorted_list_and_nothing_else() -> None:
    a = actions.render({"host": "web1", "action": "hold", "reason": "incident", "nonce": "1" * 32, "expires": "9"})
    b = actions.render({"host": "web2", "action": "hold", "reason": "incident", "nonce": "2" * 32, "expires": "9"})
    assert a.startswith('airlock action v1\nhost: "web1"\n') and actions.parse(a)["reason"] == "incident"
    da, db = sorted([actions.digest(a), actions.digest(b)])
    both = actions.challenge([da, db])
    text = f"members: 2\n{da}\n{db}\n".encode()
    assert both == hashlib.sha256(b"airlock passkey action v1\n" + text).digest()
    assert actions.challenge([da]) != both  # one host's touch is not two hosts'
    # Never a group's or a decision's challenge over the same digests.
    assert both != groups.challenge(groups.Group("0" * 64, (da, db)), b"{}")
    for bad in ([db, da], [da, da], [], ["A" * 64]):
        with pytest.raises(ValueError, match="members"):
            actions.challenge(bad)


def test_host_groups_name_only_the_console_s_hosts() -> None:
    config = parse_text(
        "web:\n  fleet_hosts: [web1, db1]\n  fleet_groups: {web: [web1], all: [web1, db1]}\n", "/a.yaml"
    )
    assert dict(config.web.fleet_groups) == {"web": ("web1",), "all": ("web1", "db1")}
    with pytest.raises(ConfigError, match=r"web\.fleet_groups\.web: 'web2' not in web\.fleet_hosts"):
        parse_text("web:\n  fleet_hosts: [web1]\n  fleet_groups: {web: [web2]}\n", "/a.yaml")
    with pytest.raises(ConfigError, match="a group lists at least one host"):
        parse_text("web:\n  fleet_hosts: [web1]\n  fleet_groups: {web: []}\n", "/a.yaml")

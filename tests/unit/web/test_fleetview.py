"""The fleet console's view (issue 49): rows grouped by exact request, and statements kept only while current."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from typing import Any

import pytest

from airlock.approval.statement import Statement
from airlock.common.wire.verb import Verb
from airlock.web import fleetview
from airlock.web.fleet import A, Fleet
from airlock.web.fleet import command as host_command


def statement(host: str, rid: str, command: str = "systemctl restart nginx", expires: int = 1_900_000_000) -> str:
    base = Statement(host, rid, "a" * 64, "allow", expires, "1" * 32, "agent (uid 1000)", "root (uid 0)", command, "")
    return dataclasses.replace(base, cwd="/root", stdin="none").render()


def view(host: str, **statements: str) -> fleetview.HostView:
    return fleetview.HostView(host, (), statements, "", 1.0)


def test_the_same_request_on_three_hosts_is_one_row_and_a_differing_one_its_own() -> None:
    views = [
        view("web1", r1=statement("web1", "r1")),
        view("web2", r2=statement("web2", "r2")),
        view("db1", r3=statement("db1", "r3"), r4=statement("db1", "r4", command="systemctl restart nginx ")),
    ]
    rows = fleetview.rows(views)
    assert sorted(r.hosts for r in rows) == [["db1"], ["db1", "web1", "web2"]]
    wide = next(r for r in rows if len(r.hosts) == 3)
    shown = wide.to_dict()
    assert shown["command"] == "systemctl restart nginx" and shown["hosts"] == ["db1", "web1", "web2"]
    assert shown["members"] == [{"host": "db1", "id": "r3"}, {"host": "web1", "id": "r1"}, {"host": "web2", "id": "r2"}]
    alone = fleetview.pick(rows, wide.key, ["web2"])
    assert alone is not None and [m.request_id for m in alone.members] == ["r2"]
    assert fleetview.pick(rows, wide.key, ["nowhere"]) is None and fleetview.pick(rows, "0" * 64) is None


class Scripted(Fleet):
    """A Fleet whose hosts answer from a script (no SSH): what `refresh` asks, and what it keeps."""

    def __init__(self, answers: dict[str, Any]) -> None:
        super().__init__(["web1"])
        self.answers = answers
        self.asked: list[str] = []

    async def call(self, host: str, verb: Verb[A, Any], args: A) -> dict[str, Any]:
        argv, _stdin = host_command(verb, args)  # the host's command line the verb becomes
        self.asked.append(" ".join(argv))
        if argv[0] == "pending":
            return {"ok": True, "data": {"pending": self.answers["pending"]}}
        if argv[0] == "running":
            return {"ok": True, "data": {"running": self.answers.get("running", [])}}
        if argv[0] == "status":
            return {"ok": True, "data": self.answers.get("status", {"hold": False})}
        return {"ok": True, "data": {"statement": self.answers["statements"][argv[-1]]}}


def test_a_statement_is_asked_once_and_again_when_its_request_was_asked_again() -> None:
    first = statement("web1", "r1")
    fleet = Scripted({"pending": [{"request_id": "r1", "expires": 1_900_000_000}], "statements": {"r1": first}})
    asyncio.run(fleet.refresh())
    asyncio.run(fleet.refresh())
    asked = [a for a in fleet.asked if a not in ("running --json", "status --json")]  # asked at each refresh too
    assert asked == ["pending --json", "statement --json -- r1", "pending --json"]
    assert fleet.views["web1"].statements == {"r1": first}
    # Asked again (or approval restarted): a new expiry, a new statement; the old one is not kept.
    again = statement("web1", "r1", expires=1_900_000_500)
    fleet.answers = {"pending": [{"request_id": "r1", "expires": 1_900_000_500}], "statements": {"r1": again}}
    asyncio.run(fleet.refresh())
    assert fleet.views["web1"].statements == {"r1": again}
    # Gone from the host: gone from the view.
    fleet.answers = {"pending": [], "statements": {}}
    asyncio.run(fleet.refresh())
    assert fleet.views["web1"].statements == {} and fleet.views["web1"].error == ""
    shutil.rmtree(fleet.control_dir)


# --- the per-host view and the filters (issue 49) ---------------------------------------------------


def pending(rid: str, user: str, uid: int, rule: str) -> dict[str, Any]:
    return {"request_id": rid, "expires": 1_900_000_000, "peer": {"user": user, "uid": uid}, "rule": rule}


def fleet_views() -> list[fleetview.HostView]:
    job = {
        "operation_id": "op-1",
        "request_id": "r9",
        "stages": [["sleep", "600"]],
        "agent_uid": 1001,
        "agent": "ci",  # `airlock running` names the uids on the host
        "uid": 0,
        "user": "root",
        "started_at": "2026-12-06T03:00:00Z",
    }
    return [
        fleetview.HostView(
            "web1",
            (pending("r1", "ci", 1001, "restarts"),),
            {"r1": statement("web1", "r1")},
            "",
            100.0,
            (job,),
            {"hold": False},
        ),
        fleetview.HostView(
            "web2",
            (pending("r2", "bot", 1002, "restarts"),),
            {"r2": statement("web2", "r2")},
            "",
            100.0,
            (),
            {"hold": True, "hold_reason": "incident", "hold_by": "alice", "hold_since": "2026-12-06T03:01:00Z"},
        ),
        fleetview.HostView(
            "db1", (pending("r3", "ci", 1001, "db"),), {"r3": statement("db1", "r3", command="psql")}, "", 100.0
        ),
    ]


def test_filters_by_host_group_agent_and_rule_narrow_the_rows() -> None:
    groups_ = {"web": ("web1", "web2"), "db": ("db1",)}
    views = fleet_views()

    def hosts(**query: str) -> list[list[str]]:
        return sorted(r.hosts for r in fleetview.rows(views, fleetview.Filters.of(query, groups_)))

    assert hosts() == [["db1"], ["web1", "web2"]]
    assert hosts(group="web") == [["web1", "web2"]]
    assert hosts(group="db") == [["db1"]]
    assert hosts(agent="ci") == [["db1"], ["web1"]]  # by name
    assert hosts(agent="1002") == [["web2"]]  # by uid
    assert hosts(rule="db") == [["db1"]]
    assert hosts(group="web", agent="ci", rule="restarts") == [["web1"]]
    assert hosts(agent="nobody") == []
    with pytest.raises(ValueError, match="no host group 'dbs'"):
        fleetview.Filters.of({"group": "dbs"}, groups_)  # never "no filter": that would show more


def test_a_host_s_panel_has_pending_jobs_hold_relay_lag_collector_and_contact() -> None:
    web1, web2, _db1 = fleet_views()
    mark = fleetview.RelayMark(42, 1000.0, 1003.0)
    one = fleetview.panel(web1, mark, {"ok": True, "proven_to": 40}, now=1010.0)
    assert one["state"] == "ok" and one["pending"] == 1 and one["contact"] == 100.0
    assert one["running"] == [
        {
            "job": "r9",
            "request_id": "r9",
            "operation_id": "op-1",
            "agent_uid": 1001,
            "agent": "ci",
            "as": "root",
            "since": "2026-12-06T03:00:00Z",
            "command": "sleep 600",
        }
    ]
    assert one["relay"] == {"seq": 42, "time": 1000.0, "received": 1003.0, "lag": 10.0}
    assert one["hold"]["held"] is False and one["collector"]["proven_to"] == 40
    two = fleetview.panel(web2)
    assert two["hold"] == {"held": True, "reason": "incident", "by": "alice", "since": "2026-12-06T03:01:00Z"}
    assert two["relay"] is None and two["running"] == []
    # The agent filter keeps a job of that agent only (by name or uid), and counts only its pending requests.
    other = fleetview.panel(web1, filters=fleetview.Filters(agent="1002"))
    assert other["running"] == [] and other["pending"] == 0
    assert len(fleetview.panel(web1, filters=fleetview.Filters(agent="ci"))["running"]) == 1
    assert len(fleetview.panel(web1, filters=fleetview.Filters(agent="1001"))["running"]) == 1
    failing = fleetview.panel(fleetview.HostView("db2", error="unreachable: ssh: timeout"))
    assert failing["state"] == "failing" and failing["hold"] is None


def test_a_relay_post_older_than_the_newest_is_not_kept() -> None:
    fleet = Fleet(["web1"])
    try:
        fleet.relayed("web1", {"seq": 10, "time": "2026-12-06T03:00:00+00:00"}, 5.0)
        fleet.relayed("web1", {"seq": 9, "time": "2026-12-06T02:59:00+00:00"}, 6.0)  # at least once: a repeat
        assert fleet.relays["web1"].seq == 10 and fleet.relays["web1"].received == 5.0
        fleet.relayed("web1", {"seq": 11, "time": "nonsense"}, 7.0)
        assert fleet.relays["web1"] == fleetview.RelayMark(11, None, 7.0)
    finally:
        shutil.rmtree(fleet.control_dir)


def test_the_fleet_page_escapes_every_host_value() -> None:
    from airlock.web import fleetpanel
    from airlock.web.markup import escape

    evil = "<script>alert(1)</script>"
    view = fleetview.HostView(
        "web1",
        (),
        {},
        "",
        100.0,
        ({"operation_id": evil, "stages": [[evil]], "agent_uid": evil, "uid": 0, "started_at": evil},),
        {"hold": True, "hold_reason": evil, "hold_by": evil, "hold_since": evil},
    )
    collected = {"ok": False, "problem": evil, "checked": 5.0}
    shown = fleetpanel.host(fleetview.panel(view, None, collected), True)
    assert evil not in shown and "&lt;script&gt;" in shown
    assert (
        'data-action="kill"' in shown
        and f'data-ref="{escape(evil)}/{escape(evil)}"' in shown
        and 'data-action="release"' in shown
        and 'data-action="hold"' not in shown
    )
    assert "NOT VERIFIED" in shown

"""The fleet console's view (issue 49): rows grouped by exact request, and statements kept only while current."""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
from typing import Any

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
        return {"ok": True, "data": {"statement": self.answers["statements"][argv[-1]]}}


def test_a_statement_is_asked_once_and_again_when_its_request_was_asked_again() -> None:
    first = statement("web1", "r1")
    fleet = Scripted({"pending": [{"request_id": "r1", "expires": 1_900_000_000}], "statements": {"r1": first}})
    asyncio.run(fleet.refresh())
    asyncio.run(fleet.refresh())
    assert fleet.asked == ["pending --json", "statement --json -- r1", "pending --json"]
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

"""The fleet console's enrollment routes: what is never carried to a host (no SSH here: a recording Fleet)."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from airlock.common.config import parse_text
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb
from airlock.web import fleetenroll, fleetweb
from airlock.web.fleet import Fleet

ORIGIN = "https://fleet.example.com"


class Recording(Fleet):
    """Hosts that refuse every link, and the calls the console made to them."""

    def __init__(self) -> None:
        super().__init__(["web1", "web2"])
        self.calls: list[tuple[str, str]] = []

    async def call(self, host: str, verb: Verb[Any, Any], args: Message) -> dict[str, Any]:
        self.calls.append((host, verb.name))
        return {"ok": False, "error": {"code": "unauthorized", "message": "no such enrollment link", "details": {}}}


def test_a_link_for_no_host_of_the_console_or_no_token_is_never_carried_and_a_flood_waits() -> None:
    fleet = Recording()
    config = parse_text(f"web:\n  url: {ORIGIN}/\n  fleet_hosts: [web1, web2]\n", "/fleet.yaml")
    token = "t" * 43

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with TestClient(TestServer(fleetweb.FleetWeb(config, fleet).app())) as http:
            origin = {"Origin": ORIGIN}
            out["page_no_host"] = (await http.get(f"/enroll/{token}")).status
            out["page_other"] = (await http.get(f"/enroll/{token}?host=db9")).status
            out["no_host"] = (await http.post("/enroll/begin", json={"token": token}, headers=origin)).status
            short = {"token": "short", "host": "web1"}
            out["no_token"] = (await http.post("/enroll/begin", json=short, headers=origin)).status
            out["cross_site"] = (await http.post("/enroll/begin", json={"token": token, "host": "web1"})).status
            assert fleet.calls == []
            out["page"] = (await http.get(f"/enroll/{token}?host=web2")).status  # carried to web2 only
            steps = [
                (await http.post("/enroll/begin", json={"token": token, "host": "web1"}, headers=origin)).status
                for _ in range(fleetenroll.CARRIES_PER_MINUTE)
            ]
            out["steps"] = sorted(set(steps))
        return out

    out = asyncio.run(scenario())
    assert (out["page_no_host"], out["page_other"], out["no_host"], out["no_token"]) == (404, 404, 404, 400)
    assert out["cross_site"] == 403
    assert out["page"] == 404 and fleet.calls[0] == ("web2", "passkey.register_begin")
    # 30 steps a minute reach the hosts (the page's was one); the others wait.
    assert out["steps"] == [400, 429] and len(fleet.calls) == fleetenroll.CARRIES_PER_MINUTE

"""The fleet console learns what is pending from the hosts' relays (issue 49): a `fleet` channel per host.

Three live hosts (test_fleet_console's machinery), each running its relay
(airlock-notify, as `dev up` does when channels are set) with a ``fleet``
channel that posts to the console's ``/fleet/relay``, signed with that
host's own secret.  The console's periodic refresh is turned off after its
first one, so only a relay post can make it ask a host again: a request
asked on web2 appears on the console's page because web2's relay said so
(and the console then asked web2 itself).  web3's relay signs with a secret
the console does not hold for web3: its request does not appear.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_support import ask
from test_fleet_console import HOSTS, World, fleet_world, signed_in

from airlock.common.config import parse_text


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = _port()
ORIGIN = "https://fleet.airlock.test"
SECRETS = {"web1": "web1-secret-0123456789", "web2": "web2-secret-0123456789", "web3": "web3-secret-0123456789"}


def _channel(host: str) -> str:
    url = f"http://127.0.0.1:{PORT}/fleet/relay"
    return f"notify:\n  channels:\n    - {{type: fleet, url: '{url}', host: {host}, secret: {SECRETS[host]}}}\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with fleet_world(Path(tmp_path_factory.mktemp("fleetrelay")), ORIGIN, "fleet.airlock.test", _channel) as built:
        yield built


def test_a_host_s_relay_post_makes_the_console_ask_that_host(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiohttp import web

    from airlock.web import fleetweb

    monkeypatch.setattr(fleetweb, "REFRESH_SECONDS", 3600.0)  # after the first refresh: only relay posts
    secrets = world.tmp / "relay-secrets"
    # The console holds web1's and web2's secrets, and a wrong one for web3.
    secrets.write_text(f"web1 {SECRETS['web1']}\nweb2 {SECRETS['web2']}\nweb3 not-web3s-secret-000000\n")
    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  fleet_hosts: [{', '.join(HOSTS)}]\n"
        f"  fleet_ssh_config: {world.config}\n  fleet_relay_secrets: {secrets}\n",
        "/fleet.yaml",
    )

    async def scenario() -> dict[str, Any]:
        app = fleetweb.app_for(config)
        assert app is not None
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", PORT).start()
        try:
            async with await signed_in(f"http://127.0.0.1:{PORT}", world.key, ORIGIN) as http:

                async def ids() -> set[str]:
                    rows = await (await http.get(f"http://127.0.0.1:{PORT}/fleet/rows")).json()
                    return {m["id"] for r in rows["rows"] for m in r["members"]}

                await asyncio.sleep(3)  # the first refresh
                before = await ids()
                on_web2 = await asyncio.to_thread(ask, world.stacks["web2"], ["touch", str(world.tmp / "relayed")])
                on_web3 = await asyncio.to_thread(ask, world.stacks["web3"], ["touch", str(world.tmp / "forged")])
                deadline = time.monotonic() + 30
                seen = await ids()
                while on_web2.request_id not in seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.3)
                    seen = await ids()
                await asyncio.sleep(2)  # web3's post (refused) has had its time too
                return {"before": before, "seen": await ids(), "web2": on_web2, "web3": on_web3}
        finally:
            await runner.cleanup()

    out = asyncio.run(scenario())
    assert out["web2"].request_id not in out["before"]
    assert out["web2"].request_id in out["seen"], out["seen"]  # web2's relay said so; the console asked web2
    assert out["web3"].request_id not in out["seen"]  # web3's post is not signed with the secret held for web3
    for host, job in (("web2", out["web2"]), ("web3", out["web3"])):
        world.stacks[host].native("deny", {"id": job.request_id, "reason": "cleanup"}, path=world.stacks[host].operator)
        assert job.result()["ok"] is False

"""The fleet console at scale (issue 49): 1,000 hosts and 10,000 pending requests, from a FAKE relay feed.

No SSH and no hosts: `FakeRelayFeed` stands in for 1,000 hosts' answers (each
host's pending list and the statements it published, in the exact statement
format approval renders), loaded into the console's view as `web.fleet.Fleet`
would after a refresh.  Measured through the real aiohttp app
(`web.fleetweb.app_for`) on loopback:

- the page (``GET /``: every row, grouped by exact request) and ``GET
  /fleet/rows`` (JSON): p50 and p99 over ``--requests`` loads;
- the console's resident memory with the view loaded (VmRSS) and the growth
  the view added;
- a group's begin for a request pending on 100 hosts (the group of 100
  statements and its challenge; the carry itself is SSH and not here).

    .venv/bin/python bench/fleet_bench.py [--hosts N] [--per-host N] [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from harness import percentile

from airlock.approval.statement import Statement
from airlock.common import groups
from airlock.common.config import parse_text
from airlock.web import fleetview, fleetweb


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class FakeRelayFeed:
    """FAKE: what ``hosts`` hosts would answer, ``per_host`` pending each; ``spread`` hosts share a request."""

    hosts: int
    per_host: int
    spread: int = 100

    def host(self, n: int) -> str:
        return f"host{n:04d}"

    def statement(self, n: int, k: int) -> str:
        # Request k of host n: the same command as on the other hosts of its spread (so they group): each
        # host's own binding (its inode numbers), the spread's fleet binding.
        command = f"systemctl restart app{(n // self.spread) * self.per_host + k}"
        s = Statement(
            self.host(n),
            f"req-{n}-{k}",
            f"{n:032x}{k:032x}",
            "allow",
            1_900_000_000 + n,
            f"{n * 1000 + k:032x}",
            "agent (uid 1000)",
            "root (uid 0)",
            command,
            "deploy",
            cwd="/root",
            stdin="none",
            fleet_binding=f"{(n // self.spread * self.per_host + k):064x}",
        )
        return s.render()

    def views(self) -> dict[str, fleetview.HostView]:
        out = {}
        for n in range(self.hosts):
            statements = {f"req-{n}-{k}": self.statement(n, k) for k in range(self.per_host)}
            pending = tuple({"request_id": rid, "expires": 1_900_000_000 + n} for rid in statements)
            fleetview.warm(statements.values())  # as `Fleet` does when a host answers
            out[self.host(n)] = fleetview.HostView(self.host(n), pending, statements, "", time.time())
        return out


async def measure(hosts: int, per_host: int, requests: int) -> dict[str, Any]:
    feed = FakeRelayFeed(hosts, per_host)
    names = [feed.host(n) for n in range(hosts)]
    config = parse_text(
        "web:\n  url: http://localhost:8787/\n  fleet_hosts: [" + ", ".join(names) + "]\n", "/bench-fleet.yaml"
    )
    app = fleetweb.app_for(config)
    assert app is not None
    app.on_startup.clear()  # no SSH refresh: the FAKE feed is the hosts' answer
    before = rss_mib()
    views = feed.views()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    fleet = _fleet_of(app)
    fleet.views.update(views)
    loaded = rss_mib()
    out: dict[str, Any] = {"hosts": hosts, "pending": hosts * per_host, "rss_before": before, "rss_loaded": loaded}
    try:
        async with aiohttp.ClientSession() as http:
            for path, key in (("/", "page"), ("/fleet/rows", "rows")):
                times = []
                for _ in range(requests):
                    t = time.perf_counter()
                    async with http.get(f"http://127.0.0.1:{port}{path}") as reply:
                        body = await reply.read()
                    times.append((time.perf_counter() - t) * 1000)
                out[f"{key}_p50"], out[f"{key}_p99"] = statistics.median(times), percentile(times, 99)
                out[f"{key}_bytes"] = len(body)
            rows = json.loads(body)["rows"]
        out["rows"] = len(rows)
        out["rss_after"] = rss_mib()
        wide = [feed.statement(n, 0).encode() for n in range(100)]
        t = time.perf_counter()
        group = groups.of(wide)
        groups.challenge(group, b"{}")
        out["group_100_ms"] = (time.perf_counter() - t) * 1000
    finally:
        await runner.cleanup()
    return out


def _fleet_of(app: web.Application) -> Any:
    """The app's `Fleet` (its routes are bound methods of the one `FleetWeb`)."""
    for route in app.router.routes():
        owner = getattr(route.handler, "__self__", None)
        if isinstance(owner, fleetweb.FleetWeb):
            return owner.fleet
    raise RuntimeError("no FleetWeb in the app")


def run(hosts: int, per_host: int, requests: int) -> dict[str, Any]:
    return asyncio.run(measure(hosts, per_host, requests))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--per-host", type=int, default=10)
    parser.add_argument("--requests", type=int, default=50)
    ns = parser.parse_args(argv)
    print(json.dumps(run(ns.hosts, ns.per_host, ns.requests), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

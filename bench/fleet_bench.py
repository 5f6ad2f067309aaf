"""The fleet console at scale (issue 49): 1,000 hosts and 10,000 pending requests, from a FAKE relay feed.

No SSH and no hosts: `FakeRelayFeed` stands in for 1,000 hosts' answers (each
host's pending list and the statements it published, in the exact statement
format approval renders), loaded into the console's view as `web.fleet.Fleet`
would after a refresh.  Measured through the real aiohttp app
(`web.fleetweb.app_for`) on loopback, signed in (a session made in the
console's own table, sent with its cookie and the tab's proof as a browser
tab sends them):

- the page (``GET /``: every row, grouped by exact request, and every
  host's card with its one FAKE running job; the session's
  host asked whether it is live every `fleetsignin.LIVE_SECONDS`, over the
  FAKE ssh below) and ``GET
  /fleet/rows`` (JSON): p50 and p99 over ``--requests`` loads;
- the console's resident memory with the view loaded (VmRSS) and the growth
  the view added;
- a group's begin for a request pending on 100 hosts (the group of 100
  statements and its challenge);
- a grouped decision reaching 100 hosts: `Fleet.carry` of one assertion to
  100 members, through the console's real SSH path (one ``ssh`` process per
  host, at most `fleet.PARALLEL` at once, then each host asked again: its
  pending, running jobs and hold, three calls) -- where
  ``ssh`` is `FAKE_SSH`, a FAKE put first on PATH that answers each call at
  once: no network, no remote ``airlock``, no verification on a host.  What
  is measured is the console's own cost; a real fleet adds each host's SSH
  round trip and its ``airlock passkey carry``.

    .venv/bin/python bench/fleet_bench.py [--hosts N] [--per-host N] [--requests N] [--decisions N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from harness import percentile

from airlock.approval.statement import Statement
from airlock.common import groups, log
from airlock.common.config import parse_text
from airlock.web import fleetview, fleetweb
from airlock.web.fleet import Fleet

FAKE_SSH = """#!/bin/sh
# FAKE ssh (bench/fleet_bench.py): a "host" that answers the fleet console's call at once.
for last; do :; done
case "$last" in
  *"passkey carry"*) cat >/dev/null; echo '{"id":null,"ok":true,"data":{"decision":"allow","complete":true}}' ;;
  *pending*) echo '{"id":null,"ok":true,"data":{"pending":[]}}' ;;
  *running*) echo '{"id":null,"ok":true,"data":{"running":[]}}' ;;
  *status*) echo '{"id":null,"ok":true,"data":{"hold":false}}' ;;
  *) echo '{"id":null,"ok":false,"error":{"code":"not_found","message":"FAKE host","details":{}}}' ;;
esac
"""


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
            # Each host's card: one running job (as `airlock running --json` lists it) and no hold.
            job = {
                "request_id": f"run-{n}",
                "operation_id": f"op-{n}",
                "agent_uid": 1000,
                "agent": "agent",
                "user": "root",
                "started_at": "2026-01-01T00:00:00+00:00",
                "stages": [["systemctl", "status", f"app{n}"]],
            }
            out[self.host(n)] = fleetview.HostView(
                self.host(n), pending, statements, "", time.time(), (job,), {"hold": False}
            )
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
    console = _console_of(app)
    console.fleet.views.update(views)
    # Signed in as a browser tab is: the session's cookie and the tab's proof on every request; the
    # session kept by host0000 (asked every `fleetsignin.LIVE_SECONDS` over the FAKE ssh).
    tabs = console.signin.tabs
    token, session = tabs.sessions.create("bench", "operator", "bench-credential", "bench-ticket")
    console.signin.hosts[session.ticket] = feed.host(0)
    tab = {"Cookie": f"{tabs.cookie}={token}", "X-Airlock-Proof": session.proof}
    loaded = rss_mib()
    out: dict[str, Any] = {"hosts": hosts, "pending": hosts * per_host, "rss_before": before, "rss_loaded": loaded}
    try:
        async with aiohttp.ClientSession(headers=tab) as http:
            for path, key in (("/", "page"), ("/fleet/rows", "rows")):
                times = []
                for _ in range(requests):
                    t = time.perf_counter()
                    async with http.get(f"http://127.0.0.1:{port}{path}") as reply:
                        body = await reply.read()
                        assert reply.status == 200 and reply.url.path == path, (reply.status, reply.url)
                    times.append((time.perf_counter() - t) * 1000)
                out[f"{key}_p50"], out[f"{key}_p99"] = statistics.median(times), percentile(times, 99)
                out[f"{key}_bytes"] = len(body)
                if key == "page":  # the measured page is the whole one: every host's card (issue 49's fleet view)
                    text = body.decode()
                    assert f"Hold all {hosts} hosts shown" in text and text.count("Kill on ") == hosts, "no host cards"
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


async def decision(feed: FakeRelayFeed, decisions: int, width: int = 100) -> list[float]:
    """Milliseconds for one grouped decision to reach ``width`` hosts (`Fleet.carry`), over FAKE ssh."""
    names = [feed.host(n) for n in range(width)]
    fleet = Fleet(names)
    fleet.views.update({h: v for h, v in feed.views().items() if h in names})
    [row] = [r for r in fleetview.rows(fleet.views.values()) if len(r.hosts) == width][:1]
    extras = fleetweb.extras("")
    group, members = await fleet.begin(row, "allow", extras)
    touch = {"id": "bench", "rawId": "bench", "type": "public-key", "response": {}}  # FAKE hosts check nothing
    times = []
    try:
        for _ in range(decisions):
            t = time.perf_counter()
            carried = await fleet.carry(group.to_dict(), members, "allow", touch)
            times.append((time.perf_counter() - t) * 1000)
            assert len(carried) == width and all(r.get("ok") for r in carried.values()), carried
    finally:
        await fleet.close()
    return times


def _console_of(app: web.Application) -> Any:
    """The app's `FleetWeb` (its routes are bound methods of it)."""
    for route in app.router.routes():
        owner = getattr(route.handler, "__self__", None)
        if isinstance(owner, fleetweb.FleetWeb):
            return owner
    raise RuntimeError("no FleetWeb in the app")


def run(hosts: int, per_host: int, requests: int, decisions: int = 5) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="airlock-fake-ssh-") as folder:
        fake = Path(folder) / "ssh"
        fake.write_text(FAKE_SSH)
        fake.chmod(0o755)
        path = os.environ.get("PATH", "")
        os.environ["PATH"] = f"{folder}:{path}"  # the console runs "ssh": this FAKE one
        try:
            out = asyncio.run(measure(hosts, per_host, requests))
            times = asyncio.run(decision(FakeRelayFeed(100, 1), decisions))
        finally:
            os.environ["PATH"] = path
    out["decision_100_ms"] = statistics.median(times)
    out["decision_100_samples"] = times
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--per-host", type=int, default=10)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--decisions", type=int, default=5, help="grouped decisions carried to 100 FAKE hosts")
    ns = parser.parse_args(argv)
    log.configure("web", level="warning", target="stderr")  # stdout is the figures' JSON
    print(json.dumps(run(ns.hosts, ns.per_host, ns.requests, ns.decisions), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

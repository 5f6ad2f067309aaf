"""The fleet console (issue 49) over a real OpenSSH to three live stacks: one touch, every host.

Three `airlock dev up` stacks stand for three hosts (distinct runtime
dirs), each behind its own loopback ``sshd`` (test_fleet_ssh's machinery).
An operator enrolls one passkey on web1 with the console's origin;
`airlock passkey export` there and `airlock --host webN passkey import -`
list it on the others (journaled).  The console (`web.fleet.Fleet`) learns
what is pending from the hosts alone, groups the same request on three
hosts, and one touch of a software authenticator (tests/softauthn.py) is
carried to each host, whose approval verifies it itself: each journal
records the person, ``method: passkey`` and the group.  A second console
built from the same hosts shows the same thing, and one host's request is
denied alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from operator_support import ASK_POLICY, ask
from test_fleet_ssh import SSHD, _free_port, _sshd

from airlock.approval import webauthn
from airlock.common import groups
from airlock.web import fleetview
from airlock.web.fleet import Fleet

from softauthn import SoftAuthenticator, b64u
from support import REPO, Stack, custom_stack, wait_pending

ORIGIN = "https://fleet.airlock.test"
RP = "fleet.airlock.test"
HOSTS = ("web1", "web2", "web3")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a loopback sshd logging in as root, and a throwaway user, need root"),
    pytest.mark.skipif(not Path(SSHD).exists(), reason="needs OpenSSH (apt-get install openssh-server)"),
]


@dataclass
class World:
    stacks: dict[str, Stack]
    config: Path
    tmp: Path
    operator: str
    key: SoftAuthenticator

    def airlock(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(self.tmp), "LANG": "C.UTF-8"}
        return subprocess.run(
            [sys.executable, "-m", "airlock", "--ssh-config", str(self.config), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env=env | {"PYTHONPATH": str(REPO / "services")},
            check=False,
        )

    def console(self) -> Fleet:
        return Fleet(HOSTS, str(self.config))


def _records(stack: Stack, request_id: str | None, action: str) -> list[dict[str, Any]]:
    return [
        p
        for r in stack.journal_rows()
        if r["kind"] == "operator.action" and (request_id is None or r["request_id"] == request_id)
        for p in [json.loads(r["payload"])]
        if p.get("action") == action
    ]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with fleet_world(Path(tmp_path_factory.mktemp("fleetconsole")), ORIGIN, RP) as built:
        yield built


@contextlib.contextmanager
def fleet_world(tmp: Path, origin: str, rp: str, per_host: Callable[[str], str] | None = None) -> Iterator[World]:
    """Three stacks trusting the console's ``origin``, each behind a loopback sshd; a passkey enrolled on web1.
    ``per_host(name)``: more configuration for that host (a relay channel naming it)."""
    name = f"alflt{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    identity = tmp / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(identity)], check=True)
    authorized = tmp / "authorized_keys"
    authorized.write_text(Path(f"{identity}.pub").read_text())
    # Each host knows its name on the console (web.fleet_name): its enrollment links name it.
    config = ASK_POLICY + f"operators:\n  users: [{name}]\napproval:\n  timeout_seconds: 300\n"
    web = f"web:\n  url: {origin}/\n  rp_id: {rp}\n  fleet_name: {{host}}\n"
    opened = contextlib.ExitStack()
    daemons = []
    try:
        more = per_host or (lambda _h: "")
        stacks = {h: opened.enter_context(custom_stack(tmp / h, config + web.format(host=h) + more(h))) for h in HOSTS}
        lines, known = [], []
        for h, stack in stacks.items():
            proc, port, hostkey = _sshd(tmp, h, stack, authorized, str(Path(sys.executable).parent))
            daemons.append(proc)
            known.append(f"[127.0.0.1]:{port} {hostkey}")
            lines.append(f"Host {h}\n  HostName 127.0.0.1\n  Port {port}\n")
        lines.append(f"Host down\n  HostName 127.0.0.1\n  Port {_free_port()}\n")
        (tmp / "known_hosts").write_text("\n".join(known) + "\n")
        ssh_config = tmp / "ssh_config"
        ssh_config.write_text(
            "".join(lines) + f"Host *\n  User root\n  IdentityFile {identity}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {tmp}/known_hosts\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
        )
        key = SoftAuthenticator(origin, rp)
        web1 = stacks["web1"]
        made = web1.native("passkey.enroll", {"account": name}, path=web1.operator)
        assert made["ok"] is True, made
        begun = web1.native("passkey.register_begin", {"token": made["data"]["token"]}, path=web1.operator)
        done = web1.native(
            "passkey.register_finish",
            {"token": made["data"]["token"], "credential": key.register(begun["data"]["options"])},
            path=web1.operator,
        )
        assert done["ok"] is True, done
        yield World(stacks, ssh_config, tmp, name, key)
    finally:
        for proc in daemons:
            proc.terminate()
            proc.wait(10)
        opened.close()
        subprocess.run(["userdel", "--force", name], capture_output=True, check=False)


def test_a_passkey_enrolled_once_is_imported_on_the_other_hosts_and_journaled(world: World) -> None:
    exported = world.airlock("passkey", "export", "--file", str(world.stacks["web1"].runtime_dir / "passkeys"))
    assert exported.returncode == 0 and world.key.id in exported.stdout, exported
    for h in ("web2", "web3"):
        done = world.airlock("--host", h, "passkey", "import", "--source", "web1", "-", stdin=exported.stdout)
        assert done.returncode == 0 and f"{world.key.id} {world.operator}: imported" in done.stdout, done
        again = world.airlock("--host", h, "passkey", "import", "-", stdin=exported.stdout)
        assert "listed already" in again.stdout, again
        imported = _records(world.stacks[h], None, "passkey.imported")
        assert [(p["credential_id"], p["account"], p["source"]) for p in imported] == [
            (world.key.id, world.operator, "web1")
        ]


def imported(world: World) -> None:
    """web1's passkey listed on web2 and web3 (idempotent: "listed already" the second time)."""
    exported = world.airlock("passkey", "export", "--file", str(world.stacks["web1"].runtime_dir / "passkeys"))
    for h in ("web2", "web3"):
        assert world.airlock("--host", h, "passkey", "import", "-", stdin=exported.stdout).returncode == 0


def test_one_touch_approves_the_same_request_on_three_hosts_and_a_second_console_agrees(world: World) -> None:
    imported(world)
    marker = world.tmp / "one-touch"
    jobs = {h: ask(world.stacks[h], ["touch", str(marker)]) for h in HOSTS}
    console, other = world.console(), world.console()

    async def decide() -> tuple[list[fleetview.Row], list[fleetview.Row], dict[str, Any], list[fleetview.Row]]:
        await asyncio.gather(console.refresh(), other.refresh())
        seen, seen_too = fleetview.rows(console.views.values()), fleetview.rows(other.views.values())
        row = next(r for r in seen if r.hosts == list(HOSTS))
        extras = webauthn.extras("", None, None)
        group, members = await console.begin(row, "allow", extras)
        touch = world.key.sign(b64u(groups.challenge(group, extras)))  # one touch
        carried = await console.carry(group.to_dict(), members, "allow", touch)
        await other.refresh()
        return seen, seen_too, carried, fleetview.rows(other.views.values())

    try:
        seen, seen_too, carried, after = asyncio.run(decide())
    finally:
        asyncio.run(console.close())
        asyncio.run(other.close())
    assert [r.to_dict() for r in seen] == [r.to_dict() for r in seen_too]  # two consoles, one view
    assert all(reply["ok"] for reply in carried.values()) and set(carried) == set(HOSTS), carried
    for h, job in jobs.items():
        assert job.result()["ok"] is True
        approved = _records(world.stacks[h], job.request_id, "approve")
        assert approved[-1]["method"] == "passkey" and approved[-1]["operator"] == world.operator, approved
        assert approved[-1]["group"]["hosts"] == 3 and approved[-1]["credential_id"] == world.key.id
    assert not any(jobs[h].request_id in [m.request_id for r in after for m in r.members] for h in HOSTS)
    assert marker.exists()


def test_one_host_s_request_is_denied_alone(world: World) -> None:
    imported(world)
    jobs = {h: ask(world.stacks[h], ["touch", str(world.tmp / "deny-one")]) for h in HOSTS}
    console = world.console()

    async def deny_web2() -> dict[str, Any]:
        await console.refresh()
        row = fleetview.pick(
            fleetview.rows(console.views.values()),
            groups.request_key(next(iter(console.views["web2"].statements.values())).encode()),
            ["web2"],
        )
        assert row is not None and row.hosts == ["web2"]
        extras = webauthn.extras("not on web2", None, None)
        group, members = await console.begin(row, "deny", extras)
        touch = world.key.sign(b64u(groups.challenge(group, extras)))
        return await console.carry(group.to_dict(), members, "deny", touch, reason="not on web2")

    try:
        carried = asyncio.run(deny_web2())
    finally:
        asyncio.run(console.close())
    assert carried["web2"]["ok"] is True and set(carried) == {"web2"}, carried
    assert jobs["web2"].result()["ok"] is False
    for h in ("web1", "web3"):
        assert wait_pending(world.stacks[h], jobs[h].request_id)
        world.stacks[h].native("deny", {"id": jobs[h].request_id, "reason": "cleanup"}, path=world.stacks[h].operator)
        assert jobs[h].result()["ok"] is False
    denied = _records(world.stacks["web2"], jobs["web2"].request_id, "deny")
    assert denied[-1]["method"] == "passkey" and denied[-1]["group"]["hosts"] == 1


def test_a_host_that_is_down_fails_alone(world: World) -> None:
    console = Fleet(["web1", "down"], str(world.config))
    try:
        asyncio.run(console.refresh())
    finally:
        asyncio.run(console.close())
    assert console.views["web1"].error == "" and console.views["web1"].contact > 0
    assert console.views["down"].error.startswith("unreachable: ssh:"), console.views["down"]
    assert pwd.getpwnam(world.operator)


def test_the_fleet_page_approves_a_group_with_one_touch_and_takes_a_host_s_signed_relay_post(world: World) -> None:
    """airlock-web in fleet mode over HTTP, as the browser and the hosts' relays reach it."""
    imported(world)
    import aiohttp

    from airlock.common.channels.webhook import signature
    from airlock.common.config import parse_text

    secrets = world.tmp / "relay-secrets"
    secrets.write_text("web1 0123456789abcdef0123\nweb2 fedcba9876543210fedc\n")
    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  fleet_hosts: [web1, web2, web3]\n"
        f"  fleet_ssh_config: {world.config}\n  fleet_relay_secrets: {secrets}\n",
        "/fleet.yaml",
    )
    marker = world.tmp / "from-the-page"
    jobs = {h: ask(world.stacks[h], ["touch", str(marker)]) for h in HOSTS}
    origin = {"Origin": ORIGIN}

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with console_at(config) as base:
            async with aiohttp.ClientSession() as anonymous:
                out["anonymous_rows"] = (await anonymous.get(f"{base}/fleet/rows")).status
                out["anonymous_page"] = (await anonymous.get(f"{base}/", allow_redirects=False)).status
                out["anonymous_decide"] = (
                    await anonymous.post(f"{base}/fleet/decide", json={"members": []}, headers=origin)
                ).status
            async with await signed_in(base, world.key, ORIGIN) as http:
                for _ in range(100):  # the first refresh runs at start
                    rows = await (await http.get(f"{base}/fleet/rows")).json()
                    if any(len(r["hosts"]) == 3 for r in rows["rows"]):
                        break
                    await asyncio.sleep(0.2)
                out["page"] = await (await http.get(f"{base}/")).text()
                row = next(r for r in rows["rows"] if len(r["hosts"]) == 3)
                ask_ = {"key": row["key"], "decision": "allow"}
                out["no_origin"] = (await http.post(f"{base}/fleet/decide/begin", json=ask_)).status
                begun = await (await http.post(f"{base}/fleet/decide/begin", json=ask_, headers=origin)).json()
                touch = world.key.sign(begun["options"]["challenge"])
                carry = {k: begun[k] for k in ("group", "members", "decision")} | {"credential": touch}
                out["done"] = await (await http.post(f"{base}/fleet/decide", json=carry, headers=origin)).json()
                sent = {"event": "pending", "seq": 7, "time": "2026-01-01T00:00:00+00:00", "fleet_host": "web2"}
                body = json.dumps(sent).encode()
                good = {"X-Airlock-Signature": signature("fedcba9876543210fedc", body)}
                bad = {"X-Airlock-Signature": signature("0123456789abcdef0123", body)}  # web1's secret
                out["relay"] = (await http.post(f"{base}/fleet/relay", data=body, headers=good)).status
                out["forged"] = (await http.post(f"{base}/fleet/relay", data=body, headers=bad)).status
                out["relay_mark"] = (await (await http.get(f"{base}/fleet/rows")).json())["hosts"]["web2"]["relay"]
        return out

    out = asyncio.run(scenario())
    # Without a sign-in: no rows, no page (sent to /signin), no decision carried.
    assert (out["anonymous_rows"], out["anonymous_page"], out["anonymous_decide"]) == (401, 303, 401)
    assert "Approve on 3 host(s)" in out["page"] and "web1, web2, web3" in out["page"], out["page"]
    assert out["no_origin"] == 403
    assert out["done"]["ok"] is True and set(out["done"]["hosts"]) == set(HOSTS), out["done"]
    assert all(job.result()["ok"] is True for job in jobs.values()) and marker.exists()
    assert (out["relay"], out["forged"]) == (204, 401)
    # The host's card: the post's seq, its event's time, and the lag since (a post from January: days).
    assert out["relay_mark"]["seq"] == 7 and out["relay_mark"]["lag"] > 86400, out["relay_mark"]


@contextlib.asynccontextmanager
async def console_at(config: Any) -> AsyncIterator[str]:
    """airlock-web in fleet mode for ``config`` on a free loopback port; its base URL."""
    from aiohttp import web

    from airlock.web import fleetweb

    app = fleetweb.app_for(config)
    assert app is not None
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    finally:
        await runner.cleanup()


async def signed_in(base: str, key: SoftAuthenticator, origin: str) -> Any:
    """An HTTP client signed in to the fleet console with ``key`` (a host checked the assertion), as the
    console's script is: the session cookie, this tab's proof (``X-Airlock-Proof``, given once in the
    sign-in answer) on every request, and the session's CSRF token (read from the page) on every POST.

    The console's cookie is Secure for an https origin; the test talks plain HTTP on loopback,
    so the cookie is sent by hand."""
    import re

    import aiohttp

    async with aiohttp.ClientSession() as http:
        begin = await http.post(f"{base}/signin/begin", json={}, headers={"Origin": origin})
        begun = await begin.json()
        assert begun["ok"] is True, begun
        pre = "; ".join(f"{k}={v.value}" for k, v in begin.cookies.items())
        finish = {"challenge_id": begun["challenge_id"], "credential": key.sign(begun["options"]["challenge"])}
        reply = await http.post(f"{base}/signin/finish", json=finish, headers={"Origin": origin, "Cookie": pre})
        done = await reply.json()
        assert done["ok"] is True and done["proof"], done
        cookie = "; ".join(f"{k}={v.value}" for k, v in reply.cookies.items())
        page = await http.get(f"{base}/", headers={"Cookie": cookie, "X-Airlock-Proof": done["proof"]})
        found = re.search(r'name="csrf" value="([^"]+)"', await page.text())
        assert found is not None, "the fleet page carries the session's CSRF token"
    tab = {"Cookie": cookie, "X-Airlock-Proof": done["proof"], "X-Airlock-CSRF": found.group(1)}
    return aiohttp.ClientSession(headers=tab)


def test_a_session_check_is_carried_to_a_host_which_answers_for_its_own_sessions(world: World) -> None:
    """`airlock passkey carry --verb session` (what the console asks the host that signed a tab in)."""
    carried = world.airlock(
        "--host", "web1", "passkey", "carry", "--verb", "session", "--json", stdin='{"session": "not-one-of-web1s"}'
    )
    envelope = json.loads(carried.stdout.strip().splitlines()[-1])
    assert envelope["ok"] is False and envelope["error"]["details"]["reason"] == "session", carried


# --- a person's kill, hold and release from the console (issue 49: the fleet view) ----------------------


def _approved_and_running(world: World, host: str, argv: list[str]) -> Any:
    """A job on ``host`` that its operator approved with a passkey (as the host's own console would), running."""
    stack = world.stacks[host]
    job = ask(stack, argv, timeout_ms=120_000)
    begun = stack.native("passkey.decide_begin", {"id": job.request_id, "decision": "allow"}, path=stack.operator)
    touch = world.key.sign(begun["data"]["challenge"])
    said = {"id": job.request_id, "decision": "allow", "statement": begun["data"]["statement"], "credential": touch}
    assert stack.native("passkey.decide", said, path=stack.operator)["ok"] is True
    return job


def _act(console: Fleet, hosts: list[str], touch: Any, **begin: Any) -> dict[str, dict[str, Any]]:
    """What the page does: each host's action statement, ``touch(challenge)`` over their digests, carried back."""
    from airlock.common import actions
    from airlock.common.wire import passkey as pk

    async def run() -> dict[str, dict[str, Any]]:
        args = pk.ActBegin.from_dict(begin)
        begun = dict(zip(hosts, await asyncio.gather(*(console.act_begin(h, args) for h in hosts)), strict=True))
        assert all(b["ok"] for b in begun.values()), begun
        digests = tuple(sorted(b["data"]["digest"] for b in begun.values()))
        credential = touch(b64u(actions.challenge(digests)))
        carried = [console.act(h, pk.Act(b["data"]["challenge_id"], digests, credential)) for h, b in begun.items()]
        return dict(zip(hosts, await asyncio.gather(*carried), strict=True))

    return asyncio.run(run())


def test_the_console_shows_a_running_job_and_kills_it_with_a_touch_and_a_bad_assertion_does_nothing(
    world: World,
) -> None:
    imported(world)
    marker = f"{600 + secrets.randbelow(1000)}.{secrets.randbelow(10**6)}"
    job = _approved_and_running(world, "web1", ["sleep", marker])
    console = world.console()
    try:
        for _ in range(100):
            asyncio.run(console.refresh(["web1"]))
            jobs = fleetview.panel(console.views["web1"])["running"]
            if any(j["job"] == job.request_id for j in jobs):
                break
        shown = next(j for j in jobs if j["job"] == job.request_id)
        assert shown["command"] == f"sleep {marker}" and shown["since"], shown
        assert (shown["as"], shown["agent"]) == ("root", "root"), shown  # names from the host's `airlock running`
        button = f"{shown['agent_uid']}/{shown['operation_id']}"  # what the page's Kill button sends
        listed = world.airlock("--host", "web1", "running")  # what a person reads: the same job, named
        assert listed.returncode == 0 and f"sleep {marker}" in listed.stdout and "root" in listed.stdout, listed
        # An observer's carry without a valid assertion (a touch over something else): nothing happens.
        wrong = _act(console, ["web1"], lambda _c: world.key.sign(b64u(b"\0" * 32)), action="kill", ref=button)
        assert wrong["web1"]["ok"] is False and wrong["web1"]["error"]["details"]["reason"] == "challenge", wrong
        asyncio.run(console.refresh(["web1"]))
        assert any(j["job"] == job.request_id for j in fleetview.panel(console.views["web1"])["running"])
        # The person's touch over the host's own kill statement: killed, journaled as theirs.
        done = _act(console, ["web1"], world.key.sign, action="kill", ref=button, reason="runaway")
        assert done["web1"]["ok"] is True and done["web1"]["data"]["by"]["user"] == world.operator, done
    finally:
        asyncio.run(console.close())
    reply = job.result(30)
    assert reply["data"]["stages"][0]["signal"] == 15, reply
    killed = _records(world.stacks["web1"], job.request_id, "kill")
    assert [(k["operator"], k["method"], k["credential_id"], k["reason"]) for k in killed] == [
        (world.operator, "passkey", world.key.id, "runaway")
    ]
    refused = _records(world.stacks["web1"], job.request_id, "passkey.refused")
    assert refused and refused[-1]["acting"] == "kill" and refused[-1]["reason_code"] == "challenge"


def test_one_touch_holds_two_hosts_and_another_releases_them(world: World) -> None:
    imported(world)
    console = world.console()
    pair = ["web2", "web3"]
    try:
        held = _act(console, pair, world.key.sign, action="hold", reason="incident 42")
        assert all(r["ok"] for r in held.values()), held
        asyncio.run(console.refresh())
        panels = {h: fleetview.panel(console.views[h]) for h in HOSTS}
        assert [panels[h]["hold"]["held"] for h in HOSTS] == [False, True, True], panels
        assert panels["web2"]["hold"]["by"] == world.operator and panels["web2"]["hold"]["reason"] == "incident 42"
        # A hold makes an agent's request a rule allows wait for a person: the brake is real.
        waiting = ask(world.stacks["web2"], ["/usr/bin/true"])
        released = _act(console, pair, world.key.sign, action="release")
        assert all(r["ok"] for r in released.values()), released
        assert waiting.result()["ok"] is True  # released: its rule allows it, so it ran
        assert not any(fleetview.panel(console.views[h])["hold"]["held"] for h in HOSTS)
    finally:
        asyncio.run(console.close())
        for h in pair:  # never leave the world held for the next test
            stack = world.stacks[h]
            if stack.native("status", {}, path=stack.operator)["data"]["hold"]:
                stack.native("release", {}, path=stack.operator)
    for h in pair:
        holds = _records(world.stacks[h], None, "hold")
        assert holds[-1]["operator"] == world.operator and holds[-1]["method"] == "passkey", holds
        assert holds[-1]["touch"]["hosts"] == 2
        assert _records(world.stacks[h], None, "release")[-1]["method"] == "passkey"


def test_the_fleet_page_shows_each_host_filters_by_group_and_holds_a_host_from_its_button(world: World) -> None:
    """The page over HTTP as a phone sees it: the hosts' panels, a host group, a hold and release with a touch."""
    imported(world)
    import aiohttp

    from airlock.common.config import parse_text

    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  fleet_hosts: [web1, web2, web3]\n"
        f"  fleet_ssh_config: {world.config}\n  fleet_groups: {{front: [web1, web2]}}\n",
        "/fleet.yaml",
    )
    origin = {"Origin": ORIGIN}

    async def act(http: Any, base: str, **begin: Any) -> dict[str, Any]:
        begun = await (await http.post(f"{base}/fleet/act/begin", json=begin, headers=origin)).json()
        assert begun["ok"] is True, begun
        touch = world.key.sign(begun["options"]["challenge"])
        carry = {"members": begun["members"], "digests": begun["digests"], "credential": touch}
        done: dict[str, Any] = await (await http.post(f"{base}/fleet/act", json=carry, headers=origin)).json()
        return done

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with console_at(config) as base:
            async with aiohttp.ClientSession() as anonymous:
                out["anonymous_act"] = (
                    await anonymous.post(f"{base}/fleet/act/begin", json={"action": "release"}, headers=origin)
                ).status
            async with await signed_in(base, world.key, ORIGIN) as http:
                for _ in range(100):  # the first refresh runs at start
                    shown = await (await http.get(f"{base}/fleet/rows")).json()
                    if all(h["state"] == "ok" for h in shown["hosts"].values()):
                        break
                    await asyncio.sleep(0.2)
                out["front"] = await (await http.get(f"{base}/fleet/rows?group=front")).json()
                out["unknown_group"] = (await http.get(f"{base}/?group=nowhere")).status
                out["held"] = await act(http, base, action="hold", hosts=["web3"], reason="disk full")
                out["page_held"] = await (await http.get(f"{base}/")).text()
                out["released"] = await act(http, base, action="release", hosts=["web3"])
                out["page"] = await (await http.get(f"{base}/")).text()
        return out

    try:
        out = asyncio.run(scenario())
    finally:
        stack = world.stacks["web3"]
        if stack.native("status", {}, path=stack.operator)["data"]["hold"]:
            stack.native("release", {}, path=stack.operator)
    assert out["anonymous_act"] == 401
    assert sorted(out["front"]["hosts"]) == ["web1", "web2"] and out["front"]["filters"] == {"group": "front"}
    assert out["unknown_group"] == 400
    assert out["held"]["ok"] is True and list(out["held"]["hosts"]) == ["web3"], out["held"]
    assert f"ON HOLD by {world.operator}" in out["page_held"] and "disk full" in out["page_held"]
    assert "Release this host" in out["page_held"]
    assert out["released"]["ok"] is True
    assert "ON HOLD" not in out["page"] and "Hold all 3 hosts shown" in out["page"]
    assert "last contact 20" in out["page"]  # an ISO date, not "never"
    assert _records(world.stacks["web3"], None, "hold")[-1]["method"] == "passkey"

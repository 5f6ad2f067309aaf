"""The fleet console (issue 49) on three booted Debian 12 containers, set up as docs/fleet.md says.

A bastion runs the packaged airlock-web in fleet mode (its socket unit, the
drop-in the docs give); two hosts, web1 and web2, run the packaged airlock
(socket activation) and a real sshd.  Everything is set up by following
docs/fleet.md's "Setting up a bastion, from scratch" step by step, as a new
user would: the console's SSH key made as airlock-web, fleet-ssh_config,
known_hosts from ssh-keyscan, an ``airlock-fleet`` observer login on each
host, the ``fleet`` relay channel, a passkey enrolled once on web1 (its link
served by the bastion, the registration carried to web1) and `airlock
passkey export` / `import` to web2.  The origin is ``http://localhost:8787`` (the
docs' test fleet): each console listens there in its own container, and the
test reaches it from a thread that entered that container's network
namespace (`in_net`), signing with the software authenticator
(tests/softauthn.py) and the integration test's `signed_in` client.

Then an agent on each host asks the same command; the bastion's page shows
one row of two hosts; one touch approves it; each host runs it, and each
host's journald and `airlock show` record the person, ``method: passkey`` and
the group.  A request that differs in one byte on one host is its own row.

The containers boot copies of one cached variant (the base root plus
OpenSSH), so a run downloads nothing after the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nspawn import INCLUDE, CommandFailed, Container, Unavailable, booted, cannot_run
from test_9_fleet import _install, _network, _up

from conftest import _deb
from softauthn import SoftAuthenticator

# The sign-in client is the integration test's (one place to change when the console's session changes).
sys.path.append(str(Path(__file__).resolve().parents[1] / "integration"))
from test_fleet_console import signed_in

ZONE = f"alc{os.getpid() % 100000}"  # the bridge is vz-<zone>: at most 15 characters
NET = "10.231.49"
IPS = {"bastion": f"{NET}.1", "web1": f"{NET}.2", "web2": f"{NET}.3"}
HOSTS = ("web1", "web2")
ORIGIN = "http://localhost:8787"
BASE = "http://127.0.0.1:8787"  # the console as seen from inside its own container
OPERATOR = "alice"
AGENT = "agent1"
SECRETS = {"web1": "web1-relay-secret-0123456789", "web2": "web2-relay-secret-9876543210"}
CLONE_NEWNET = 0x40000000
T = TypeVar("T")

HOST_CONFIG = """\
operators:
  users: [{operator}]
  observers: {{users: [airlock-notify, airlock-web, airlock-fleet]}}   # reads and carries passkey decisions
web:
  url: {origin}/
  fleet_name: {host}   # this host's name in the console's web.fleet_hosts (enrollment links)
notify:
  channels:
    - type: fleet
      url: 'http://{bastion}:8787/fleet/relay'
      host: {host}
      secret_file: /etc/airlock/fleet-relay.secret
"""

BASTION_CONFIG = """\
web:
  url: {origin}/
  listen: 127.0.0.1:8787
  fleet_hosts: [web1, web2]
  fleet_ssh_config: /etc/airlock/fleet-ssh_config
  fleet_relay_secrets: /etc/airlock/fleet-relay-secrets
"""

SSH_CONFIG = """\
Host web1 web2
  User airlock-fleet
  IdentityFile /var/lib/airlock-web/.ssh/id_ed25519
  IdentitiesOnly yes
  UserKnownHostsFile /etc/airlock/fleet-known_hosts
  StrictHostKeyChecking yes
"""


def in_net(c: Container, job: Callable[[], Awaitable[T]], timeout: float = 180.0) -> T:
    """Run ``job`` on an event loop in a thread inside ``c``'s network namespace (a thread's own; the
    test's other threads stay where they are), so ``127.0.0.1:8787`` is that container's console."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(f"/proc/{c.leader}/ns/net", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns into the container's network namespace")
            finally:
                os.close(fd)
            out["value"] = asyncio.run(job())  # type: ignore[arg-type]
        except BaseException as exc:  # handed to the test's thread
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CommandFailed(f"a request to {c.name}'s console took more than {timeout:.0f}s")
    if "error" in out:
        raise out["error"]
    value: T = out["value"]
    return value


@dataclass
class FleetConsole:
    bastion: Container
    hosts: dict[str, Container]
    key: SoftAuthenticator

    def pending(self, host: str) -> list[dict[str, Any]]:
        out = self.hosts[host].run(["airlock", "pending", "--json"]).stdout
        found: list[dict[str, Any]] = json.loads(out)["data"]["pending"]
        return found

    def ask(self, host: str, argv: list[str]) -> tuple[subprocess.Popen[bytes], str]:
        """An agent on ``host`` runs ``airlock run -- argv`` (the policy asks); its process and request ID."""
        before = {p["request_id"] for p in self.pending(host)}
        proc = self.hosts[host].popen(["sh", "-c", 'cd / && exec airlock run --json -- "$@"', "ask", *argv], user=AGENT)
        deadline = time.monotonic() + 60
        while True:
            new = [p["request_id"] for p in self.pending(host) if p["request_id"] not in before]
            if new:
                return proc, new[0]
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CommandFailed(f"no request pending on {host}: {proc.communicate(timeout=10)}")
            time.sleep(0.3)

    def rows(self, http: Any, want: Callable[[list[dict[str, Any]]], bool]) -> Awaitable[dict[str, Any]]:
        async def poll() -> dict[str, Any]:
            for _ in range(150):  # the console asks every host every 10 s, and at once on a relay post
                rows: dict[str, Any] = await (await http.get(f"{BASE}/fleet/rows")).json()
                if want(rows["rows"]):
                    return rows
                await asyncio.sleep(0.2)
            raise AssertionError(f"the console never showed the rows wanted: {rows}")

        return poll()

    def journal_vote(self, host: str, request_id: str) -> dict[str, Any]:
        """The approve vote's record as journald holds it on ``host`` (journalctl -o json)."""
        out = (
            self.hosts[host]
            .run(
                [
                    "journalctl",
                    "-o",
                    "json",
                    "--no-pager",
                    f"AIRLOCK_REQUEST_ID={request_id}",
                    "AIRLOCK_KIND=operator.action",
                ]
            )
            .stdout
        )
        for line in out.splitlines():
            record = json.loads(json.loads(line)["AIRLOCK_RECORD"])
            if record["payload"].get("action") == "approve":
                vote: dict[str, Any] = record["payload"]
                return vote
        raise AssertionError(f"no approve vote in {host}'s journald for {request_id}:\n{out}")


def _walkthrough(bastion: Container, hosts: dict[str, Container], deb: Path) -> SoftAuthenticator:
    """docs/fleet.md's "Setting up a bastion, from scratch", step by step."""
    for c in (bastion, *hosts.values()):
        _up(c)
        _install(c, deb)
        # The names the docs use: DNS on a real network, /etc/hosts here.
        c.sh("cat >> /etc/hosts", input="".join(f"{ip} {n}\n" for n, ip in IPS.items()))
    for c in hosts.values():
        # Each copy of the cached root is its own machine: its own SSH host keys.
        c.sh("rm -f /etc/ssh/ssh_host_* && ssh-keygen -A && systemctl restart ssh.service")

    # 1. On the bastion: an SSH key for the console, the hosts' keys.
    b = bastion
    b.run(["install", "-d", "-o", "airlock-web", "-m", "0700", "/var/lib/airlock-web/.ssh"])
    b.run(
        [
            "runuser",
            "-u",
            "airlock-web",
            "--",
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-f",
            "/var/lib/airlock-web/.ssh/id_ed25519",
        ]
    )
    b.write("/etc/airlock/fleet-ssh_config", SSH_CONFIG)
    b.sh("ssh-keyscan web1 web2 > /etc/airlock/fleet-known_hosts")
    public = b.run(["cat", "/var/lib/airlock-web/.ssh/id_ed25519.pub"]).stdout

    # 2. On each host: an observer login for the console, the console's origin, the relay channel.
    for name, c in hosts.items():
        c.run(
            ["useradd", "--system", "--create-home", "--shell", "/bin/sh", "--groups", "airlock-admin", "airlock-fleet"]
        )
        c.sh("install -d -o airlock-fleet -m 0700 ~airlock-fleet/.ssh")
        c.sh("cat >> ~airlock-fleet/.ssh/authorized_keys", input=public)
        # The operator and an agent (people and agents the host already has).
        c.run(["useradd", "--create-home", "--groups", "airlock-admin", OPERATOR])
        c.run(["useradd", "--create-home", "--groups", "airlock", AGENT])
        c.run(
            ["install", "-m", "0400", "-o", "airlock-notify", "/dev/stdin", "/etc/airlock/fleet-relay.secret"],
            input=SECRETS[name] + "\n",
        )
        config = HOST_CONFIG.format(operator=OPERATOR, origin=ORIGIN, bastion=IPS["bastion"], host=name)
        c.write("/etc/airlock/airlock.yaml", config)
        c.run(["systemctl", "restart", "airlock-approval"], timeout=120)
        c.run(["systemctl", "enable", "--now", "airlock-notify"], timeout=120)

    # 3. On the bastion: fleet mode, and the drop-in that gives airlock-web the network.
    b.write("/etc/airlock/airlock.yaml", BASTION_CONFIG.format(origin=ORIGIN))
    b.run(
        ["install", "-m", "0400", "-o", "airlock-web", "/dev/stdin", "/etc/airlock/fleet-relay-secrets"],
        input="".join(f"{h} {secret}\n" for h, secret in SECRETS.items()),
    )
    b.run(["mkdir", "-p", "/etc/systemd/system/airlock-web.service.d"])
    b.sh(
        r"printf '[Service]\nPrivateNetwork=no\nRestrictAddressFamilies=AF_UNIX AF_INET AF_INET6\n'"
        " > /etc/systemd/system/airlock-web.service.d/fleet.conf"
    )
    # The hosts' relays post to the console; here on the zone's address (the docs' TLS proxy stands there).
    b.run(["mkdir", "-p", "/etc/systemd/system/airlock-web.socket.d"])
    b.write("/etc/systemd/system/airlock-web.socket.d/zone.conf", f"[Socket]\nListenStream={IPS['bastion']}:8787\n")
    b.run(["systemctl", "daemon-reload"])
    # The bastion runs no other airlock service.
    b.run(
        [
            "systemctl",
            "disable",
            "--now",
            "airlock.socket",
            "airlock-operator.socket",
            "airlock-approval.socket",
            "airlock-runner.socket",
            "airlock-journal.socket",
            "airlock-exectree.socket",
        ],
        check=False,
    )
    b.run(["systemctl", "enable", "--now", "airlock-web.socket"], timeout=60)

    # 4. Passkeys: enroll once on web1 (the link it prints is served by the bastion, which carries the
    # registration to web1 alone), list on web2.
    web1 = hosts["web1"]
    waiting = web1.popen(["airlock", "passkey", "enroll", OPERATOR])
    assert waiting.stdout is not None
    link = waiting.stdout.readline().decode().strip()
    assert link.startswith(f"{ORIGIN}/enroll/") and link.endswith("?host=web1"), link
    token = link.split("/enroll/", 1)[1].split("?", 1)[0]
    key = SoftAuthenticator(ORIGIN, "localhost")

    async def enroll() -> dict[str, Any]:
        import aiohttp

        async with aiohttp.ClientSession(headers={"Origin": ORIGIN}) as http:
            page = await http.get(f"{BASE}/enroll/{token}?host=web1")
            assert page.status == 200, await page.text()
            step = {"token": token, "host": "web1"}
            begun = await (await http.post(f"{BASE}/enroll/begin", json=step)).json()
            assert begun["ok"] is True, begun
            finish = step | {"credential": key.register(begun["options"])}
            done: dict[str, Any] = await (await http.post(f"{BASE}/enroll/finish", json=finish)).json()
            return done

    try:
        enrolled = in_net(b, enroll)
        said, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    assert enrolled["ok"] is True and enrolled["account"] == OPERATOR, enrolled
    assert f"enrolled passkey {key.id} for {OPERATOR}" in said.decode(), (said, err)
    web1.sh(f"airlock passkey export {OPERATOR} > /root/{OPERATOR}.passkeys")
    shutil.copy(web1.root / f"root/{OPERATOR}.passkeys", hosts["web2"].root / f"root/{OPERATOR}.passkeys")
    imported = hosts["web2"].run(["airlock", "passkey", "import", "--source", "web1", f"/root/{OPERATOR}.passkeys"])
    assert f"{key.id} {OPERATOR}: imported" in imported.stdout, imported
    return key


@contextlib.contextmanager
def _three() -> Iterator[tuple[Container, dict[str, Container]]]:
    # One variant for all three (the base root plus OpenSSH), cached beside the base: nothing to download
    # after the first run.  INCLUDE again: the containers have no way out for the .deb's dependencies.
    packages = ("openssh-server", "openssh-client", *INCLUDE)
    zone = [f"--network-zone={ZONE}"]
    with contextlib.ExitStack() as stack:
        bastion = stack.enter_context(
            booted(packages=packages, nspawn_args=zone, name="bastion", before_boot=_network("bastion", IPS["bastion"]))
        )
        # The zone's bridge exists once a container is in it; no networkd on this host brings it up.
        subprocess.run(["ip", "link", "set", f"vz-{ZONE}", "up"], check=True, timeout=30)
        hosts = {
            h: stack.enter_context(booted(packages=packages, nspawn_args=zone, name=h, before_boot=_network(h, IPS[h])))
            for h in HOSTS
        }
        yield bastion, hosts


@pytest.fixture(scope="module")
def fleet() -> Iterator[FleetConsole]:
    if shutil.which("ip") is None:
        cannot_run("needs iproute2 on the host (apt-get install iproute2)")
    deb = _deb()
    started = time.monotonic()
    try:
        with _three() as (bastion, hosts):
            key = _walkthrough(bastion, hosts, deb)
            print(f"[systest] bastion and two hosts set up in {time.monotonic() - started:.1f}s", flush=True)
            yield FleetConsole(bastion, hosts, key)
    except Unavailable as exc:
        cannot_run(exc)


def test_one_touch_on_the_bastion_approves_the_same_request_on_both_hosts(fleet: FleetConsole) -> None:
    marker = "/var/tmp/fleet-one-touch"
    asked = {h: fleet.ask(h, ["/usr/bin/touch", marker]) for h in HOSTS}
    ids = {h: rid for h, (_, rid) in asked.items()}

    async def approve() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with await signed_in(BASE, fleet.key, ORIGIN) as http:
            shown = await fleet.rows(http, lambda rows: any(len(r["hosts"]) == 2 for r in rows))
            out["rows"] = shown["rows"]
            out["page"] = await (await http.get(f"{BASE}/")).text()
            row = next(r for r in shown["rows"] if len(r["hosts"]) == 2)
            ask = {"key": row["key"], "decision": "allow"}
            headers = {"Origin": ORIGIN}
            begun = await (await http.post(f"{BASE}/fleet/decide/begin", json=ask, headers=headers)).json()
            assert begun["ok"] is True, begun
            touch = fleet.key.sign(begun["options"]["challenge"])  # one touch
            carry = {k: begun[k] for k in ("group", "members", "decision")} | {"credential": touch}
            out["done"] = await (await http.post(f"{BASE}/fleet/decide", json=carry, headers=headers)).json()
        return out

    out = in_net(fleet.bastion, approve)
    # One row of two hosts: the same request on both, one group.
    (row,) = out["rows"]
    assert row["hosts"] == ["web1", "web2"], row
    assert sorted(m["id"] for m in row["members"]) == sorted(ids.values()), row
    assert "Approve on 2 host(s)" in out["page"] and "web1, web2" in out["page"], out["page"]
    assert out["done"]["ok"] is True and set(out["done"]["hosts"]) == set(HOSTS), out["done"]
    for h, (proc, rid) in asked.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, (h, stdout, stderr)
        c = fleet.hosts[h]
        assert c.run(["test", "-e", marker], check=False).returncode == 0, f"{marker} missing on {h}"
        # Each host's journald: the person, the method, the group (two hosts, this host's statement in it).
        vote = fleet.journal_vote(h, rid)
        assert vote["operator"] == OPERATOR and vote["method"] == "passkey", vote
        assert vote["credential_id"] == fleet.key.id and vote["group"]["hosts"] == 2, vote
        shown = c.run(["airlock", "show", rid]).stdout
        touch = f"approve by {OPERATOR}, method: passkey, credential {fleet.key.id}; group: 2 host(s), key {row['key']}"
        assert f"allow by {OPERATOR}" in shown and touch in shown, shown


def test_a_request_one_byte_apart_on_one_host_is_its_own_row(fleet: FleetConsole) -> None:
    asked = {"web1": fleet.ask("web1", ["/usr/bin/touch", "/var/tmp/fleet-a"])}
    asked["web2"] = fleet.ask("web2", ["/usr/bin/touch", "/var/tmp/fleet-b"])
    try:

        async def look() -> dict[str, Any]:
            async with await signed_in(BASE, fleet.key, ORIGIN) as http:
                return await fleet.rows(http, lambda rows: len(rows) == 2)

        rows = in_net(fleet.bastion, look)["rows"]
        assert sorted(r["hosts"] for r in rows) == [["web1"], ["web2"]], rows
        assert len({r["key"] for r in rows}) == 2, rows
    finally:
        for h, (proc, rid) in asked.items():
            fleet.hosts[h].run(["airlock", "deny", rid, "--reason", "systest cleanup"], check=False)
            proc.communicate(timeout=60)


def test_each_host_s_relay_posts_reach_the_console_signed_with_its_own_secret(fleet: FleetConsole) -> None:
    """The fleet channel (step 2): each host's airlock-notify posted its pending news to the bastion,
    which took it as that host's (checked with that host's secret) and logged it."""
    deadline = time.monotonic() + 60
    while True:
        out = fleet.bastion.run(
            [
                "journalctl",
                "-o",
                "json",
                "--no-pager",
                "_SYSTEMD_UNIT=airlock-web.service",
                "AIRLOCK_EVENT=web.fleet.relay",
            ]
        ).stdout
        seen = {json.loads(line).get("AIRLOCK_HOST") for line in out.splitlines()}
        if seen >= set(HOSTS) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen == set(HOSTS), out[-3000:]
    # A post signed with another host's secret is refused (control: the same post with its own is taken).
    body = json.dumps({"event": "pending", "seq": 1, "fleet_host": "web2"})
    post = (
        "import hashlib, hmac, sys, urllib.error, urllib.request\n"
        "body, secret = sys.argv[1].encode(), sys.argv[2].encode()\n"
        "sig = 'sha256=' + hmac.new(secret, body, hashlib.sha256).hexdigest()\n"
        "r = urllib.request.Request(sys.argv[3], data=body, headers={'X-Airlock-Signature': sig})\n"
        "try:\n    print(urllib.request.urlopen(r, timeout=30).status)\n"
        "except urllib.error.HTTPError as e:\n    print(e.code)\n"
    )
    url = f"http://{IPS['bastion']}:8787/fleet/relay"
    web2 = fleet.hosts["web2"]
    forged = web2.run(["python3", "-c", post, body, SECRETS["web1"], url]).stdout.strip()
    own = web2.run(["python3", "-c", post, body, SECRETS["web2"], url]).stdout.strip()
    assert (forged, own) == ("401", "204"), (forged, own)

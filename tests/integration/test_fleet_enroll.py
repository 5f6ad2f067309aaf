"""Enrollment served by the fleet console (issue 49): a host's link, the bastion's page, that host verifies.

Three `airlock dev up` stacks behind three loopback sshd (test_fleet_console's
machinery), each trusting the console's origin and knowing its name there
(``web.fleet_name``).  ``airlock --host web2 passkey enroll ACCOUNT`` prints
a link on the console (``ORIGIN/enroll/TOKEN?host=web2``) and waits; the
console (airlock-web in fleet mode, over HTTP as the browser reaches it)
serves the page and carries the registration's two steps to web2 alone
over SSH (``airlock passkey carry --verb register_begin|register_finish``);
web2 verifies the new passkey (tests/softauthn.py) against the console's
origin, stores and journals it, and the waiting command says it is
enrolled.  A link shown for another host, or naming no host of the
console's, shows no "Create passkey" button.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from test_fleet_console import HOSTS, ORIGIN, RP, World, console_at, fleet_world

from airlock.common.config import parse_text

from softauthn import SoftAuthenticator
from support import REPO


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with fleet_world(Path(tmp_path_factory.mktemp("fleetenroll")), ORIGIN, RP) as built:
        yield built


def _enroll_on(world: World, host: str) -> subprocess.Popen[str]:
    """``airlock --host HOST passkey enroll ACCOUNT`` as an operator types it: prints the link, then waits."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(world.tmp), "LANG": "C.UTF-8"}
    argv = [sys.executable, "-m", "airlock", "--ssh-config", str(world.config), "--host", host]
    return subprocess.Popen(
        [*argv, "passkey", "enroll", world.operator],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env | {"PYTHONPATH": str(REPO / "services")},
    )


def test_a_host_s_enrollment_link_is_served_by_the_console_and_the_host_verifies_and_journals_it(
    world: World,
) -> None:
    from aiohttp import ClientSession

    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  fleet_hosts: [{', '.join(HOSTS)}]\n"
        f"  fleet_ssh_config: {world.config}\n",
        "/fleet.yaml",
    )
    waiting = _enroll_on(world, "web2")
    assert waiting.stdout is not None
    link = waiting.stdout.readline().strip()
    parts = urlsplit(link)
    token = parts.path.rsplit("/", 1)[1]
    new_key = SoftAuthenticator(ORIGIN, RP)  # the operator's second passkey (a phone, say)
    origin = {"Origin": ORIGIN}

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with console_at(config) as base, ClientSession() as http:
            wrong = await http.get(f"{base}/enroll/{token}?host=web1")  # web1 never made this link
            out["other_host"] = (wrong.status, "Create passkey" in await wrong.text())
            none = await http.get(f"{base}/enroll/{token}?host=db9")  # not one of the console's hosts
            out["no_host"] = (none.status, "Create passkey" in await none.text())
            page = await http.get(f"{base}{parts.path}?{parts.query}")
            out["page"] = (page.status, await page.text())
            begun = await (
                await http.post(f"{base}/enroll/begin", json={"token": token, "host": "web2"}, headers=origin)
            ).json()
            assert begun["ok"] is True, begun
            credential = new_key.register(begun["options"])
            finish = {"token": token, "host": "web2", "credential": credential}
            out["done"] = await (await http.post(f"{base}/enroll/finish", json=finish, headers=origin)).json()
            again = {"token": token, "host": "web2"}
            out["again"] = (await http.post(f"{base}/enroll/begin", json=again, headers=origin)).status
        return out

    try:
        out = asyncio.run(scenario())
        said, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
    # The host's link names it, on the console's origin.
    assert link == f"{ORIGIN}/enroll/{token}?host=web2", link
    # Refused before any touch: another host's link, or a host the console does not have.
    assert out["other_host"] == (404, False) and out["no_host"] == (404, False)
    status, text = out["page"]
    assert status == 200 and "Create passkey" in text and 'name="host" value="web2"' in text, text
    assert out["done"] == {"ok": True, "account": world.operator, "host": "web2", "next": "/signin"}, out["done"]
    assert out["again"] == 400  # a link is used once
    # The command that printed the link saw it used.
    assert waiting.returncode == 0 and f"enrolled passkey {new_key.id} for {world.operator}" in said, (said, err)
    # web2 verified, stored and journaled it; web1 and web3 know nothing of it.
    enrolled = [
        p
        for r in world.stacks["web2"].journal_rows()
        if r["kind"] == "operator.action"
        for p in [json.loads(r["payload"])]
        if p.get("action") == "passkey.enrolled" and p.get("credential_id") == new_key.id
    ]
    assert len(enrolled) == 1 and enrolled[0]["account"] == world.operator, enrolled
    for h in HOSTS:  # each stack's passkeys file (approval.passkeys in its runtime dir)
        path = world.stacks[h].runtime_dir / "passkeys"
        listed = path.read_text() if path.exists() else ""
        assert (new_key.id in listed) == (h == "web2"), (h, listed)

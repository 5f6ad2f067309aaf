"""The fleet console in a real browser (issue 49): one touch approves a group of three, one host denied alone.

The session follows the single-host console's rules (issue 46): a ``__Host-`` cookie and the tab's
proof, without which the cookie reads nothing.

Headless Chromium (tests/cdp.py) with WebAuthn's virtual authenticator holds
the operator's passkey (the same key tests/softauthn.py enrolled on the
hosts, added to the authenticator over CDP).  The fleet console (airlock-web
in fleet mode) runs at http://localhost:PORT -- a secure context -- over the
three live hosts of test_fleet_console's machinery (three `dev up` stacks
behind three loopback sshd, each trusting that origin).  The person clicks
"Approve on 3 host(s)", the passkey signs the group once, and every host
runs the command; then "Deny on web2 alone"; then a passkey enrolled from
web3's link, served by the console and verified by web3.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from operator_support import ask
from test_fleet_console import HOSTS, World, fleet_world, imported

from airlock.common.config import parse_text
from cdp import CHROMIUM, Page, chromium

from support import wait_pending

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PORT = _port()
ORIGIN = f"http://localhost:{PORT}"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    with fleet_world(Path(tmp_path_factory.mktemp("fleetbrowser")), ORIGIN, "localhost") as built:
        imported(built)
        yield built


async def _signed_in(page: Page, world: World, sign_count: int) -> str:
    """The operator's passkey in the browser's virtual authenticator, then the console's sign-in with it
    (the page sends the browser to /signin; the touch is checked by a host)."""
    authenticator = await page.virtual_authenticator()
    key = world.key.key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    await page.send(
        "WebAuthn.addCredential",
        authenticatorId=authenticator,
        credential={
            "credentialId": base64.b64encode(world.key.credential_id).decode(),
            "isResidentCredential": True,  # the console names no credential: a discoverable one
            "userHandle": base64.b64encode(hashlib.sha256(world.operator.encode()).digest()[:16]).decode(),
            "rpId": "localhost",
            "privateKey": base64.b64encode(key).decode(),
            "signCount": sign_count,
        },
    )
    await page.send("Page.navigate", url=f"{ORIGIN}/")
    await page.wait_for("location.pathname === '/signin' && document.documentElement.dataset.ready === '1'")
    await page.evaluate("document.querySelector('#signin button').click()")
    await page.wait_for("location.pathname === '/' && document.body.innerText.includes('Pending')", 60)
    return authenticator


async def _scenario(world: World, marker: Path, jobs: dict[str, Any]) -> dict[str, str]:
    from aiohttp import web

    from airlock.web import fleetweb

    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  fleet_hosts: [web1, web2, web3]\n  fleet_ssh_config: {world.config}\n",
        "/fleet.yaml",
    )
    app = fleetweb.app_for(config)
    assert app is not None
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    seen: dict[str, str] = {}
    try:
        with chromium(world.tmp / "profile") as port:
            page = await Page.open(port)
            try:
                authenticator = await _signed_in(page, world, world.key.counter + 1)
                # http://localhost is a secure context: a __Host- cookie (Secure, HttpOnly), and the tab's
                # proof in sessionStorage, without which the cookie reads nothing (issue 46's rules).
                cookies = (await page.send("Network.getCookies", urls=[ORIGIN + "/"]))["cookies"]
                [cookie] = [c for c in cookies if c["name"] == "__Host-airlock-fleet"]
                seen["cookie"] = f"secure={cookie['secure']} httponly={cookie['httpOnly']}"
                seen["proof"] = await page.evaluate("sessionStorage.getItem('airlock-proof') ? 'kept' : 'none'")
                seen["without_proof"] = await page.evaluate(
                    "fetch('/fleet/rows', {credentials: 'same-origin'}).then(r => String(r.status))"
                )
                await _until(page, "Approve on 3 host(s)")
                await page.evaluate(
                    "document.querySelector('form.fleet-decide:not([data-host]) button[value=allow]').click()"
                )
                seen["approved"] = await page.wait_for(
                    "(s => s && s.includes('Recorded') ? s : '')(document.getElementById('fleet-status').textContent)",
                    timeout=60,
                )
                # Then the same request again on the three hosts, and web2's denied alone.
                jobs.update({h: ask(world.stacks[h], ["touch", str(marker) + ".2"]) for h in HOSTS})
                await _until(page, "Deny on web2 alone")
                await page.evaluate("document.querySelector('form.fleet-decide[data-host=web2] button').click()")
                seen["denied"] = await page.wait_for(
                    "(s => s && s.includes('Recorded') ? s : '')(document.getElementById('fleet-status').textContent)",
                    timeout=60,
                )
                # Enrollment served by the console: web3's link (it names web3), a new passkey made by the
                # browser's authenticator, carried to web3, which verifies and stores it.
                # A second authenticator (a phone, say): the first already holds this account's passkey,
                # which the options exclude.
                await page.send("WebAuthn.removeVirtualAuthenticator", authenticatorId=authenticator)
                await page.virtual_authenticator()
                web3 = world.stacks["web3"]
                made = web3.native("passkey.enroll", {"account": world.operator}, path=web3.operator)["data"]
                seen["link"] = made["url"]
                await page.navigate(made["url"])
                await page.wait_for("document.documentElement.dataset.ready === '1'")
                await page.evaluate("document.querySelector('#enroll button').click()")
                seen["enrolled"] = await page.wait_for(
                    "(e => /\\b(ok|error)\\b/.test(e.className) ? e.textContent : '')"
                    "(document.querySelector('#enroll-status'))",
                    timeout=60,
                )
                return seen
            finally:
                await page.close()
    finally:
        await runner.cleanup()


async def _until(page: Page, text: str) -> None:
    """Load the page until it shows ``text`` (the console asks the hosts at start and every 10 s)."""
    for _ in range(60):
        await page.navigate(f"{ORIGIN}/")  # a shell first: the script loads the page with the tab's proof
        await page.wait_for("document.documentElement.dataset.ready === '1'")
        if text in await page.text():
            return
        await asyncio.sleep(0.5)
    raise AssertionError(f"the fleet page never showed {text!r}:\n{await page.text()}")


def test_one_touch_in_the_browser_approves_a_group_of_three(world: World) -> None:
    marker = world.tmp / "from-the-browser"
    jobs = {h: ask(world.stacks[h], ["touch", str(marker)]) for h in HOSTS}
    first = dict(jobs)
    seen = asyncio.run(_scenario(world, marker, jobs))
    assert (seen["cookie"], seen["proof"], seen["without_proof"]) == ("secure=True httponly=True", "kept", "401")
    assert seen["approved"] == "Recorded on 3 host(s).", seen
    assert all(job.result()["ok"] is True for job in first.values()) and marker.exists()
    assert seen["denied"] == "Recorded on 1 host(s).", seen
    assert seen["link"].endswith("?host=web3") and seen["enrolled"].startswith("Passkey enrolled for"), seen
    enrolled = [
        r
        for r in world.stacks["web3"].journal_rows()
        if r["kind"] == "operator.action" and "passkey.enrolled" in r["payload"]
    ]
    assert len(enrolled) == 1, enrolled
    assert jobs["web2"].result()["ok"] is False
    for h in ("web1", "web3"):  # still waiting, untouched by web2's denial
        assert wait_pending(world.stacks[h], jobs[h].request_id)
        world.stacks[h].native("deny", {"id": jobs[h].request_id, "reason": "cleanup"}, path=world.stacks[h].operator)
        assert jobs[h].result()["ok"] is False


async def _hold_scenario(world: World) -> dict[str, str]:
    """The person holds every host shown with one touch, then releases them with another (the host cards)."""
    from aiohttp import web

    from airlock.web import fleetweb

    config = parse_text(
        f"web:\n  url: {ORIGIN}/\n  fleet_hosts: [web1, web2, web3]\n  fleet_ssh_config: {world.config}\n",
        "/fleet.yaml",
    )
    app = fleetweb.app_for(config)
    assert app is not None
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", PORT).start()
    seen: dict[str, str] = {}
    world.key.counter += 1000  # past every count the hosts saw from an earlier browser's authenticator
    done = "(s => s && s.includes('done on') ? s : '')(document.getElementById('fleet-status').textContent)"
    try:
        with chromium(world.tmp / "profile-hold") as port:
            page = await Page.open(port)
            try:
                await _signed_in(page, world, world.key.counter)
                await _until(page, "Hold all 3 hosts shown")
                await page.evaluate(
                    "(f => { f.elements.reason.value = 'browser drill'; f.querySelector('button').click(); })"
                    "(document.querySelector('.every form.fleet-act[data-action=hold]'))"
                )
                seen["held"] = await page.wait_for(done, timeout=60)
                await _until(page, "ON HOLD by")
                seen["page"] = await page.text()
                await page.evaluate(
                    "document.querySelector('.every form.fleet-act[data-action=release] button').click()"
                )
                seen["released"] = await page.wait_for(done, timeout=60)
                return seen
            finally:
                await page.close()
    finally:
        await runner.cleanup()


def test_one_touch_in_the_browser_holds_every_host_shown_and_another_releases_them(world: World) -> None:
    try:
        seen = asyncio.run(_hold_scenario(world))
    finally:
        for stack in world.stacks.values():
            if stack.native("status", {}, path=stack.operator)["data"]["hold"]:
                stack.native("release", {}, path=stack.operator)
    assert seen["held"] == "hold done on 3 host(s).", seen
    assert seen["page"].count(f"ON HOLD by {world.operator}") == 3 and "browser drill" in seen["page"], seen["page"]
    assert seen["released"] == "release done on 3 host(s).", seen
    for stack in world.stacks.values():
        assert stack.native("status", {}, path=stack.operator)["data"]["hold"] is False

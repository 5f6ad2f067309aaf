"""The fleet console's session against a cookie replayed without its tab (issue 49, issue 46's rules).

Cookies ignore ports: on a bastion whose console is ``http://localhost:PORT``
behind an SSH forward, or wherever another page reaches the operator's
browser, the session cookie can leave the console's tab.  A cookie alone is
not a session: the console also wants the tab's proof (given once in the
sign-in answer, kept in the tab's sessionStorage) on every request, and the
session's CSRF token on every state-changing one.  Without the proof, the
rows (what every host has pending, with requesters and reasons) and a
decision's begin are refused; with it (the control), they are served.

One live `airlock dev up` stack stands for a host, and really verifies the
sign-in (tests/softauthn.py's passkey, enrolled there); the console's calls
reach it through an in-process transport (`HostTransport`: the host's
operator.sock as the console's observer login, where the console would use
``ssh HOST airlock passkey carry``), so the bastion's rules are what is tested.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from secsupport import needs_root, red_stack, throwaway_user
from test_sec_passkeys import call_as

from airlock.common.config import parse_text
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb
from airlock.web import fleetsignin, fleetweb
from airlock.web.fleet import Fleet

from softauthn import SoftAuthenticator
from support import Stack

pytestmark = [needs_root]

ORIGIN = "https://fleet.airlock.test"
RP = "fleet.airlock.test"


class HostTransport(Fleet):
    """The console's `Fleet` whose calls go to one live stack's operator.sock as the observer login
    (in process, no SSH): what ``ssh web1 airlock passkey carry`` would reach."""

    def __init__(self, socket: str, login: Any) -> None:
        super().__init__(["web1"])
        self.socket, self.login = socket, login

    async def call(self, host: str, verb: Verb[Any, Any], args: Message) -> dict[str, Any]:
        return await asyncio.to_thread(call_as, self.socket, self.login, verb.name, args.to_dict())


@dataclass
class World:
    transport: HostTransport
    key: SoftAuthenticator
    host: Stack


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        op = stack.enter_context(throwaway_user("alfso"))
        login = stack.enter_context(throwaway_user("alfsl"))  # the bastion's login on the host: an observer
        config = (
            f"operators:\n  users: [{op.pw_name}]\n  observers: {{users: [{login.pw_name}]}}\n"
            f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\napproval:\n  timeout_seconds: 300\npolicy:\n  default: ask\n"
        )
        live = stack.enter_context(red_stack(config))
        os.chmod(live.operator, 0o666)  # the allow-lists are what is tested, not the socket's mode
        key = SoftAuthenticator(ORIGIN, RP)
        made = live.native("passkey.enroll", {"account": op.pw_name}, path=live.operator)["data"]
        begun = call_as(live.operator, login, "passkey.register_begin", {"token": made["token"]})
        credential = key.register(begun["data"]["options"])
        done = call_as(
            live.operator, login, "passkey.register_finish", {"token": made["token"], "credential": credential}
        )
        assert done["ok"] is True, done
        yield World(HostTransport(live.operator, login), key, live)


ORIGIN_HEADER = {"Origin": ORIGIN}


def _app(world: World) -> TestServer:
    config = parse_text(f"web:\n  url: {ORIGIN}/\n  rp_id: {RP}\n  fleet_hosts: [web1]\n", "/fleet.yaml")
    return TestServer(fleetweb.FleetWeb(config, world.transport).app())


async def _sign_in(http: TestClient, world: World) -> tuple[str, dict[str, str], dict[str, str]]:
    """Sign in through the console (the host verifies the touch): the cookie's name, the cookie, the proof."""
    first = await http.post("/signin/begin", json={"tab": "t1"}, headers=ORIGIN_HEADER)
    begun = await first.json()
    assert begun["ok"] is True, begun
    pre = {"Cookie": "; ".join(f"{k}={v.value}" for k, v in first.cookies.items())}  # Secure: sent by hand
    http.session.cookie_jar.clear()
    finish = {"challenge_id": begun["challenge_id"], "credential": world.key.sign(begun["options"]["challenge"])}
    reply = await http.post("/signin/finish", json=finish | {"tab": "t1"}, headers=ORIGIN_HEADER | pre)
    done = await reply.json()
    assert done["ok"] is True, done
    [name] = [k for k in reply.cookies if not k.endswith("-pre")]
    http.session.cookie_jar.clear()  # every request below says exactly what it carries
    return name, {"Cookie": f"{name}={reply.cookies[name].value}"}, {"X-Airlock-Proof": done["proof"]}


async def _console(world: World) -> dict[str, Any]:
    """Signed in, ask with and without the tab's proof."""
    origin = ORIGIN_HEADER
    out: dict[str, Any] = {}
    async with TestClient(_app(world)) as http:
        out["cookie_name"], cookie, proof = await _sign_in(http, world)

        # The page: with the cookie alone, an empty shell (the tab's script asks again with its proof).
        shell = await http.get("/", headers=cookie)
        out["shell"] = (shell.status, "Pending" in await shell.text())
        page = await http.get("/", headers=cookie | proof)
        text = await page.text()
        out["page"] = (page.status, "Pending" in text)
        found = re.search(r'name="csrf" value="([^"]+)"', text)
        assert found is not None, text
        csrf = {"X-Airlock-CSRF": found.group(1)}

        # The rows: the cookie alone, a wrong proof, then the control.
        out["rows_cookie_only"] = (await http.get("/fleet/rows", headers=cookie)).status
        out["rows_wrong_proof"] = (await http.get("/fleet/rows", headers=cookie | {"X-Airlock-Proof": "x" * 43})).status
        rows = await http.get("/fleet/rows", headers=cookie | proof)
        out["rows_with_proof"] = (rows.status, (await rows.json())["ok"])

        # A state change: the cookie and the CSRF token without the proof; the proof without the CSRF
        # token; then the control (both: served, and answered "no such request" for a made-up key).
        begin = {"key": "0" * 64, "decision": "allow"}
        out["change_cookie_only"] = (
            await http.post("/fleet/decide/begin", json=begin, headers=origin | cookie | csrf)
        ).status
        out["change_no_csrf"] = (
            await http.post("/fleet/decide/begin", json=begin, headers=origin | cookie | proof)
        ).status
        control = await http.post("/fleet/decide/begin", json=begin, headers=origin | cookie | proof | csrf)
        out["change_with_proof"] = (control.status, (await control.json())["error"])

        # A kill, hold or release (the host cards' buttons, issue 49's fleet view) is a POST like any other:
        # without the proof, or without the CSRF token, no host is asked for an action statement; with
        # both, the host makes one for the touch (and nothing is held until a touch is carried).
        hold = {"action": "hold", "hosts": ["web1"], "reason": "drill"}
        out["act_cookie_only"] = (await http.post("/fleet/act/begin", json=hold, headers=origin | cookie | csrf)).status
        out["act_no_csrf"] = (await http.post("/fleet/act/begin", json=hold, headers=origin | cookie | proof)).status
        acted = await http.post("/fleet/act/begin", json=hold, headers=origin | cookie | proof | csrf)
        said = await acted.json()
        out["act_with_proof"] = (acted.status, said.get("ok"), [m["host"] for m in said.get("members", [])])

        # Sign-out needs the whole session too; after it, the proof opens nothing.
        out["signout_cookie_only"] = (
            await http.post("/signout", data={"csrf": found.group(1)}, headers=origin | cookie)
        ).status
        form = {"csrf": found.group(1), "proof": proof["X-Airlock-Proof"]}
        out["signout"] = (await http.post("/signout", data=form, headers=origin | cookie, allow_redirects=False)).status
        out["rows_after_signout"] = (await http.get("/fleet/rows", headers=cookie | proof)).status
    await world.transport.close()
    return out


def test_the_fleet_console_s_cookie_without_the_tab_s_proof_reads_and_changes_nothing(world: World) -> None:
    out = asyncio.run(_console(world))
    assert out["cookie_name"] == "__Host-airlock-fleet"  # an https origin: Secure, Path=/, no Domain
    # Refused: the cookie alone (or with a wrong proof) reads no rows and begins no decision.
    assert out["shell"] == (200, False)
    assert (out["rows_cookie_only"], out["rows_wrong_proof"]) == (401, 401)
    assert out["change_cookie_only"] == 401 and out["change_no_csrf"] == 403
    assert out["signout_cookie_only"] == 401
    assert (out["act_cookie_only"], out["act_no_csrf"]) == (401, 403)
    # Control: the same requests with the tab's proof (and the CSRF token) are served.
    assert out["page"] == (200, True)
    assert out["rows_with_proof"] == (200, True)
    assert out["change_with_proof"][0] == 404 and "no such request" in out["change_with_proof"][1]
    assert out["act_with_proof"] == (200, True, ["web1"])
    status = world.host.native("status", {}, path=world.host.operator)
    assert status["data"]["hold"] is False  # a statement to sign, no touch: nothing held
    assert out["signout"] == 303 and out["rows_after_signout"] == 401


async def _revoked(world: World) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with TestClient(_app(world)) as http:
        _name, cookie, proof = await _sign_in(http, world)
        out["before"] = (await http.get("/fleet/rows", headers=cookie | proof)).status
        revoked = world.host.native("passkey.revoke", {"credential_id": world.key.id}, path=world.host.operator)
        assert revoked["ok"] is True, revoked
        out["rows"] = (await http.get("/fleet/rows", headers=cookie | proof)).status
        out["page"] = (await http.get("/", headers=cookie | proof, allow_redirects=False)).status
    await world.transport.close()
    return out


def test_revoking_the_passkey_on_the_host_ends_the_fleet_console_s_session(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Last in this file: the passkey is revoked for good."""
    monkeypatch.setattr(fleetsignin, "LIVE_SECONDS", 0.0)  # the host is asked on every request
    out = asyncio.run(_revoked(world))
    assert out["before"] == 200  # control: the same session, before the revocation, reads
    assert (out["rows"], out["page"]) == (401, 303)

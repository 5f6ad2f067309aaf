"""airlock-web's sessions against a local user on the host (issue 46, items 2-4).

The console runs as `airlock dev up --web` does, at http://localhost:PORT
(both loopback addresses held).  The attacks:

- **A cookie alone is not a session** (browser-driven: the browser is the
  point).  Cookies ignore ports: when the operator's browser opens any page
  another local user serves on ``localhost:OTHER``, the console's session
  cookie goes with it.  Replayed on the console without the tab's
  port-scoped proof, it reads nothing; with the proof (control) it reads.
- **Sign-in cannot be crowded out.**  ``/signin/begin`` needs no session:
  1,100 begins from other browsers used to evict the operator's challenge
  while they touched the key.  Challenges are bound to the browser that
  asked, rated per browser and overall, and never evicted for another's.
- **Revocation is immediate.**  A revoked passkey's sessions used to read
  on until ``web.session_minutes``; now the next request reads nothing, and
  ``airlock passkey signout`` ends every session of an account.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from secsupport import as_user, needs_root, red_stack, throwaway_user
from test_sec_web import Page as Parsed
from test_sec_web import Tab

from cdp import CHROMIUM, Page, chromium

from softauthn import SoftAuthenticator
from support import Background, Stack, wait_pending

pytestmark = [
    needs_root,
    pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)"),
    pytest.mark.timeout(300),
]

# Run as another local user: serve http://localhost:PORT (both loopback addresses) and write each
# request's Cookie header to stdout, one JSON line each: what a page on another port receives.
_CATCHER = r"""
import json, socket, sys, threading
port = int(sys.argv[1])
def serve(family, host):
    s = socket.socket(family)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((host, port))
    s.listen(16)
    while True:
        c, _ = s.accept()
        head = c.recv(65536).decode("latin-1")
        cookie = [l.split(":", 1)[1].strip() for l in head.split("\r\n") if l.lower().startswith("cookie:")]
        print(json.dumps({"cookie": cookie[0] if cookie else ""}), flush=True)
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<p>an agent's page</p>")
        c.close()
for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
    threading.Thread(target=serve, args=(family, host), daemon=True).start()
print(json.dumps({"listening": port}), flush=True)
threading.Event().wait()
"""


@dataclass
class Console:
    stack: Stack
    base: str  # http://localhost:PORT, the origin
    listen: str  # 127.0.0.1:PORT


@pytest.fixture(scope="module")
def console() -> Iterator[Console]:
    config = (
        "agents: {users: [root], groups: []}\napproval: {timeout_seconds: 240}\npolicy: {default: ask, rules: []}\n"
    )
    with red_stack(config, web="127.0.0.1:0") as live:
        assert live.web is not None and live.web.startswith("http://localhost:") and live.web_listen
        yield Console(live, live.web, live.web_listen)


def _free_port() -> int:
    for _ in range(50):
        with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
            v4.bind(("127.0.0.1", 0))
            port = int(v4.getsockname()[1])
            with contextlib.suppress(OSError):
                v6.bind(("::1", port))
                return port
    raise AssertionError("no port free on both loopback addresses")


@contextlib.contextmanager
def _catcher() -> Iterator[tuple[int, subprocess.Popen[str]]]:
    port = _free_port()
    with throwaway_user("alcat") as user:
        proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", _CATCHER, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **as_user(user),
        )
        assert proc.stdout is not None
        try:
            assert json.loads(proc.stdout.readline()) == {"listening": port}
            yield port, proc
        finally:
            proc.kill()
            proc.wait()


def test_a_cookie_caught_on_another_localhost_port_reads_nothing_without_the_tabs_proof(
    console: Console, tmp_path: Path
) -> None:
    job = Background(console.stack, {"argv": ["true"], "privileged": True})
    wait_pending(console.stack, job.request_id)
    try:
        caught, proof = asyncio.run(_browse(console, tmp_path))
        # The attack's premise: the other port's page received the console's session cookie.
        jar = dict(c.strip().partition("=")[::2] for c in caught.split(";"))
        name, value = "__Host-airlock", jar.get("__Host-airlock", "")
        assert len(value) >= 40, caught
        replayed = Tab(f"http://{console.listen}", {name: value}, origin=console.base)
        for path in ("/", "/grants", "/decisions", f"/request?ref={job.request_id}"):
            reply = replayed.call("GET", path)
            assert job.request_id not in reply.text and 'name="csrf"' not in reply.text, (path, reply.text)
        refused = replayed.call("POST", "/decide/begin", body={"ref": job.request_id, "decision": "allow"})
        assert refused.status == 401
        forged = Tab(f"http://{console.listen}", {name: value}, origin=console.base, proof="guessed")
        assert forged.call("GET", "/").status == 401
        # Control: the same cookie with the tab's proof reads the pending request and its CSRF token.
        tab = Tab(f"http://{console.listen}", {name: value}, origin=console.base, proof=proof)
        page = tab.call("GET", "/")
        assert page.status == 200 and job.request_id in page.text and Parsed.of(page.text).inputs["csrf"]
    finally:
        console.stack.native("deny", {"id": job.request_id, "reason": "test over"}, path=console.stack.operator)


async def _browse(console: Console, tmp_path: Path) -> tuple[str, str]:
    """Enroll and sign in as the operator (root) in chromium, then open another user's localhost page."""
    enrolled = console.stack.native("passkey.enroll", {"account": "root"}, path=console.stack.operator)
    assert enrolled["ok"], enrolled
    profile = Path(tempfile.mkdtemp(prefix="alcookie", dir=tmp_path))
    with _catcher() as (port, catcher), chromium(profile / "profile") as devtools:
        page = await Page.open(devtools)
        try:
            await page.virtual_authenticator()
            await page.navigate(f"{console.base}/enroll/{enrolled['data']['token']}")
            await page.evaluate("document.querySelector('#enroll button').click()")
            await page.wait_for("document.querySelector('#enroll-status').textContent.includes('enrolled')")
            await page.navigate(f"{console.base}/signin")
            await page.evaluate("document.querySelector('#signin button').click()")
            await page.wait_for("document.querySelector('.who') !== null")
            proof = str(await page.evaluate("sessionStorage.getItem('airlock-proof')"))
            # The operator opens a link to an agent's page on another localhost port.
            await page.navigate(f"http://localhost:{port}/")
            assert catcher.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(catcher.stdout.readline), 20)
            # That page's own sessionStorage (another origin: the port) has no proof.
            assert await page.evaluate("sessionStorage.getItem('airlock-proof')") is None
        finally:
            await page.close()
    shutil.rmtree(profile, ignore_errors=True)
    return str(json.loads(line)["cookie"]), proof


def _enroll(console: Console, account: str = "root") -> SoftAuthenticator:
    """A software passkey for ``account``, enrolled through the console's page as a browser would."""
    made = console.stack.native("passkey.enroll", {"account": account}, path=console.stack.operator)
    assert made["ok"] is True, made
    token = made["data"]["token"]
    tab = Tab(f"http://{console.listen}", origin=console.base)
    auth = SoftAuthenticator(console.base, "localhost")
    begun = tab.call("POST", "/enroll/begin", body={"token": token}).json()
    done = tab.call("POST", "/enroll/finish", body={"token": token, "credential": auth.register(begun["options"])})
    assert done.status == 200 and done.json()["account"] == account, done.text
    return auth


def test_a_flood_of_sign_in_begins_from_other_browsers_never_evicts_the_operators_challenge(console: Console) -> None:
    auth = _enroll(console)
    base = f"http://{console.listen}"
    operator = Tab(base, origin=console.base)
    begun = operator.call("POST", "/signin/begin", body={}).json()
    # Another client floods while the operator touches the key: half from one browser (its cookie
    # kept), half from a fresh browser each time (no cookie: every begin is a new client).
    one = Tab(base, origin=console.base)
    statuses: Counter[int] = Counter()
    for i in range(1100):
        statuses[(one if i % 2 else Tab(base, origin=console.base)).call("POST", "/signin/begin", body={}).status] += 1
    # The flooder cannot spend the operator's challenge from its own browser either.
    stolen = one.call("POST", "/signin/finish", body={"challenge_id": begun["challenge_id"], "credential": {}})
    assert stolen.status in (400, 403)
    done = operator.call(
        "POST",
        "/signin/finish",
        body={"challenge_id": begun["challenge_id"], "credential": auth.sign(begun["options"]["challenge"])},
    )
    assert done.status == 200 and done.json()["account"] == "root", done.text
    assert statuses[200] >= 500 and statuses[429] >= 500, statuses  # the one browser's rate is used up
    # Control: the session it made reads.
    operator.proof = done.json()["proof"]
    assert operator.call("GET", "/").status == 200 and 'name="csrf"' in operator.call("GET", "/").text


def _signed_in(console: Console, auth: SoftAuthenticator) -> Tab:
    tab = Tab(f"http://{console.listen}", origin=console.base)
    begun = tab.call("POST", "/signin/begin", body={}).json()
    body = {"challenge_id": begun["challenge_id"], "credential": auth.sign(begun["options"]["challenge"])}
    done = tab.call("POST", "/signin/finish", body=body)
    assert done.status == 200, done.text
    tab.proof = done.json()["proof"]
    return tab


def _reads(tab: Tab, request_id: str) -> bool:
    reply = tab.call("GET", "/")
    return reply.status == 200 and request_id in reply.text


def test_revoking_a_passkey_ends_its_sessions_at_once_and_signout_ends_an_accounts(console: Console) -> None:
    job = Background(console.stack, {"argv": ["true"], "privileged": True})
    wait_pending(console.stack, job.request_id)
    try:
        lost, kept = _enroll(console), _enroll(console)
        phone, laptop = _signed_in(console, lost), _signed_in(console, kept)
        assert _reads(phone, job.request_id) and _reads(laptop, job.request_id)
        listed = console.stack.native("passkey.list", {"account": "root"}, path=console.stack.operator)
        live = {p["credential_id"]: len(p["sessions"]) for p in listed["data"]["passkeys"]}
        assert live[lost.id] == 1 and live[kept.id] == 1, listed  # one sign-in each
        token = phone.csrf()
        revoked = console.stack.native(
            "passkey.revoke", {"credential_id": lost.id, "reason": "phone lost"}, path=console.stack.operator
        )
        assert revoked["ok"] is True and revoked["data"]["sessions_ended"] == 1, revoked
        # The lost phone's session reads nothing and decides nothing, at once.
        assert not _reads(phone, job.request_id)
        assert phone.call("GET", "/").status == 303
        begin = {"ref": job.request_id, "decision": "allow"}
        assert phone.call("POST", "/decide/begin", body=begin, headers={"X-Airlock-CSRF": token}).status == 401
        # Control: the other passkey's session still reads.
        assert _reads(laptop, job.request_id)
        # An operator ends every session of the account: the laptop's too.
        ended = console.stack.native(
            "passkey.sessions_end", {"account": "root", "reason": "test"}, path=console.stack.operator
        )
        assert ended["ok"] is True and ended["data"]["ended"] >= 1, ended  # earlier tests' sessions too
        assert not _reads(laptop, job.request_id)
        listed = console.stack.native("passkey.list", {"account": "root"}, path=console.stack.operator)
        assert all(not p["sessions"] for p in listed["data"]["passkeys"])
    finally:
        console.stack.native("deny", {"id": job.request_id, "reason": "test over"}, path=console.stack.operator)

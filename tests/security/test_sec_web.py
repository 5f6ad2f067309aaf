"""airlock-web over real HTTP (issue 33): what a hostile page, a stolen tab or an observer can do.

A live stack (``airlock dev up --web`` as root) behind an imagined TLS proxy:
``web.url`` is https://airlock.test, the tests talk HTTP to the listening
port and send what a browser there sends (``Origin``, cookies).  Passkeys are
software authenticators (tests/softauthn.py); approval verifies each one.
Each refusal has its control: the same call with what was missing succeeds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pwd
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from secsupport import needs_root, red_stack, throwaway_user

from airlock.common.render import command_line

from softauthn import SoftAuthenticator
from support import Background, Stack, now_iso, wait_pending

pytestmark = [needs_root]

ORIGIN = "https://airlock.test"
RP = "airlock.test"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HOSTILE = "<script>alert(\"x\")</script>' onmouseover='boom' \"&amp;"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@dataclass
class Reply:
    status: int
    headers: Any
    text: str

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.text)
        return data


@dataclass
class Tab:
    """A browser tab at https://airlock.test: its cookie, the Origin it sends, and its sessionStorage's
    sign-in proof (sent as X-Airlock-Proof, as the console's script sends it), nothing else."""

    base: str
    cookies: dict[str, str] = field(default_factory=dict)
    origin: str | None = ORIGIN
    proof: str | None = None

    def call(
        self,
        method: str,
        path: str,
        *,
        body: dict[str, Any] | None = None,
        form: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
    ) -> Reply:
        data = raw
        sent = dict(headers or {})
        if raw is not None:
            sent.setdefault("Content-Type", "application/json")
        elif body is not None:
            data = json.dumps(body).encode()
            sent["Content-Type"] = "application/json"
        elif form is not None:
            data = urlencode(form).encode()
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        if self.origin and method == "POST":
            sent.setdefault("Origin", self.origin)
        if self.proof:
            sent.setdefault("X-Airlock-Proof", self.proof)
        if self.cookies:
            sent["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        # The stack's own http:// address, nothing a test input chose.
        request = urllib.request.Request(self.base + path, data=data, headers=sent, method=method)  # noqa: S310
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=60) as answer:
                reply = Reply(answer.status, answer.headers, answer.read().decode())
        except urllib.error.HTTPError as exc:
            reply = Reply(exc.code, exc.headers, exc.read().decode())
        for header in reply.headers.get_all("Set-Cookie") or []:
            jar = SimpleCookie()
            jar.load(header)
            for name, morsel in jar.items():
                if morsel["max-age"] == "0" or not morsel.value:
                    self.cookies.pop(name, None)
                else:
                    self.cookies[name] = morsel.value
        return reply

    def sign_in(self, auth: SoftAuthenticator) -> Reply:
        begun = self.call("POST", "/signin/begin", body={}).json()
        credential = auth.sign(begun["options"]["challenge"])
        done = self.call(
            "POST", "/signin/finish", body={"challenge_id": begun["challenge_id"], "credential": credential}
        )
        if done.status == 200:
            self.proof = done.json()["proof"]
        return done

    def csrf(self, path: str = "/") -> str:
        page = Page.of(self.call("GET", path).text)
        return page.inputs["csrf"]

    def decide(self, ref: str, decision: str, auth: SoftAuthenticator, **extra: Any) -> Reply:
        token = self.csrf()
        body = {"ref": ref, "decision": decision} | extra
        begun = self.call("POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": token})
        assert begun.status == 200, begun.text
        data = begun.json()
        credential = auth.sign(data["options"]["challenge"])
        final = body | {"statement": data["statement"], "credential": credential}
        return self.call("POST", "/decide", body=final, headers={"X-Airlock-CSRF": token})


class Page(HTMLParser):
    """A page as a browser's parser reads it: tags and attributes, text, form inputs."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text = ""
        self.inputs: dict[str, str] = {}

    @classmethod
    def of(cls, html: str) -> Page:
        page = cls()
        page.feed(html)
        return page

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        named = dict(attrs)
        if tag == "input" and named.get("name"):
            self.inputs[str(named["name"])] = str(named.get("value") or "")

    def handle_data(self, data: str) -> None:
        self.text += data


@dataclass
class World:
    stack: Stack
    base: str
    op: pwd.struct_passwd
    observer: pwd.struct_passwd
    keys: dict[str, SoftAuthenticator]

    def tab(self) -> Tab:
        return Tab(self.base)

    def enroll(self, account: str) -> SoftAuthenticator:
        """A one-time link made by root, used through the web's enrollment page as a browser would."""
        made = self.stack.native("passkey.enroll", {"account": account}, path=self.stack.operator)
        assert made["ok"] is True, made
        token = made["data"]["token"]
        tab = self.tab()
        page = tab.call("GET", f"/enroll/{quote(token)}")
        assert page.status == 200 and Page.of(page.text).inputs["token"] == token
        auth = SoftAuthenticator(ORIGIN, RP)
        begun = tab.call("POST", "/enroll/begin", body={"token": token}).json()
        done = tab.call("POST", "/enroll/finish", body={"token": token, "credential": auth.register(begun["options"])})
        assert done.status == 200 and done.json()["account"] == account, done.text
        return auth

    def signed_in(self, user: pwd.struct_passwd) -> Tab:
        tab = self.tab()
        assert tab.sign_in(self.keys[user.pw_name]).status == 200
        return tab


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with contextlib.ExitStack() as stack:
        op, observer = (stack.enter_context(throwaway_user(p)) for p in ("alwop", "alwob"))
        config = (
            f"operators:\n  users: [{op.pw_name}]\n  observers: {{users: [{observer.pw_name}]}}\n"
            f"web:\n  url: {ORIGIN}\n  rp_id: {RP}\n  session_minutes: 5\n"
            "approval:\n  timeout_seconds: 120\n"
            "policy:\n  default: ask\n  rules: []\n"
        )
        live = stack.enter_context(red_stack(config, web="127.0.0.1:0"))
        assert live.web == ORIGIN and live.web_listen is not None
        w = World(live, f"http://{live.web_listen}", op, observer, {})
        for user in (op, observer):
            w.keys[user.pw_name] = w.enroll(user.pw_name)
        yield w


def _pending(world: World, argv: list[str]) -> Background:
    job = Background(world.stack, {"argv": argv, "privileged": True})
    wait_pending(world.stack, job.request_id)
    return job


def _still_pending(world: World, request_id: str) -> bool:
    reply = world.stack.native("pending", path=world.stack.operator)
    return any(p["request_id"] == request_id for p in reply["data"]["pending"])


def _decisions(world: World, request_id: str) -> list[dict[str, Any]]:
    return [r for r in world.stack.journal_rows() if r["request_id"] == request_id and r["kind"] == "operator.action"]


# --- every answer: the headers ------------------------------------------------------


def test_every_answer_carries_the_strict_csp_and_frame_refusal(world: World) -> None:
    tab = world.signed_in(world.op)
    answers = [
        Tab(world.base).call("GET", "/"),
        Tab(world.base).call("GET", "/signin"),
        Tab(world.base).call("GET", "/static/airlock-web.js"),
        Tab(world.base).call("GET", "/nothing-here"),
        tab.call("GET", "/"),
        tab.call("GET", "/grants"),
        tab.call("GET", "/decisions"),
        tab.call("POST", "/decide/begin", body={}),  # refused: no CSRF token
    ]
    for reply in answers:
        assert reply.headers["Content-Security-Policy"] == CSP
        assert reply.headers["X-Frame-Options"] == "DENY"
        assert reply.headers["X-Content-Type-Options"] == "nosniff"
        assert reply.headers["Cache-Control"] == "no-store"
    # No inline script anywhere: the one script is the static file (the CSP would block any other).
    page = Page.of(tab.call("GET", "/").text)
    scripts = [attrs for tag, attrs in page.tags if tag == "script"]
    assert scripts == [{"src": "/static/airlock-web.js", "defer": None}]
    assert not [name for _, attrs in page.tags for name in attrs if name.startswith("on")]


# --- sessions ------------------------------------------------------------------------


def test_every_page_needs_a_passkey_session(world: World, marks: Path) -> None:
    job = _pending(world, ["touch", str(marks / "session")])
    # The relay's link names the request as AGENT/ID (uid 0: root's agent here).
    pages = [
        "/",
        f"/request?ref={quote(job.request_id)}",
        f"/request?ref=0%2F{quote(job.request_id)}",
        "/grants",
        "/decisions",
    ]
    for cookies in ({}, {"__Host-airlock": "forged-session-token"}, {"airlock": "x"}):
        for path in pages:
            reply = Tab(world.base, dict(cookies)).call("GET", path)
            assert reply.status == 303 and reply.headers["Location"] == "/signin", (path, reply.status)
            assert job.request_id not in reply.text
    # Control: signed in, the same pages answer, the request is there.
    tab = world.signed_in(world.op)
    for path in pages:
        assert tab.call("GET", path).status == 200, path
    assert job.request_id in tab.call("GET", "/").text
    assert 'id="decide"' in tab.call("GET", pages[2]).text
    world.stack.native("deny", {"id": job.request_id, "reason": "test over"}, path=world.stack.operator)


def test_the_session_cookie_is_httponly_strict_secure_host_only_and_short(world: World) -> None:
    tab = Tab(world.base)
    reply = tab.sign_in(world.keys[world.op.pw_name])
    assert reply.status == 200 and reply.json()["role"] == "operator"
    [header] = reply.headers.get_all("Set-Cookie")
    jar = SimpleCookie()
    jar.load(header)
    [(name, morsel)] = jar.items()
    # __Host-: behind TLS the browser keeps it only with Secure, Path=/ and no Domain.
    assert name == "__Host-airlock" and morsel["secure"] and morsel["httponly"] and morsel["path"] == "/"
    assert morsel["samesite"] == "Strict" and not morsel["domain"] and morsel["max-age"] == str(5 * 60)
    assert len(morsel.value) >= 40  # 256 random bits
    # Signing out needs the CSRF token and ends the session on the server, not only in the browser.
    stolen = dict(tab.cookies)
    assert tab.call("POST", "/signout", form={}).status == 403
    assert tab.call("GET", "/").status == 200
    assert tab.call("POST", "/signout", form={"csrf": tab.csrf()}).status == 303
    assert Tab(world.base, stolen).call("GET", "/").status == 303


def test_a_failed_sign_in_makes_no_session(world: World) -> None:
    tab = Tab(world.base)
    begun = tab.call("POST", "/signin/begin", body={}).json()
    stranger = SoftAuthenticator(ORIGIN, RP)  # never enrolled
    reply = tab.call(
        "POST",
        "/signin/finish",
        body={"challenge_id": begun["challenge_id"], "credential": stranger.sign(begun["options"]["challenge"])},
    )
    # No session cookie (only the pre-session cookie the sign-in challenge is bound to).
    assert reply.status == 403 and not reply.headers.get_all("Set-Cookie")
    assert list(tab.cookies) == ["__Host-airlock-pre"]
    assert reply.json()["code"] == "unauthorized"
    assert tab.sign_in(world.keys[world.op.pw_name]).status == 200  # control


# --- CSRF and origin ---------------------------------------------------------------------


def test_a_state_change_without_the_csrf_token_or_from_another_origin_is_refused(world: World, marks: Path) -> None:
    job = _pending(world, ["touch", str(marks / "csrf")])
    tab = world.signed_in(world.op)
    body = {"ref": job.request_id, "decision": "allow"}
    token = tab.csrf()
    refused = [
        tab.call("POST", "/decide/begin", body=body),  # no token
        tab.call("POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": "guessed"}),
        tab.call("POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": world.signed_in(world.op).csrf()}),
        tab.call("POST", "/decide/begin", form={"ref": job.request_id, "decision": "allow"}),
    ]
    evil = Tab(world.base, tab.cookies, origin="https://evil.example")
    refused.append(evil.call("POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": token}))
    cross = tab.call(
        "POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": token, "Sec-Fetch-Site": "cross-site"}
    )
    refused.append(cross)
    assert [r.status for r in refused] == [403] * len(refused), [r.text for r in refused]
    assert _still_pending(world, job.request_id) and not _decisions(world, job.request_id)
    # Control: with the session's own token, from its own origin, approval answers with the statement.
    begun = tab.call("POST", "/decide/begin", body=body, headers={"X-Airlock-CSRF": token})
    assert begun.status == 200 and job.request_id in begun.json()["statement"]
    world.stack.native("deny", {"id": job.request_id, "reason": "test over"}, path=world.stack.operator)


# --- who may decide ------------------------------------------------------------------------


def test_an_observer_sees_the_request_but_cannot_decide_it(world: World, marks: Path) -> None:
    marker = marks / "observer"
    job = _pending(world, ["touch", str(marker)])
    tab = world.signed_in(world.observer)
    page = tab.call("GET", f"/request?ref={quote(job.request_id)}")
    assert page.status == 200 and f"touch {marker}" in Page.of(page.text).text
    assert 'id="decide"' not in page.text and "observer" in page.text
    token = tab.csrf()
    begun = tab.call(
        "POST", "/decide/begin", body={"ref": job.request_id, "decision": "allow"}, headers={"X-Airlock-CSRF": token}
    )
    assert begun.status == 403
    # Even with a real assertion of the observer's passkey (over a statement fetched elsewhere).
    options = world.stack.native(
        "passkey.decide_begin", {"id": job.request_id, "decision": "allow"}, path=world.stack.operator
    )["data"]
    credential = world.keys[world.observer.pw_name].sign(options["options"]["challenge"])
    body = {"ref": job.request_id, "decision": "allow", "statement": options["statement"], "credential": credential}
    assert tab.call("POST", "/decide", body=body, headers={"X-Airlock-CSRF": token}).status == 403
    assert _still_pending(world, job.request_id) and not marker.exists()
    # Control: the operator's passkey through the same pages approves it, and it runs as root.
    done = world.signed_in(world.op).decide(job.request_id, "allow", world.keys[world.op.pw_name])
    assert done.status == 200 and done.json()["ok"] is True, done.text
    assert job.result()["ok"] is True and marker.exists() and marker.stat().st_uid == 0


def test_a_denial_through_the_pages_reaches_the_agent_with_its_reason(world: World, marks: Path) -> None:
    marker = marks / "denied"
    job = _pending(world, ["touch", str(marker)])
    tab = world.signed_in(world.op)
    done = tab.decide(job.request_id, "deny", world.keys[world.op.pw_name], reason="not during the freeze")
    assert done.status == 200, done.text
    reply = job.result()
    assert reply["error"]["code"] == "denied" and "not during the freeze" in reply["error"]["message"]
    assert not marker.exists()


# --- escaping ------------------------------------------------------------------------------


def test_a_hostile_argv_and_reason_are_shown_as_text_never_as_markup(world: World) -> None:
    argv = ["echo", HOSTILE, "\"'<>&"]
    job = Background(world.stack, {"argv": argv, "privileged": True, "reason": HOSTILE})
    wait_pending(world.stack, job.request_id)
    tab = world.signed_in(world.op)
    for path in ("/", f"/request?ref={quote(job.request_id)}"):
        html = tab.call("GET", path).text
        page = Page.of(html)
        assert "<script>alert" not in html and "onmouseover='boom'" not in html
        assert [t for t, _ in page.tags if t == "script"] == ["script"]  # the static file only
        assert not [name for _, attrs in page.tags for name in attrs if name.startswith("on")]
        assert command_line(argv) in page.text  # shown exactly as the agent wrote it (shell-quoted)
        if path != "/":
            assert HOSTILE in page.text  # the reason, as typed
    world.stack.native("deny", {"id": job.request_id, "reason": "test over"}, path=world.stack.operator)


def test_bad_bodies_get_a_clear_refusal_and_no_traceback(world: World) -> None:
    tab = Tab(world.base)
    for raw, status in ((b"", 400), (b"{not json", 400), (b"[1, 2]", 400), (b"{" + b" " * (256 * 1024) + b"}", 413)):
        reply = tab.call("POST", "/signin/finish", raw=raw)
        assert reply.status == status, (raw[:20], reply.status, reply.text)
        assert "Traceback" not in reply.text
    assert Tab(world.base).call("GET", "/signin").status == 200  # the service is still there
    assert os.path.exists(world.stack.operator)


def test_an_approval_with_a_grant_lets_the_same_command_run_again_and_shows_on_the_grants_page(
    world: World, marks: Path
) -> None:
    marker = marks / "granted"
    argv = ["touch", str(marker)]
    job = _pending(world, argv)
    tab = world.signed_in(world.op)
    page = Page.of(tab.call("GET", f"/request?ref={quote(job.request_id)}").text)
    assert ("option", {"value": "command:900"}) in page.tags  # this rule takes a grant: the form offers it
    done = tab.decide(job.request_id, "allow", world.keys[world.op.pw_name], grant="command:900")
    assert done.status == 200 and done.json()["result"]["grant"]["scope"] == "command", done.text
    assert job.result()["ok"] is True
    grant_id = done.json()["result"]["grant"]["grant_id"]
    assert grant_id in tab.call("GET", "/grants").text
    marker.unlink()
    # The grant covers the same command again: it runs without asking anyone.
    again = world.stack.exec({"argv": argv, "privileged": True})
    assert again["ok"] is True and marker.exists()
    world.stack.native("grant.revoke", {"grant_id": grant_id}, path=world.stack.operator)


def test_a_file_edit_shows_its_hashes_and_its_diff_as_text(world: World, marks: Path) -> None:
    target = marks / "app.conf"
    target.write_text("listen 80;\n<script>alert('diff')</script>\n")
    request_id = f"web-file-{os.getpid()}"
    args = {"path": str(target), "old_text": "listen 80;", "new_text": "listen 8080;", "reason": "move the port"}
    reply: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: reply.update(world.stack.native("files_edit", {"time": now_iso()} | args, id=request_id))
    )
    thread.start()
    pending = wait_pending(world.stack, request_id)
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    assert pending["request"]["before_sha256"] == before
    html = world.signed_in(world.op).call("GET", f"/request?ref={quote(request_id)}").text
    page = Page.of(html)
    # The file, the content it is bound to and what it becomes, as hashes to compare with `airlock show`.
    assert f"files_edit {target}" in page.text and f"sha256 {before}" in page.text
    assert f"sha256 {pending['request']['after_sha256']}" in page.text
    # The diff (here the web reads as root, an operator; under systemd web.user is an observer and
    # gets the diff's hash and size only): file content is text on the page, never markup.
    assert "+listen 8080;" in page.text and " <script>alert('diff')</script>" in page.text
    assert "<script>alert" not in html and [t for t, _ in page.tags if t == "script"] == ["script"]
    world.stack.native("deny", {"id": request_id, "reason": "test over"}, path=world.stack.operator)
    thread.join(30)
    assert reply["ok"] is False and target.read_text().startswith("listen 80;")


def test_a_dns_rebound_host_name_reaches_nothing(world: World) -> None:
    # A page at evil.example whose name now resolves to 127.0.0.1 talks to the console as its own origin.
    evil = Tab(world.base, origin="http://evil.example:8787")
    for method, path in (("GET", "/signin"), ("GET", "/static/airlock-web.js"), ("POST", "/signin/begin")):
        reply = evil.call(method, path, body={} if method == "POST" else None, headers={"Host": "evil.example:8787"})
        assert reply.status == 421 and "Sign in" not in reply.text, (path, reply.status)
        assert reply.headers["Content-Security-Policy"] == CSP
    # Control: web.url's host (behind the proxy) and the loopback names (an SSH tunnel) are served.
    for host in ("airlock.test", "localhost:8787", "127.0.0.1", "[::1]:8787"):
        assert Tab(world.base).call("GET", "/signin", headers={"Host": host}).status == 200, host

"""airlock-web's HTTP server: routes, sessions, CSRF, security headers, socket activation.

HTTP is Debian 12's python3-aiohttp (3.8): a maintained asyncio server with
cookies, forms, JSON bodies, request size limits and serving on a socket
systemd hands over (`web.SockSite`), where the stdlib has only
``http.server`` (a thread per connection, no body limits, documented as not
for production).  Being in Debian, it is updated with the rest of the system.

Every page needs a session (a passkey sign-in, `sessions.py`), except the
sign-in page, the one-time enrollment page and the two static files.  Every
POST must come from this origin (``Origin`` and ``Sec-Fetch-Site``) and, once
signed in, carry the session's CSRF token.  A decision is two steps: approval
publishes the statement and the WebAuthn options for the request
(``passkey.decide_begin``), the browser's passkey signs them, and the
assertion goes back to approval (``passkey.decide``), which verifies it and
counts the vote of the person it names.  This process adds nothing a decision
could be made of: an observer's session sees no decide form, and its POST is
refused here and, failing that, by approval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from aiohttp import web

from airlock.common import log, webhold, weblisten
from airlock.common.config import Config, ConfigError, load
from airlock.common.notify import Notifier
from airlock.common.peer import identify, may_decide
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb
from airlock.web import fleetweb, pages
from airlock.web.door import Door, DoorError, decision_args
from airlock.web.markup import Markup
from airlock.web.sessions import Session
from airlock.web.tabs import Tabs, body_of

A = TypeVar("A", bound=Message)

EX_CONFIG = 78
MAX_BODY = 64 * 1024  # a WebAuthn credential is a few KiB; nothing here needs more
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
PENDING_REFRESH = 20  # seconds: the pending list reloads itself (a meta refresh: no script needed)
RECENT_EVENTS = 256  # the journal's newest events the decisions page reads (one page)

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
}
STATIC = {"airlock-web.js": "text/javascript", "airlock-web.css": "text/css"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Web:
    def __init__(self, config: Config, door: Door, host: str) -> None:
        self.config = config
        self.door = door
        self.host = host
        self.tabs = Tabs(config.web.url or "", config.web.session_minutes)  # cookie, per-tab proof, CSRF
        self.sessions, self.cookie = self.tabs.sessions, self.tabs.cookie
        self.log = log.get().bind(service="web")
        self.static = {name: resources.files("airlock.web").joinpath("static", name).read_bytes() for name in STATIC}

    # --- plumbing -------------------------------------------------------------------

    def origin_of(self, request: web.Request) -> str:
        if self.config.web.origin:
            return self.config.web.origin
        return f"{request.scheme}://{request.host}"

    def same_origin(self, request: web.Request) -> bool:
        """A POST must come from our own pages: ``Origin`` ours when sent, ``Sec-Fetch-Site`` same-origin when sent."""
        origin = request.headers.get("Origin")
        if origin is not None and origin != self.origin_of(request):
            return False
        site = request.headers.get("Sec-Fetch-Site")
        return site in (None, "same-origin")

    def session_of(self, request: web.Request, proof: object = None) -> Session | None:
        """The session the cookie names, when the request also carries its port-scoped proof (tabs.py)."""
        return self.tabs.whole(request, proof)

    def page(
        self, title: str, body: Markup, session: Session | None, status: int = 200, *, refresh: int = 0
    ) -> web.Response:
        text = pages.layout(title, body, session, self.host, refresh=refresh)
        return web.Response(text=str(text), content_type="text/html", charset="utf-8", status=status)

    def refuse(self, request: web.Request, status: int, text: str, session: Session | None = None) -> web.Response:
        if request.content_type == "application/json" or request.headers.get("Accept") == "application/json":
            return web.json_response({"ok": False, "error": text}, status=status)
        return self.page("Refused", pages.message(text), session, status)

    def known_host(self, request: web.Request) -> bool:
        """``Host`` names web.url's host or a loopback name: a DNS-rebound name reaches nothing."""
        host = (request.host or "").lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]")
        if name in LOOPBACK_NAMES:
            return True
        return bool(self.config.web.url) and name == (urlsplit(self.config.web.url).hostname or "").lower()

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Security headers on every answer; no traceback ever leaves (a 500 page, the error in the log)."""
        try:
            if not self.known_host(request):
                raise web.HTTPMisdirectedRequest(text="refused: this is not airlock-web's host name (web.url)")
            response = await handler(request)
        except web.HTTPException as exc:
            response = exc
        except Exception as exc:  # any bug becomes a plain 500, logged; never a traceback to the browser
            self.log.error("web.request.failed", path=request.path, error=f"{type(exc).__name__}: {exc}")
            response = self.page("Error", pages.message("internal error; see the service's log"), None, 500)
        for key, value in HEADERS.items():
            response.headers[key] = value
        return response

    async def signed_in(self, request: web.Request, *, refresh: int = 0) -> Session:
        """The page's session; without one, to the sign-in page (nothing of the page is sent).

        A navigation cannot carry the proof header: with the cookie alone the answer is an empty
        shell whose script fetches the same URL again with the proof from the tab's sessionStorage.
        """
        shell = str(pages.layout("Loading", pages.shell(), None, self.host, refresh=refresh))
        live = await self.live(request, self.tabs.page(request, shell))
        if live is None:
            raise web.HTTPSeeOther("/signin")
        return live

    async def live(self, request: web.Request, session: Session | None) -> Session | None:
        """approval's word on the session (passkey.session): a revoked passkey's or an ended one reads nothing."""
        if session is None:
            return None
        try:
            data = await self.door.call(op.PASSKEY_SESSION, pk.Session(session.ticket))
        except DoorError as exc:
            if exc.code == "unavailable":
                raise web.HTTPBadGateway(text=f"airlock-approval cannot be reached: {exc.message}") from None
            self.sessions.drop(request.cookies.get(self.cookie))
            self.log.info("web.session.ended", account=session.account, reason=exc.reason or exc.code)
            return None
        role = data.get("role")
        if role in ("operator", "observer") and role != session.role:
            return dataclasses.replace(session, role=role)  # approval says what the account is now
        return session

    async def posted(self, request: web.Request, *, need_session: bool) -> tuple[Session | None, dict[str, Any]]:
        """A state-changing request's session and body, or an HTTP refusal (origin, CSRF, size)."""
        if not self.same_origin(request):
            raise web.HTTPForbidden(text="refused: this request did not come from airlock-web's own pages")
        body = await body_of(request)
        session = self.tabs.changing(request, body)
        if need_session:
            session = await self.live(request, session)
            if session is None:
                raise web.HTTPUnauthorized(text="refused: sign in first")
            self.tabs.check_csrf(request, body, session)
        return session, body

    # --- pages ----------------------------------------------------------------------

    async def index(self, request: web.Request) -> web.StreamResponse:
        session = await self.signed_in(request, refresh=PENDING_REFRESH)
        try:
            data = await self.door.call(op.PENDING, Empty())
        except DoorError as exc:
            return self.page("Pending", pages.message(exc.message), session, 502)
        return self.page("Pending", pages.pending_list(data.get("pending") or []), session, refresh=PENDING_REFRESH)

    async def request_page(self, request: web.Request) -> web.StreamResponse:
        session = await self.signed_in(request)
        ref = request.query.get("ref", "")
        if not ref or len(ref) > 256:
            return self.page("Request", pages.message("no such request"), session, 404)
        try:
            shown = await self.door.call(op.SHOW, op.Show(ref))
        except DoorError as exc:
            return self.page("Request", pages.message(f"{exc.code}: {exc.message}"), session, 404)
        return self.page("Request", pages.request_view(shown, session), session)

    async def grants_page(self, request: web.Request) -> web.StreamResponse:
        session = await self.signed_in(request)
        try:
            data = await self.door.call(op.GRANTS, Empty())
        except DoorError as exc:
            return self.page("Grants", pages.message(exc.message), session, 502)
        return self.page("Live grants", pages.grants_list(data.get("grants") or []), session)

    async def decisions_page(self, request: web.Request) -> web.StreamResponse:
        session = await self.signed_in(request)
        try:
            data = await self.door.call(op.EVENTS, op.Events(tail=RECENT_EVENTS, limit=RECENT_EVENTS))
        except DoorError as exc:
            return self.page("Decisions", pages.message(exc.message), session, 502)
        return self.page("Recent decisions", pages.decisions_list(data.get("events") or []), session)

    async def signin_page(self, request: web.Request) -> web.StreamResponse:
        return self.page("Sign in", pages.signin_page(), self.session_of(request))

    async def enroll_page(self, request: web.Request) -> web.StreamResponse:
        token = request.match_info["token"]
        # Refused before any touch: an unknown, used or expired link shows no "Create passkey" button.
        try:
            data = await self.door.call(op.PASSKEY_REGISTER_BEGIN, pk.Enrolment(token))
        except DoorError as exc:
            return self.page("Enroll a passkey", pages.message(exc.message), None, 404)
        return self.page("Enroll a passkey", pages.enroll_page(token, str(data.get("account") or "")), None)

    async def static_file(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in STATIC:
            raise web.HTTPNotFound()
        return web.Response(body=self.static[name], content_type=STATIC[name], charset="utf-8")

    # --- the WebAuthn steps (JSON, called by static/airlock-web.js) ----------------------

    async def _relay(self, verb: Verb[A, Any], args: A) -> dict[str, Any] | web.Response:
        try:
            return await self.door.call(verb, args)
        except DoorError as exc:
            self.log.info("web.refused", verb=verb.name, code=exc.code)
            statuses = {"unavailable": 502, "unauthorized": 403, "rate_limited": 429, "busy": 429}
            status = statuses.get(exc.reason, statuses.get(exc.code, 400))
            return web.json_response({"ok": False, "code": exc.code, "error": exc.message}, status=status)

    async def signin_begin(self, request: web.Request) -> web.StreamResponse:
        _, body = await self.posted(request, need_session=False)
        client, minted = self.tabs.client(request, body)
        data = await self._relay(op.PASSKEY_LOGIN_BEGIN, pk.LoginBegin(client))
        if isinstance(data, web.Response):
            return data
        answer = {"ok": True, "options": data.get("options"), "challenge_id": data.get("challenge_id")}
        response = web.json_response(answer)
        self.tabs.keep_pre(response, minted)
        return response

    async def signin_finish(self, request: web.Request) -> web.StreamResponse:
        _, body = await self.posted(request, need_session=False)
        client, _minted = self.tabs.client(request, body)
        args = pk.LoginFinish(client, challenge_id=body.get("challenge_id"), credential=body.get("credential"))
        data = await self._relay(op.PASSKEY_LOGIN_FINISH, args)
        if isinstance(data, web.Response):
            return data
        account, role = data.get("account"), data.get("role")
        if not isinstance(account, str) or role not in ("operator", "observer"):
            return web.json_response({"ok": False, "error": "approval's answer names no account"}, status=502)
        ticket = data.get("session")
        if not isinstance(ticket, str) or not ticket:
            return web.json_response({"ok": False, "error": "approval's answer opens no session"}, status=502)
        token, session = self.tabs.open(request, account, role, str(data.get("credential_id") or ""), ticket)
        self.log.info("web.signed_in", account=account, role=role, credential_id=session.credential_id)
        # The proof goes to the console's own script only (a JSON answer to its same-origin POST).
        answer = {"ok": True, "account": account, "role": role, "next": "/", "proof": session.proof}
        response = web.json_response(answer)
        self.tabs.opened(response, token)
        return response

    async def signout(self, request: web.Request) -> web.StreamResponse:
        session, _ = await self.posted(request, need_session=True)
        self.log.info("web.signed_out", account=session.account if session else None)
        response = web.HTTPSeeOther("/signin")
        self.tabs.close(request, response)
        return response

    async def enroll_begin(self, request: web.Request) -> web.StreamResponse:
        _, body = await self.posted(request, need_session=False)
        data = await self._relay(op.PASSKEY_REGISTER_BEGIN, pk.Enrolment(body.get("token")))
        if isinstance(data, web.Response):
            return data
        return web.json_response({"ok": True, "options": data.get("options")})

    async def enroll_finish(self, request: web.Request) -> web.StreamResponse:
        _, body = await self.posted(request, need_session=False)
        args = pk.Register(body.get("token"), body.get("credential"))
        data = await self._relay(op.PASSKEY_REGISTER_FINISH, args)
        if isinstance(data, web.Response):
            return data
        return web.json_response({"ok": True, "account": data.get("account"), "next": "/signin"})

    def _deciding(self, session: Session | None) -> Session:
        if session is None or not session.decides:
            # approval refuses an observer's assertion too; this spares it the round trip.
            self.log.warning("web.decide.refused", account=session.account if session else None)
            raise web.HTTPForbidden(text="refused: an observer's session cannot decide")
        return session

    async def decide_begin(self, request: web.Request) -> web.StreamResponse:
        session, body = await self.posted(request, need_session=True)
        self._deciding(session)
        data = await self._relay(op.PASSKEY_DECIDE_BEGIN, pk.DecideBegin(**decision_args(body)))
        if isinstance(data, web.Response):
            return data
        return web.json_response({"ok": True, "statement": data.get("statement"), "options": data.get("options")})

    async def decide(self, request: web.Request) -> web.StreamResponse:
        session, body = await self.posted(request, need_session=True)
        who = self._deciding(session)
        if body.get("credential") is None:
            raise web.HTTPBadRequest(text="refused: a decision needs your passkey's signature (enable JavaScript)")
        args = pk.Decide(**decision_args(body), statement=body.get("statement"), credential=body.get("credential"))
        data = await self._relay(op.PASSKEY_DECIDE, args)
        if isinstance(data, web.Response):
            return data
        self.log.info("web.decided", account=who.account, request_id=body.get("ref"), decision=body.get("decision"))
        return web.json_response({"ok": True, "result": data})

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard], client_max_size=MAX_BODY)
        app.router.add_get("/", self.index)
        app.router.add_get("/request", self.request_page)
        app.router.add_get("/grants", self.grants_page)
        app.router.add_get("/decisions", self.decisions_page)
        app.router.add_get("/signin", self.signin_page)
        app.router.add_post("/signin/begin", self.signin_begin)
        app.router.add_post("/signin/finish", self.signin_finish)
        app.router.add_post("/signout", self.signout)
        app.router.add_get("/enroll/{token}", self.enroll_page)
        app.router.add_post("/enroll/begin", self.enroll_begin)
        app.router.add_post("/enroll/finish", self.enroll_finish)
        app.router.add_post("/decide/begin", self.decide_begin)
        app.router.add_post("/decide", self.decide)
        app.router.add_get("/static/{name}", self.static_file)
        return app


async def serve(config: Config, sockets: list[socket.socket], socket_path: str, host: str) -> None:
    app = fleetweb.app_for(config) or Web(config, Door(socket_path), host).app()  # issue 49: fleet mode
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    for sock in sockets:
        await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    notifier = Notifier()
    names = [sock.getsockname() for sock in sockets]
    where = " ".join(n if isinstance(n, str) else webhold.shown((n[0], n[1])) for n in names)
    log.get().info("web.ready", listen=where, operator_socket=socket_path, url=config.web.url)
    notifier.ready(f"serving on {where}")
    interval = notifier.watchdog_interval()
    while not stop.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval or 3600)
        notifier.watchdog()
    log.get().info("web.stopping")
    notifier.stopping()
    await runner.cleanup()
    log.get().info("web.stopped")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="airlock-web",
        description="The airlock web console: pending requests, grants and decisions in a browser, "
        "each decision signed by the operator's passkey and verified by airlock-approval.",
    )
    parser.add_argument("--config", default=None, help="configuration file (default: /etc/airlock/airlock.yaml)")
    parser.add_argument("--socket", default=None, help="operator.sock (default: the configured runtime_dir's)")
    # `airlock dev up`: every service runs as the invoking user there
    parser.add_argument("--dev", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    try:
        config = load(Path(ns.config) if ns.config else None)
    except ConfigError as exc:
        print(f"airlock-web: {exc}", file=sys.stderr)
        return EX_CONFIG
    log.configure("web", level=config.log.level, target=config.log.target)
    logger = log.get()
    me = identify(os.getpid(), os.geteuid(), os.getegid(), os.getgroups())
    if (
        not ns.dev
        and me.uid != 0
        and me.user != config.web.user
        and may_decide(me, config.operators.users, config.operators.groups, config.operators.observers.users)
    ):
        # approval treats web.user as an observer whatever its groups; any other account that may
        # decide would hold more than the console needs (it carries decisions, it never makes one).
        error = (
            f"airlock-web runs as {me.user}, not as web.user ({config.web.user}), and {me.user} may decide on "
            "operator.sock: run it as web.user (the unit's User=) or make that user an observer"
        )
        logger.error("web.start.failed", error=error)
        print(f"airlock-web: {error}", file=sys.stderr)
        return EX_CONFIG
    sockets = weblisten.passed_sockets()
    if not sockets:
        try:
            sockets = weblisten.bind(config.web.listen, config.web.url)
        except OSError as exc:
            logger.error("web.start.failed", error=f"{config.web.listen}: {exc.strerror or exc}")
            print(f"airlock-web: cannot listen on {config.web.listen}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    refusal = weblisten.unheld(config.web.url, sockets)
    if refusal is not None:
        # Fail closed: serving half an origin hands the other half (and every passkey) to whoever takes it.
        logger.error("web.start.failed", error=refusal)
        print(f"airlock-web: {refusal}", file=sys.stderr)
        return EX_CONFIG
    socket_path = ns.socket or str(config.socket_path("operator"))
    host = config.notify.host or socket.gethostname()
    asyncio.run(serve(config, sockets, socket_path, host))
    return 0

"""The fleet console's sign-in (issue 49): a passkey assertion verified by a host, never by the bastion.

The bastion holds no credential: a sign-in's challenge is a host's
(``passkey.login_begin`` carried over SSH by ``airlock passkey carry --verb
login_begin``, bound to this browser's pre-session cookie and tab key), and
so is the check of the assertion (``login_finish``: origin, RP ID, user
verification, signature, counter, and the account's role there).  The first
host that answers is asked; the challenge is finished on the same host.  The
console then keeps a session of its own in memory with the single-host
console's rules (`tabs.Tabs`: a ``__Host-`` cookie where the browser takes
it, the tab's proof on every request, the CSRF token on every change; it
ends at ``web.session_minutes``, at sign-out or at a restart): it lets a
person *see* the page; every decision is still a touch each host verifies.

Like the single-host console, the session lives only while the host that
signed it in says so (``passkey.session``, carried; asked at most every
`LIVE_SECONDS`): a revoked passkey's sessions end there, and then here.  A
host that cannot be reached keeps the session (it only shows the page).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Final

from aiohttp import web

from airlock.common.config import Config
from airlock.common.log import get as get_logger
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk
from airlock.web.fleet import Fleet
from airlock.web.sessions import Session
from airlock.web.tabs import Tabs

MAX_SIGNINS: Final = 256  # sign-in challenges open at once (each a host's, 5 minutes)
SIGNIN_SECONDS: Final = 300.0
LIVE_SECONDS: Final = 10.0  # a host's word that a session is live is taken this long (one SSH call per tab)
log = get_logger("airlock.web.fleetsignin")


class SignIn:
    """Sign-ins carried to a host, and the console's sessions (`tabs.Tabs`)."""

    def __init__(self, config: Config, fleet: Fleet) -> None:
        self.config = config
        self.fleet = fleet
        self.tabs = Tabs(config.web.url or "", config.web.session_minutes, name="airlock-fleet")
        self.open: dict[str, tuple[str, float]] = {}  # challenge ID -> (host, until)
        self.hosts: dict[str, str] = {}  # a session's ticket -> the host that signed it in and keeps it
        self.checked: dict[str, float] = {}  # a session's ticket -> when that host last said it is live

    async def begin(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        now = time.time()
        self.open = {k: v for k, v in self.open.items() if v[1] > now}
        if len(self.open) >= MAX_SIGNINS:
            return web.json_response({"ok": False, "error": "too many sign-ins open; try again"}, status=429)
        client, minted = self.tabs.client(request, body)
        # A host that answered last time first; the first one that answers now signs in.
        views = self.fleet.views
        ordered = sorted(self.fleet.hosts, key=lambda h: (bool(views[h].error), -views[h].contact))
        for host in ordered[:3]:
            reply = await self.fleet.call(host, op.PASSKEY_LOGIN_BEGIN, pk.LoginBegin(client))
            if reply.get("ok"):
                data = reply.get("data") or {}
                self.open[str(data.get("challenge_id"))] = (host, now + SIGNIN_SECONDS)
                response = web.json_response({"ok": True} | {k: data.get(k) for k in ("options", "challenge_id")})
                self.tabs.keep_pre(response, minted)
                return response
        return web.json_response({"ok": False, "error": "no host answered to sign in"}, status=502)

    async def finish(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        client, _ = self.tabs.client(request, body)
        challenge_id = str(body.get("challenge_id"))
        host, until = self.open.pop(challenge_id, ("", 0.0))
        if not host or until <= time.time():
            return web.json_response({"ok": False, "error": "no such sign-in (or it expired)"}, status=401)
        args = pk.LoginFinish(client, challenge_id=challenge_id, credential=body.get("credential"))
        reply = await self.fleet.call(host, op.PASSKEY_LOGIN_FINISH, args)
        data = reply.get("data") or {}
        account, role = data.get("account"), data.get("role")
        if not reply.get("ok") or not isinstance(account, str) or role not in ("operator", "observer"):
            error = (reply.get("error") or {}).get("message") or "refused"
            return web.json_response({"ok": False, "error": f"{host}: {error}"}, status=401)
        ticket = data.get("session")  # that host's console session: `live` asks the host about it
        if not isinstance(ticket, str) or not ticket:
            return web.json_response({"ok": False, "error": f"{host}: the answer opens no session"}, status=502)
        token, session = self.tabs.open(request, account, str(role), str(data.get("credential_id") or ""), ticket)
        kept = {s.ticket for s in self.tabs.sessions.all()}
        self.hosts = {t: h for t, h in self.hosts.items() if t in kept} | {ticket: host}
        self.checked = {t: c for t, c in self.checked.items() if t in kept} | {ticket: time.time()}
        # The proof goes to the console's own script only (a JSON answer to its same-origin POST).
        answer = {"ok": True, "account": account, "role": role, "host": host, "next": "/", "proof": session.proof}
        response = web.json_response(answer)
        self.tabs.opened(response, token)
        return response

    async def live(self, request: web.Request, session: Session) -> Session | None:
        """The sign-in host's word on ``session`` (at most every `LIVE_SECONDS`); None: it ended there."""
        host, now = self.hosts.get(session.ticket), time.time()
        if host is not None and now - self.checked.get(session.ticket, 0.0) < LIVE_SECONDS:
            return session
        if host is not None:
            reply = await self.fleet.call(host, op.PASSKEY_SESSION, pk.Session(session.ticket))
            error = reply.get("error") or {}
            if reply.get("ok") or error.get("code") == "unreachable":
                if not reply.get("ok"):
                    log.warning("web.fleet.session_unchecked", host=host, account=session.account)
                self.checked[session.ticket] = now
                role = (reply.get("data") or {}).get("role")
                if role in ("operator", "observer") and role != session.role:
                    return dataclasses.replace(session, role=role)  # the host says what the account is now
                return session
        self.tabs.sessions.drop(request.cookies.get(self.tabs.cookie))
        self.hosts.pop(session.ticket, None)
        self.checked.pop(session.ticket, None)
        log.info("web.session.ended", account=session.account, host=host)
        return None

    def signout(self, request: web.Request) -> web.StreamResponse:
        response = web.HTTPSeeOther("/signin")
        self.tabs.close(request, response)
        return response


SIGNIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>airlock fleet: sign in</title>
<link rel="stylesheet" href="/static/airlock-web.css">
<script src="/static/airlock-fleet.js" defer></script>
</head><body><header><p class="brand">airlock fleet</p></header><main>
<h1>Sign in with your passkey</h1>
<form id="signin" class="signin"><button type="submit">Sign in</button></form>
<p id="signin-status" class="status" role="status"></p>
</main></body></html>
"""

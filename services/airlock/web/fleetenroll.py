"""The fleet console's enrollment (issue 49): a host's one-time link, served by the bastion, verified by the host.

``airlock passkey enroll ACCOUNT`` on a host whose ``web.url`` is the
console's and whose ``web.fleet_name`` is NAME prints
``WEB_URL/enroll/TOKEN?host=NAME``.  The bastion serves that page only for a
host of its own (``web.fleet_hosts``) and sends the token to that host
alone: the registration's two steps are carried there (``airlock passkey
carry --verb register_begin|register_finish``, over the console's observer
login), and the host's approval verifies the new passkey against the
console's origin and RP ID, stores it and journals it (``passkey.enrolled``)
as its own console would.  The bastion keeps nothing.

Enrollment needs no session (the link is the trust), so what it may cost
the bastion is bounded: a token that cannot be one is never carried, and at
most `CARRIES_PER_MINUTE` steps go to the hosts (more: "try again").
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web

from airlock.common.log import get as get_logger
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk
from airlock.common.wire.verb import Verb
from airlock.web import pages
from airlock.web.fleet import Fleet
from airlock.web.markup import Markup
from airlock.web.tabs import body_of

CARRIES_PER_MINUTE: Final = 30
log = get_logger("airlock.web.fleetenroll")


class Enrollment:
    """The three enrollment routes (the page, begin, finish) of the fleet console."""

    def __init__(self, fleet: Fleet, render: Callable[[str, Markup], str]) -> None:
        self.fleet = fleet
        self.render = render  # a whole page of the console's, from a title and its body
        self._carried: deque[float] = deque(maxlen=CARRIES_PER_MINUTE)

    def _enrolling(self, name: object) -> str | None:
        """The link's host, when it is one of this console's (the token goes to that host alone)."""
        return name if isinstance(name, str) and name in self.fleet.views else None

    async def _carry(self, host: str, verb: Verb[Any, Any], args: pk.Enrolment) -> dict[str, Any] | web.Response:
        """An enrollment step carried to ``host``: its data, or the refusal as JSON (a bad link, a flood)."""
        token = args.token
        if not isinstance(token, str) or not 16 <= len(token) <= 128:  # as approval's check: never carried
            return web.json_response({"ok": False, "error": "no such enrollment link"}, status=400)
        now, carried = time.monotonic(), self._carried
        if len(carried) == carried.maxlen and now - carried[0] < 60:
            return web.json_response({"ok": False, "error": "too many enrollment steps; try again"}, status=429)
        carried.append(now)
        reply = await self.fleet.call(host, verb, args)
        if reply.get("ok"):
            return dict(reply.get("data") or {})
        error = reply.get("error") or {}
        status = 502 if error.get("code") == "unreachable" else 400
        log.info("web.fleet.enroll_refused", host=host, code=error.get("code"))
        return web.json_response({"ok": False, "error": f"{host}: {error.get('message') or 'refused'}"}, status=status)

    async def page(self, request: web.Request) -> web.StreamResponse:
        token, host = request.match_info["token"], self._enrolling(request.query.get("host"))
        title = "airlock fleet: enroll a passkey"
        if host is None:
            said = pages.message(
                "this enrollment link names no host of this console: print it on a host whose web.fleet_name is "
                "its name in this console's web.fleet_hosts (docs/fleet.md)"
            )
            return web.Response(text=self.render(title, said), content_type="text/html", status=404)
        # Refused before any touch: an unknown, used or expired link shows no "Create passkey" button.
        data = await self._carry(host, op.PASSKEY_REGISTER_BEGIN, pk.Enrolment(token))
        if isinstance(data, web.Response):
            said = pages.message(f"{host}: no such enrollment link (or it expired or was used)")
            return web.Response(text=self.render(title, said), content_type="text/html", status=404)
        shown = pages.enroll_page(token, str(data.get("account") or ""), host=host)
        return web.Response(text=self.render(title, shown), content_type="text/html")

    async def begin(self, request: web.Request) -> web.StreamResponse:
        body = await body_of(request)
        host = self._enrolling(body.get("host"))
        if host is None:
            return web.json_response({"ok": False, "error": "no such host on this console"}, status=404)
        data = await self._carry(host, op.PASSKEY_REGISTER_BEGIN, pk.Enrolment(body.get("token")))
        if isinstance(data, web.Response):
            return data
        return web.json_response({"ok": True, "options": data.get("options")})

    async def finish(self, request: web.Request) -> web.StreamResponse:
        body = await body_of(request)
        host = self._enrolling(body.get("host"))
        if host is None:
            return web.json_response({"ok": False, "error": "no such host on this console"}, status=404)
        data = await self._carry(
            host, op.PASSKEY_REGISTER_FINISH, pk.Register(body.get("token"), body.get("credential"))
        )
        if isinstance(data, web.Response):
            return data
        log.info("web.fleet.enrolled", host=host, account=data.get("account"), credential_id=data.get("credential_id"))
        return web.json_response({"ok": True, "account": data.get("account"), "host": host, "next": "/signin"})

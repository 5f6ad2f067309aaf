"""A signed-in browser tab: the session cookie, the tab's proof, the CSRF token and the page shell (issue 46).

Both consoles hold their sessions through this one object -- the
single-host console (`service.Web`) and the fleet console on a bastion
(`fleetweb.FleetWeb`) -- so a session means the same on both:

- the cookie is ``__Host-NAME`` (``Secure``, ``Path=/``, no ``Domain``)
  wherever the browser takes it: over TLS, and on ``http://localhost``,
  which browsers treat as a secure context; HttpOnly, SameSite=Strict;
- a cookie alone is half a session: cookies ignore ports, so any page a
  local user serves on another ``localhost`` port receives it.  The other
  half is the tab's proof (`sessions.Session.proof`), given once in the
  sign-in answer to the console's own script, kept in the tab's
  ``sessionStorage`` (scoped to the origin, port included) and sent as
  ``X-Airlock-Proof`` on every request;
- a navigation cannot carry a header: a page asked for with the cookie
  alone is answered with an empty shell whose script fetches the same URL
  again with the proof (static/airlock-web.js);
- every state-changing request also carries the session's CSRF token
  (``X-Airlock-CSRF`` or a ``csrf`` form field).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from airlock.common import log, webhold
from airlock.web.sessions import Session, Sessions

PROOF_HEADER = "X-Airlock-Proof"
CSRF_HEADER = "X-Airlock-CSRF"


def secure_origin(url: str) -> bool:
    """Does a browser keep a ``Secure`` (so ``__Host-``) cookie for ``url``: TLS, or a loopback name."""
    parts = urlsplit(url or "")
    return parts.scheme == "https" or bool(webhold.required(url or "") and parts.hostname)


async def body_of(request: web.Request) -> dict[str, Any]:
    """A POST's body as a dict (a JSON object or a form's text fields), or 400."""
    loaded: object
    try:
        if request.content_type == "application/json":
            loaded = await request.json()
        else:
            loaded = {k: v for k, v in (await request.post()).items() if isinstance(v, str)}
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        raise web.HTTPBadRequest(text="refused: the body is not a form or a JSON object")
    return loaded


class Tabs:
    """The console's sessions as browser tabs hold them (see the module's docstring)."""

    def __init__(self, url: str, minutes: float, name: str = "airlock") -> None:
        self.sessions = Sessions(minutes)
        self.seconds = int(minutes * 60)
        self.secure = secure_origin(url)
        self.cookie = f"__Host-{name}" if self.secure else name
        self.pre_cookie = f"{self.cookie}-pre"  # the browser a sign-in challenge is bound to (approval/logins.py)
        self.log = log.get().bind(service="web")

    def half(self, request: web.Request) -> Session | None:
        """The session the cookie names: half of one (any localhost port receives the cookie)."""
        return self.sessions.get(request.cookies.get(self.cookie))

    def whole(self, request: web.Request, proof: object = None) -> Session | None:
        """The session the cookie names, when the request also carries its port-scoped proof."""
        session = self.half(request)
        given = request.headers.get(PROOF_HEADER) if proof is None else proof
        return session if session is not None and session.proof_ok(given) else None

    def page(self, request: web.Request, shell: str) -> Session:
        """A page's session; without a cookie, to the sign-in page; with the cookie alone, ``shell``
        (the script asks again with the proof); with a wrong proof, 401.  Nothing of the page is sent."""
        half = self.half(request)
        if half is None:
            raise web.HTTPSeeOther("/signin")
        if PROOF_HEADER not in request.headers:
            raise web.HTTPOk(text=shell, content_type="text/html")
        session = self.whole(request)
        if session is None:
            self.log.warning("web.proof.refused", account=half.account, path=request.path)
            raise web.HTTPUnauthorized(text="refused: this tab's sign-in proof is missing or wrong; sign in again")
        return session

    def changing(self, request: web.Request, body: dict[str, Any]) -> Session | None:
        """A state-changing request's session: the proof from the header or the form's ``proof`` field."""
        return self.whole(request, request.headers.get(PROOF_HEADER) or body.get("proof"))

    def check_csrf(self, request: web.Request, body: dict[str, Any], session: Session) -> None:
        token = request.headers.get(CSRF_HEADER) or body.get("csrf")
        if not session.csrf_ok(token):
            self.log.warning("web.csrf.refused", account=session.account, path=request.path)
            raise web.HTTPForbidden(text="refused: missing or wrong CSRF token")

    def client(self, request: web.Request, body: dict[str, Any]) -> tuple[str, str | None]:
        """The sign-in client: this browser's pre-session cookie and its tab's key, hashed; and a new
        cookie to set (`keep_pre`) when it had none.  approval binds each challenge to it."""
        token = request.cookies.get(self.pre_cookie) or ""
        minted = None
        if not 32 <= len(token) <= 128:
            token = minted = secrets.token_urlsafe(32)
        tab = body.get("tab")
        tab = tab[:128] if isinstance(tab, str) else ""
        return hashlib.sha256(f"{token}\n{tab}".encode()).hexdigest(), minted

    def keep_pre(self, response: web.StreamResponse, minted: str | None) -> None:
        if minted is not None:
            response.set_cookie(self.pre_cookie, minted, path="/", secure=self.secure, httponly=True, samesite="Strict")

    def open(
        self, request: web.Request, account: str, role: str, credential_id: str, ticket: str
    ) -> tuple[str, Session]:
        """A new session after a verified sign-in (a new sign-in never keeps the old cookie): the cookie's
        token for `opened` and the session, whose proof goes to the console's own script only."""
        self.sessions.drop(request.cookies.get(self.cookie))
        return self.sessions.create(account, role, credential_id, ticket)

    def opened(self, response: web.StreamResponse, token: str) -> None:
        response.set_cookie(
            self.cookie, token, max_age=self.seconds, path="/", secure=self.secure, httponly=True, samesite="Strict"
        )

    def close(self, request: web.Request, response: web.StreamResponse) -> None:
        """Sign-out: the session dropped, the cookie expired as it was set (a browser ignores a
        ``__Host-`` cookie's deletion without ``Secure``)."""
        self.sessions.drop(request.cookies.get(self.cookie))
        response.set_cookie(self.cookie, "", max_age=0, path="/", secure=self.secure, httponly=True, samesite="Strict")

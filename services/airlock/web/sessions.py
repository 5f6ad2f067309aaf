"""Sign-in sessions: short-lived, held in memory, each with its CSRF token.

A session is made only after approval has verified a passkey sign-in
(``passkey.login_finish`` names the account and its role).  The cookie holds a
random 256-bit token; the server keeps only its SHA-256, so the table says
nothing a stolen memory dump could replay as a cookie.  Sessions end after
``web.session_minutes`` from sign-in (not sliding: a phone left signed in
stops working on its own), on sign-out, and when the service restarts (kept in
memory only: signing in again is one touch of the passkey).  The CSRF token is
a second random value bound to the session; every state-changing request must
carry it (a form field or the ``X-Airlock-CSRF`` header), compared in constant
time.

A cookie alone is not a session (issue 46): cookies ignore ports, so a page
any local user serves on another ``localhost`` port receives the console's
cookie.  Each session also has a *proof*, given once in the sign-in answer
(readable only by the console's own script), kept in the tab's
``sessionStorage`` (scoped to the origin, port included) and sent as the
``X-Airlock-Proof`` header on every request; `Session.proof_ok` compares it
in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

MAX_SESSIONS = 1024  # the oldest sessions go first beyond this (a flood of sign-ins cannot grow memory)


@dataclass(frozen=True, slots=True)
class Session:
    account: str
    role: str  # "operator" or "observer", as approval said at sign-in
    credential_id: str
    csrf: str
    proof: str  # the port-scoped second half: X-Airlock-Proof from the tab's sessionStorage
    created: float
    expires: float
    ticket: str = ""  # approval's session (passkey.session, asked on every request: revocation ends it)

    @property
    def decides(self) -> bool:
        return self.role == "operator"

    def csrf_ok(self, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.csrf.encode())

    def proof_ok(self, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given.encode(), self.proof.encode())


def _key(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Sessions:
    def __init__(self, minutes: float) -> None:
        self.seconds = minutes * 60.0
        self._by_key: dict[str, Session] = {}

    def create(
        self, account: str, role: str, credential_id: str, ticket: str = "", now: float | None = None
    ) -> tuple[str, Session]:
        """A new session; returns (the cookie's token, the session)."""
        now = time.time() if now is None else now
        self._expire(now)
        while len(self._by_key) >= MAX_SESSIONS:
            del self._by_key[next(iter(self._by_key))]
        token = secrets.token_urlsafe(32)
        csrf, proof = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        session = Session(account, role, credential_id, csrf, proof, now, now + self.seconds, ticket)
        self._by_key[_key(token)] = session
        return token, session

    def get(self, token: str | None, now: float | None = None) -> Session | None:
        if not token or len(token) > 128:
            return None
        now = time.time() if now is None else now
        session = self._by_key.get(_key(token))
        if session is None:
            return None
        if session.expires <= now:
            del self._by_key[_key(token)]
            return None
        return session

    def all(self) -> list[Session]:
        return list(self._by_key.values())

    def drop(self, token: str | None) -> None:
        if token:
            self._by_key.pop(_key(token), None)

    def _expire(self, now: float) -> None:
        for key in [k for k, s in self._by_key.items() if s.expires <= now]:
            del self._by_key[key]

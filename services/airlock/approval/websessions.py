"""The console sessions a passkey sign-in made, kept where revocation happens (issue 46, item 4).

airlock-web keeps its cookies, but the session behind each is approval's:
``passkey.login_finish`` opens one here (an unguessable token, kept only as
its SHA-256) and airlock-web asks ``passkey.session`` on every request.  So
revoking a passkey ends every session it made at once, ``passkey.list``
shows the live sessions of each passkey, and ``passkey.sessions_end`` ends
all sessions of an account.  In memory: approval restarting ends every
console session (signing in again is one touch).

Pure: no I/O (the caller passes the time).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_SESSIONS = 1024  # the oldest go first beyond this


@dataclass(frozen=True, slots=True)
class WebSession:
    key: str  # sha256 of the token: what a listing may show (a prefix), never the token
    account: str
    credential_id: str
    created: float
    expires: float


def _key(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(slots=True)
class WebSessions:
    _by_key: dict[str, WebSession] = field(default_factory=dict)

    def open(self, account: str, credential_id: str, seconds: float, now: float) -> tuple[str, WebSession]:
        """A new session: (its token, for airlock-web only; the session)."""
        self._expire(now)
        while len(self._by_key) >= MAX_SESSIONS:
            del self._by_key[next(iter(self._by_key))]
        token = secrets.token_urlsafe(32)
        session = WebSession(_key(token), account, credential_id, now, now + seconds)
        self._by_key[session.key] = session
        return token, session

    def get(self, token: object, now: float) -> WebSession | None:
        if not isinstance(token, str) or not 16 <= len(token) <= 128:
            return None
        found = self._by_key.get(_key(token))
        if found is not None and found.expires <= now:
            del self._by_key[found.key]
            return None
        return found

    def live(self, now: float) -> list[WebSession]:
        self._expire(now)
        return list(self._by_key.values())

    def end(self, which: Callable[[WebSession], bool]) -> list[WebSession]:
        """End every session ``which`` picks; the ones ended."""
        ended = [s for s in self._by_key.values() if which(s)]
        for session in ended:
            del self._by_key[session.key]
        return ended

    def _expire(self, now: float) -> None:
        self.end(lambda s: s.expires <= now)

"""Sign-in challenges that another client cannot crowd out (issue 46, item 3).

``passkey.login_begin`` needs no session, so anyone who reaches airlock-web
can ask for challenges.  They used to share one table of the newest 1,024:
a loop of begins evicted the operator's own challenge while they touched
the key.  Now each challenge is bound to the browser that asked (``client``:
airlock-web's pre-session cookie, hashed), and:

- a client holds at most one challenge (a new begin replaces its own);
- a client may begin `PER_CLIENT` times a minute, all clients together
  `GLOBAL` times a minute;
- when `MAX_OUTSTANDING` challenges are open, a new begin is refused: no
  challenge is ever evicted for another client's;
- ``login_finish`` spends a challenge only for the client it was made for.

Pure: no I/O (the caller passes the time and the random bytes' source).
"""

from __future__ import annotations

import secrets
from collections import deque
from dataclasses import dataclass, field

from airlock.common.errors import AirlockError, ErrorCode

LOGIN_SECONDS = 300.0
MAX_OUTSTANDING = 1024
PER_CLIENT = 10  # begins per client per minute
GLOBAL = 600  # begins per minute, all clients together
WINDOW = 60.0


@dataclass(frozen=True, slots=True)
class Challenge:
    challenge: bytes
    client: str
    expires: float


@dataclass(slots=True)
class Logins:
    """The open sign-in challenges by ID, each bound to its client."""

    _open: dict[str, Challenge] = field(default_factory=dict)
    _by_client: dict[str, str] = field(default_factory=dict)
    _begun: dict[str, deque[float]] = field(default_factory=dict)
    _all_begun: deque[float] = field(default_factory=deque)

    def __len__(self) -> int:
        return len(self._open)

    def _expire(self, now: float) -> None:
        for cid in [c for c, found in self._open.items() if found.expires <= now]:
            self._drop(cid)
        for client in [c for c, times in self._begun.items() if _trim(times, now) == 0]:
            del self._begun[client]
        _trim(self._all_begun, now)

    def _drop(self, challenge_id: str) -> Challenge | None:
        found = self._open.pop(challenge_id, None)
        if found is not None and self._by_client.get(found.client) == challenge_id:
            del self._by_client[found.client]
        return found

    def begin(self, client: str, now: float) -> tuple[str, bytes]:
        """A new challenge for ``client`` (its previous one, if any, replaced); refused past the rates."""
        self._expire(now)
        mine = self._begun.setdefault(client, deque())
        if len(mine) >= PER_CLIENT:
            raise _limited(f"this browser asked for {len(mine)} sign-ins in a minute", mine[0] + WINDOW - now)
        if len(self._all_begun) >= GLOBAL:
            raise _limited("too many sign-ins were asked for this minute", self._all_begun[0] + WINDOW - now)
        previous = self._by_client.get(client)
        if previous is not None:
            self._drop(previous)
        if len(self._open) >= MAX_OUTSTANDING:
            # Never evict: an operator's challenge in flight outlives any flood of others'.
            raise AirlockError(ErrorCode.BUSY, "too many sign-ins are in progress; try again in a few minutes")
        mine.append(now)
        self._all_begun.append(now)
        challenge_id, challenge = secrets.token_urlsafe(18), secrets.token_bytes(32)
        self._open[challenge_id] = Challenge(challenge, client, now + LOGIN_SECONDS)
        self._by_client[client] = challenge_id
        return challenge_id, challenge

    def finish(self, challenge_id: object, client: str, now: float) -> bytes | None:
        """The challenge to check an assertion against, spent; None when unknown, expired or another client's."""
        if not isinstance(challenge_id, str):
            return None
        found = self._open.get(challenge_id)
        if found is None or found.client != client:
            return None  # another browser's challenge is not spent by this one's attempt
        self._drop(challenge_id)
        return found.challenge if found.expires > now else None


def _trim(times: deque[float], now: float) -> int:
    while times and times[0] <= now - WINDOW:
        times.popleft()
    return len(times)


def _limited(what: str, retry: float) -> AirlockError:
    retry = max(0.0, retry)
    return AirlockError(
        ErrorCode.RATE_LIMITED, f"{what}; try again in {retry:.0f}s", {"retry_after_seconds": round(retry, 1)}
    )

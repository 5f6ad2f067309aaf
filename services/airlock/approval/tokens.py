"""Session tokens: issued by an operator, presented by an agent (reference/004's worker side).

A token belongs to the agent account it was issued for: it is accepted only
from a peer with that uid (SO_PEERCRED), so a token read out of another
process (a command line, a leaked file) is worth nothing to another agent.
Only the SHA-256 of a token is kept, with its session, uid, expiry and a
revoked flag, so a memory dump yields no usable token.  The store lives in
airlock-approval's memory and nowhere else: a restart of the service revokes
every token (fail closed; operators issue new ones).  Pure: no I/O; the caller passes
the clock and the random token.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from airlock.common.errors import AirlockError, ErrorCode


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def unauthorized() -> AirlockError:
    # One refusal for every failure (unknown, expired, revoked, malformed), so
    # a probe learns nothing about which tokens exist.
    return AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")


@dataclass(slots=True)
class TokenEntry:
    session: str
    uid: int  # the agent account the token was issued for
    expires: float  # Unix time
    revoked: bool = False


class TokenStore:
    def __init__(self) -> None:
        self._by_hash: dict[str, TokenEntry] = {}

    def issue(self, token: str, session: str, uid: int, ttl: float, now: float) -> TokenEntry:
        self._expire(now)
        entry = TokenEntry(session, uid, now + ttl)
        self._by_hash[token_hash(token)] = entry
        return entry

    def check(self, token: str, uid: int, now: float) -> str:
        """The session a token stands for when ``uid`` presents it, or `unauthorized`.

        Another uid gets the refusal an unknown token gets: a thief learns
        nothing, not even that the token exists.
        """
        entry = self._by_hash.get(token_hash(token))
        if entry is None or entry.revoked or entry.expires <= now or entry.uid != uid:
            raise unauthorized()
        return entry.session

    def revoke_token(self, token: str) -> int:
        entry = self._by_hash.get(token_hash(token))
        if entry is None or entry.revoked:
            return 0
        entry.revoked = True
        return 1

    def revoke_session(self, session: str) -> int:
        count = 0
        for entry in self._by_hash.values():
            if entry.session == session and not entry.revoked:
                entry.revoked = True
                count += 1
        return count

    def live(self, now: float) -> int:
        """Tokens that would still be accepted: an idle exit would lose them."""
        return sum(1 for e in self._by_hash.values() if not e.revoked and e.expires > now)

    def _expire(self, now: float) -> None:
        # Revoked entries are kept until they expire: revocation must not be undone by a sweep.
        for key in [k for k, e in self._by_hash.items() if e.expires <= now]:
            del self._by_hash[key]


def new_token() -> str:
    return "alt_" + secrets.token_urlsafe(32)

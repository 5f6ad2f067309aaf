"""Session tokens' verbs: an operator issues and revokes them (operator.sock), intake checks one (approval.sock).

`SessionTokens` owns the token store (`tokens.TokenStore`: hashed, in
memory only) and journals each issue and revoke before it takes effect;
the record holds a short hash prefix, never the token.
"""

from __future__ import annotations

import time
from typing import Any

from airlock.approval.tokens import TokenStore, new_token, token_hash
from airlock.common import validate
from airlock.common.audit import Audit, Ids
from airlock.common.codec import iso_utc
from airlock.common.peer import uid_of, user_name
from airlock.common.server import Call
from airlock.common.wire import approval as wire
from airlock.common.wire import operator as op


class SessionTokens:
    """The session tokens operators issued, and their verbs."""

    def __init__(self, store: TokenStore, audit: Audit) -> None:
        self.store = store
        self.audit = audit

    async def issue(self, call: Call, args: op.TokenIssue) -> op.TokenIssued:
        session, ttl, reason = args.session, args.ttl_seconds, args.reason or ""
        user, uid = _token_holder(args.user)
        token = new_token()
        now = time.time()
        expires_at = iso_utc(now + ttl, timespec="seconds")
        # Journaled before it is usable; the record holds a short hash prefix, never the token.
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid, session=session),
            payload={
                "action": "token.issue",
                "operator": call.peer.user,
                "reason": reason,
                "token_id": token_hash(token)[:16],
                "expires_at": expires_at,
                "user": user,
                "uid": uid,
            },
        )
        self.store.issue(token, session, uid, float(ttl), now)
        return op.TokenIssued(token, token_hash(token)[:16], session, user, uid, expires_at)

    async def revoke(self, call: Call, args: op.TokenRevoke) -> op.TokenRevoked:
        token, session, reason = args.token, args.session, args.reason or ""
        if token is not None:
            target: dict[str, Any] = {"token_id": token_hash(token)[:16]}
        else:
            target = {"session": session}
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid, session=session),
            payload={"action": "token.revoke", "operator": call.peer.user, "reason": reason} | target,
        )
        revoked = self.store.revoke_token(token) if token is not None else self.store.revoke_session(str(session))
        return op.TokenRevoked.from_dict({"revoked": revoked} | target)

    async def check(self, call: Call, args: wire.TokenCheck) -> wire.Session:
        """intake asks (`wire.approval.TOKEN_CHECK`, intake's only): which session does this token stand for,
        presented by this uid?

        ``uid`` is the agent's, from the kernel at intake's accept.  Any failure,
        a token presented by another uid included, is `unauthorized`.
        """
        return wire.Session(self.store.check(args.token, args.uid, time.time()))


def _token_holder(text: str) -> tuple[str, int]:
    """The agent account a token is issued for: a user name or uid that exists here."""
    uid = uid_of(text)
    if uid is None:
        raise validate.bad("user", f"no such user {text!r}: a token is issued for an existing agent account")
    return user_name(uid), uid

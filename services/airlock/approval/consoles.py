"""The console-session verbs (issue 46, item 4): is a session live, end an account's sessions.

`Consoles` holds the sessions passkey sign-ins made (`websessions.WebSessions`)
and answers ``passkey.session`` (airlock-web asks on every request: the
session, its passkey still enrolled and not revoked, its account still an
operator or observer) and ``passkey.sessions_end``.  `passkeys.Passkeys`
opens sessions at sign-in and ends a revoked passkey's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from airlock.approval.assertions import Credentials, no
from airlock.approval.websessions import WebSessions
from airlock.common.audit import Audit, Ids
from airlock.common.config import Config
from airlock.common.peer import may_decide
from airlock.common.server import Call
from airlock.common.wire import passkey as pk


class Consoles:
    def __init__(self, settings: Callable[[], Config], audit: Audit, keys: Credentials) -> None:
        self._settings = settings
        self.audit = audit
        self.keys = keys
        self.sessions = WebSessions()

    @property
    def config(self) -> Config:
        return self._settings()

    async def session(self, call: Call, args: pk.Session) -> pk.ConsoleSession:
        """Is this console session live: not ended, not expired, its passkey not revoked, its account still here?"""
        self.keys.web()
        found = self.sessions.get(args.session, time.time())
        if found is None:
            raise no("session", "no such console session (it ended, expired or was never made)")
        credential = next((c for c in self.keys.all() if c.credential_id == found.credential_id), None)
        role = self.keys.role(found.account)
        if credential is None or credential.revoked is not None or role is None:
            # Read at every use, as the credential file is: a revocation by hand ends it too.
            self.sessions.end(lambda s: s.key == found.key)
            raise no("session", "this console session ended: its passkey was revoked or its account left")
        return pk.ConsoleSession(found.account, role, found.credential_id)

    async def sessions_end(self, call: Call, args: pk.SessionsEnd) -> pk.SessionsEnded:
        """End every console session of an account (root, an operator, or the account itself)."""
        account, reason = args.account, args.reason or ""
        o = self.config.operators
        web = call.peer.user == self.config.web.user and call.peer.uid != 0
        allowed = call.peer.uid == 0 or may_decide(call.peer, o.users, o.groups, o.observers.users)
        if web or not (allowed or call.peer.user == account):
            raise no("not_yours", "only root, an operator or the account itself may end its console sessions")
        ended = self.sessions.end(lambda s: s.account == account)
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid),
            payload={
                "action": "passkey.sessions_end",
                "operator": call.peer.user,
                "account": account,
                "ended": len(ended),
                "reason": reason,
            },
        )
        return pk.SessionsEnded(account, len(ended))

"""Passkeys in approval (issue 33): enrollment, sign-in, and a decision that is an assertion over the request.

`Passkeys` owns the passkey verbs' state and is handed what it shares with
the rest of approval (the pending table, the grants, the journal).  airlock-web (``web.user``) carries
browser data here and decides nothing: every ``passkey.*`` verb is decided
by what it carries -- a one-time enrollment token root or the account itself
created, or a WebAuthn assertion approval verifies itself (`webauthn`):
origin, RP ID, challenge, user presence and verification, signature against
the enrolled key, sign counter.

- Enrollment: ``passkey.enroll`` (root or the account) makes a token valid
  ``web.enroll_minutes``; ``register_begin``/``register_finish`` spend it.
  approval cannot write the root-owned ``approval.passkeys``: it asks the
  runner's ``passkeys.write`` (root) to append the line.
- Decisions: the challenge is `webauthn.decision_challenge` over the exact
  statement pending now (its nonce is fresh per request and per start), so
  an assertion is good for one decision of one request.  The vote is the
  credential's account's: a person, through the quorum's `Tally`.
- Sign counters live in ``approval.state_dir`` (`CounterStore`), so they
  survive restarts; the credential file is read at every use, so a revocation
  applies at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from airlock.approval import ballot, quorum, webauthn
from airlock.approval.assertions import Credentials, no, refused
from airlock.approval.consoles import Consoles
from airlock.approval.granting import GrantBook
from airlock.approval.logins import Logins
from airlock.approval.pending import Pending
from airlock.approval.signed import RefusalLimit
from airlock.approval.table import PendingTable, check_expected
from airlock.approval.webauthn import Refused
from airlock.common import groups, passkeyfile, validate
from airlock.common.audit import Audit, Ids
from airlock.common.codec import iso_utc
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.passkeyfile import Credential, PasskeyFileError
from airlock.common.peer import Peer, identify, may_decide
from airlock.common.server import Call
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk
from airlock.common.wire import runner as runner_wire

G = groups.Group | None  # issue 49: a decision carries a group, or is one host's alone
MAX_ENROLLMENTS = 64  # live enrollment tokens at once
# Refused passkey decisions one carrier (airlock-web's uid) may send per minute: each is journaled,
# so a compromised web process cannot fill the journal with them.
DECIDE_REFUSALS = 60


@dataclass(slots=True)
class Enrollment:
    account: str
    creator_uid: int
    expires: float
    challenge: bytes | None = None
    spent: bool = False
    done: asyncio.Future[str] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def _token_id(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Passkeys:
    """The passkey verbs (issue 33) and what they keep: enrollment links, sign-in challenges, the
    credentials (`assertions.Credentials`), and the refusals a carrier earned."""

    def __init__(
        self,
        settings: Callable[[], Config],
        audit: Audit,
        runner: Client,
        log: Any,
        host: str,
        pending: PendingTable,
        grants: GrantBook,
    ) -> None:
        self._settings = settings  # the configuration now (a reload replaces approval.* and web.*)
        self.audit = audit
        self.runner = runner  # passkeys.write: approval cannot write the root-owned credential file
        self.log = log
        self.host = host
        self.pending = pending
        self.grants = grants
        self.enrollments: dict[str, Enrollment] = {}
        self.logins = Logins()  # sign-in challenges, each bound to the browser that asked
        self.keys = Credentials(settings, log)  # the enrolled passkeys, counters, assertions used
        self.consoles = Consoles(settings, audit, self.keys)  # the console sessions sign-ins made
        self.passkey_refusals = RefusalLimit(DECIDE_REFUSALS)

    @property
    def config(self) -> Config:
        return self._settings()

    # --- enrollment ---------------------------------------------------------------

    def _live_enrollment(self, token: object) -> tuple[str, Enrollment]:
        if not isinstance(token, str) or not 16 <= len(token) <= 128:
            raise no("token", "no such enrollment link (or it expired or was used)")
        key = _token_id(token)
        found = self.enrollments.get(key)
        if found is None or found.spent or found.expires <= time.time():
            raise no("token", "no such enrollment link (or it expired or was used)")
        return key, found

    def _prune_enrollments(self) -> None:
        now = time.time()
        for key, e in list(self.enrollments.items()):
            if e.expires <= now or e.spent:
                if not e.done.done():
                    e.done.set_result("")
                del self.enrollments[key]

    async def passkey_enroll(self, call: Call, args: pk.Account) -> pk.Enrolled:
        account = args.account
        if call.peer.uid != 0 and call.peer.user != account:
            raise no("not_yours", "only root or the account itself may enroll a passkey for it")
        role = self.keys.role(account)
        if role is None:
            raise validate.bad("account", f"{account!r} is neither an operator nor an observer here")
        self._prune_enrollments()
        if len(self.enrollments) >= MAX_ENROLLMENTS:
            raise AirlockError(ErrorCode.CONFLICT, "too many enrollment links are open; try again when they expire")
        token = secrets.token_urlsafe(32)
        expires = time.time() + self.config.web.enroll_minutes * 60
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid),
            payload={
                "action": "passkey.enroll",
                "operator": call.peer.user,
                "account": account,
                "role": role,
                "token_id": _token_id(token)[:16],
                "expires_at": iso_utc(expires, timespec="seconds"),
            },
        )
        self.enrollments[_token_id(token)] = Enrollment(account, call.peer.uid, expires)
        url = self.config.web.url.rstrip("/") + "/enroll/" + token if self.config.web.url else None
        if url and self.config.web.fleet_name:  # a fleet console's link: which host to carry it to (docs/fleet.md)
            url += "?" + urlencode({"host": self.config.web.fleet_name})
        return pk.Enrolled(token, int(expires), iso_utc(expires, timespec="seconds"), account, url)

    async def passkey_enroll_wait(self, call: Call, args: pk.EnrollWait) -> pk.EnrollWaited:
        token = args.token
        found = self.enrollments.get(_token_id(token))
        if found is None:
            raise AirlockError(ErrorCode.NOT_FOUND, "no such enrollment link (or it expired)")
        if call.peer.uid not in (0, found.creator_uid):
            raise AirlockError(ErrorCode.NOT_FOUND, "no such enrollment link (or it expired)")
        bound = max(0.0, min(args.timeout_seconds, found.expires - time.time()))
        try:
            credential_id = await asyncio.wait_for(asyncio.shield(found.done), bound)
        except TimeoutError:
            credential_id = ""
        return pk.EnrollWaited(
            enrolled=bool(credential_id),
            account=found.account,
            expired=not credential_id and found.expires <= time.time(),
            credential_id=credential_id or None,
        )

    async def passkey_register_begin(self, call: Call, args: pk.Enrolment) -> pk.RegisterOptions:
        _origin, rp_id = self.keys.web()
        _key, found = self._live_enrollment(args.token)
        found.challenge = secrets.token_bytes(32)
        exclude = [c.credential_id for c in self.keys.all() if c.account == found.account and c.revoked is None]
        options = webauthn.creation_options(rp_id, f"airlock on {self.host}", found.account, found.challenge, exclude)
        return pk.RegisterOptions(options, found.account)

    async def passkey_register_finish(self, call: Call, args: pk.Register) -> pk.Registered:
        origin, rp_id = self.keys.web()
        key, found = self._live_enrollment(args.token)
        found.spent = True  # spent by this call, whatever it brings: a link is used once
        self.enrollments.pop(key, None)
        try:
            if found.challenge is None:
                raise no("challenge", "register_begin was not called for this link")
            try:
                registered = webauthn.verify_registration(args.credential, origin, rp_id, found.challenge)
            except Refused as exc:
                raise refused(exc) from None
            credential = Credential(
                webauthn.b64u(registered.credential_id),
                webauthn.b64u(registered.public_key),
                found.account,
                int(time.time()),
            )
            try:
                passkeyfile.checked(json.loads(credential.to_line()))
            except PasskeyFileError as exc:
                raise validate.bad("credential", str(exc)) from None
            # Journaled before it is usable (as a grant is).
            await self.audit.record(
                "operator.action",
                Ids(peer_uid=call.peer.uid),
                payload={
                    "action": "passkey.enrolled",
                    "operator": found.account,
                    "account": found.account,
                    "credential_id": credential.credential_id,
                    "token_id": key[:16],
                    "carrier": {"uid": call.peer.uid, "user": call.peer.user},
                },
            )
            try:
                await runner_wire.stub(self.runner).call(
                    runner_wire.PASSKEYS_WRITE,
                    runner_wire.PasskeyWrite("add", credential=json.loads(credential.to_line())),
                )
            except AirlockError as exc:
                # The journal said "enrolled" first (a stored line must never be unjournaled): say it failed.
                await self.audit.record(
                    "operator.action",
                    Ids(peer_uid=call.peer.uid),
                    payload={
                        "action": "passkey.enroll_failed",
                        "operator": found.account,
                        "account": found.account,
                        "credential_id": credential.credential_id,
                        "code": exc.code.value,
                        "message": exc.message,
                    },
                )
                raise
            if registered.sign_count:
                self.keys.counters.set(credential.credential_id, registered.sign_count)
        except AirlockError:
            if not found.done.done():
                found.done.set_result("")
            raise
        if not found.done.done():
            found.done.set_result(credential.credential_id)
        self.log.info("approval.passkey.enrolled", account=found.account, credential_id=credential.credential_id)
        return pk.Registered(credential.credential_id, found.account)

    # --- sign-in ------------------------------------------------------------------

    async def passkey_login_begin(self, call: Call, args: pk.LoginBegin) -> pk.LoginOptions:
        _origin, rp_id = self.keys.web()
        challenge_id, challenge = self.logins.begin(args.client, time.time())
        return pk.LoginOptions(webauthn.request_options(rp_id, challenge, []), challenge_id)

    async def passkey_login_finish(self, call: Call, args: pk.LoginFinish) -> pk.SignedIn:
        self.keys.web()
        challenge = self.logins.finish(args.challenge_id, args.client, time.time())  # once
        if challenge is None:
            raise no("challenge", "no such sign-in challenge (or it expired, was used, or is another browser's)")
        enrolled, count, digest = self.keys.verified(args.credential, challenge)
        role = self.keys.role(enrolled.account)
        if role is None:
            raise no("not_operator", f"{enrolled.account!r} is no longer an operator or an observer")
        self.keys.spend(enrolled.credential_id, count, digest)
        seconds = self.config.web.session_minutes * 60
        token, session = self.consoles.sessions.open(enrolled.account, enrolled.credential_id, seconds, time.time())
        self.log.info("approval.passkey.login", account=enrolled.account, credential_id=enrolled.credential_id)
        # The session is airlock-web's, asked about on every request (passkey.session).
        return pk.SignedIn(enrolled.account, role, enrolled.credential_id, token, int(session.expires))

    # --- deciding -----------------------------------------------------------------

    @staticmethod
    def _decision_args(args: pk.DecideBegin) -> tuple[str, str, float | None, str | None]:
        return args.decision, args.reason or "", args.grant_seconds, args.scope

    def _challenge(
        self, entry: Pending, decision: str, reason: str, seconds: float | None, scope: str | None, group: G = None
    ) -> bytes:
        assert entry.published is not None
        statement = entry.published.statements[decision]
        carried = webauthn.extras(reason, seconds, scope)
        if group is not None:  # issue 49: one touch over many hosts; this host checks it is a member
            return groups.member_challenge(group, statement.to_bytes(), carried)
        return webauthn.decision_challenge(statement.to_bytes(), carried)

    async def passkey_decide_begin(self, call: Call, args: pk.DecideBegin) -> pk.DecideChallenge:
        _origin, rp_id = self.keys.web()
        entry = self.pending.find(args.id, args.expect)
        await check_expected(self.audit, call, entry, "statement", args.expect)
        decision, reason, seconds, scope = self._decision_args(args)
        assert entry.published is not None
        statement = entry.published.statements[decision]
        challenge = self._challenge(entry, decision, reason, seconds, scope)
        return pk.DecideChallenge(
            {
                "request_id": entry.request_id,
                "decision": decision,
                "statement": statement.render(),
                "expires": statement.expires,
                "challenge": webauthn.b64u(challenge),
                "options": webauthn.request_options(rp_id, challenge, self.keys.deciders()),
            }
        )

    async def passkey_decide(self, call: Call, args: pk.Decide) -> op.Vote:
        """A decision carried by airlock-web: approval verifies the assertion over this request's statement."""
        self.keys.web()
        self.passkey_refusals.check(call.peer.uid)
        entry = self.pending.find(args.id, args.expect)
        decision, reason, seconds, scope = self._decision_args(args)
        await check_expected(self.audit, call, entry, "approve" if decision == "allow" else "deny", args.expect)
        assert entry.published is not None
        ids = Ids(entry.request_id, entry.operation_id, call.peer.uid)
        carrier = {"uid": call.peer.uid, "user": call.peer.user}
        credential_id: str | None = None
        group: groups.Group | None = None
        try:
            shown = args.statement
            if shown != entry.published.statements[decision].render():
                raise AirlockError(
                    ErrorCode.CONFLICT,
                    "the statement sent is not this request's current one (it was asked again, or approval restarted)",
                    {"reason": "request_changed"},
                )
            if entry.published.statements[decision].expires <= time.time():
                raise no("expired", "this request's statement has expired")
            try:
                group = args.group.group() if args.group is not None else None
                challenge = self._challenge(entry, decision, reason, seconds, scope, group)
            except groups.GroupRefused as exc:
                raise refused(Refused(exc.reason, exc.message)) from None
            enrolled, count, digest = self.keys.verified(args.credential, challenge)
            credential_id = enrolled.credential_id
            if self.keys.role(enrolled.account) != "operator":
                raise no("not_operator", f"{enrolled.account!r} is not an operator: an observer's passkey only views")
            person = person_of(enrolled.account)
            if not self.pending.is_open(entry):
                raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
            voter = quorum.Voter(person.uid, person.user, frozenset(person.groups))  # the person is the account
            grant = None
            if decision == "allow":
                if person.uid == entry.peer.uid and not self.config.approval.allow_self_approval:
                    raise no("self_approval", "operators cannot approve their own requests")
                ballot.require_operator_reason(self.config.approval, entry, reason)
                # Only what the passkey signed (the challenge's extras): never a field the carrier added.
                grant = GrantBook.asked_for(entry, person, seconds, scope, None, self.config.approval.max_grant_seconds)
                ballot.check_vote(self.config.approval, entry, voter)
        except AirlockError as exc:
            self.passkey_refusals.refused(call.peer.uid)
            await self.audit.record(
                "operator.action",
                ids,
                payload={
                    "action": "passkey.refused",
                    "via": "passkey",
                    "code": exc.code.value,
                    "reason_code": exc.details.get("reason"),
                    "message": exc.message,
                    "credential_id": credential_id or exc.details.get("credential_id"),
                    "carrier": carrier,
                    "agent_uid": entry.peer.uid,
                },
            )
            raise
        self.keys.spend(enrolled.credential_id, count, digest)
        await self.audit.record(
            "operator.action",
            ids,
            payload={
                "action": "approve" if decision == "allow" else "deny",
                "via": "passkey",
                "method": "passkey",
                "operator": person.user,
                "operator_uid": person.uid,
                "credential_id": enrolled.credential_id,
                "reason": reason,
                "carrier": carrier,
                "agent_uid": entry.peer.uid,
            }
            | ballot.progress(entry, decision)
            | ({"grant_id": grant.grant_id} if grant else {})
            | ({"group": group.journaled(entry.published.statements[decision].to_bytes())} if group else {}),
        )
        if grant is not None and self.pending.is_open(entry):
            await self.grants.make(grant, ids, person.user, reason)
        out = ballot.count(self.config.approval, self.pending, entry, decision, voter, reason)
        by = {"user": person.user, "uid": person.uid, "credential_id": enrolled.credential_id}
        return op.Vote(out | {"by": by} | ({"grant": grant.to_dict()} if grant is not None else {}))

    # --- managing -----------------------------------------------------------------

    async def passkey_list(self, call: Call, args: pk.AccountMaybe) -> pk.Passkeys:
        account = args.account
        o = self.config.operators
        web = call.peer.user == self.config.web.user and call.peer.uid != 0  # an observer, whatever its groups
        if web or not (call.peer.uid == 0 or may_decide(call.peer, o.users, o.groups, o.observers.users)):
            if account not in (None, call.peer.user) or web:
                raise no("not_yours", "an observer may list only its own passkeys")
            account = call.peer.user
        live = self.consoles.sessions.live(time.time())
        return pk.Passkeys(
            tuple(
                c.to_dict()
                | {
                    "created_at": iso_utc(c.created, timespec="seconds"),
                    "sign_count": self.keys.counters.get(c.credential_id),
                    "sessions": [
                        {
                            "id": s.key[:12],
                            "since": iso_utc(s.created, timespec="seconds"),
                            "expires_at": iso_utc(s.expires, timespec="seconds"),
                        }
                        for s in live
                        if s.credential_id == c.credential_id
                    ],
                }
                for c in self.keys.all()
                if account is None or c.account == account
            )
        )

    async def passkey_revoke(self, call: Call, args: pk.PasskeyRevoke) -> pk.PasskeyRevoked:
        cid, reason = args.credential_id, args.reason or ""
        found = [c for c in self.keys.all() if c.credential_id == cid and c.revoked is None]
        if not found:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no passkey {cid!r} in use (see airlock passkey list)")
        if call.peer.uid != 0 and call.peer.user != found[0].account:
            raise no("not_yours", "only root or the passkey's own account may revoke it")
        await self.audit.record(
            "operator.action",
            Ids(peer_uid=call.peer.uid),
            payload={
                "action": "passkey.revoke",
                "operator": call.peer.user,
                "account": found[0].account,
                "credential_id": cid,
                "reason": reason,
            },
        )
        await runner_wire.stub(self.runner).call(
            runner_wire.PASSKEYS_WRITE, runner_wire.PasskeyWrite("revoke", credential_id=cid)
        )
        # Every console session this passkey made ends now, not at web.session_minutes.
        ended = self.consoles.sessions.end(lambda s: s.credential_id == cid)
        return pk.PasskeyRevoked(cid, found[0].account, True, len(ended))


def person_of(account: str) -> Peer:
    import pwd

    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        raise no("not_operator", f"no account {account!r} here") from None
    return identify(0, entry.pw_uid, entry.pw_gid)

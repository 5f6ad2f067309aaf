"""Passkeys in approval (issue 33): enrollment, sign-in, and a decision that is an assertion over the request.

`Passkeys` is a part of `airlock.approval.service.Approval` (its mixin), as
`votes.Votes` is for SSH signatures.  airlock-web (``web.user``) carries
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
import os
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airlock.approval import quorum, refs, webauthn
from airlock.approval.grants import Grant
from airlock.approval.pending import Pending
from airlock.approval.signed import RefusalLimit
from airlock.approval.webauthn import Refused
from airlock.common import passkeyfile, validate
from airlock.common.audit import Audit, Ids
from airlock.common.codec import iso_utc
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client
from airlock.common.passkeyfile import Credential, PasskeyFileError
from airlock.common.peer import Peer, identify, may_decide, uid_of
from airlock.common.server import Call
from airlock.common.wire import runner as runner_wire

MAX_ENROLLMENTS = 64  # live enrollment tokens at once
MAX_LOGINS = 1024  # outstanding sign-in challenges
LOGIN_SECONDS = 300.0
MAX_WAIT_SECONDS = 900.0
USED = 4096  # assertion digests kept to refuse a replay
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


class CounterStore:
    """Each credential's last sign counter, in a JSON file of approval's own (atomically replaced)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "passkey-counters.json"
        self._counts: dict[str, int] | None = None

    def _load(self) -> dict[str, int]:
        if self._counts is None:
            try:
                data = json.loads(self.path.read_text(encoding="utf-8"))
            except FileNotFoundError:
                data = {}
            except (OSError, ValueError) as exc:
                # Fail closed: without the counters a cloned authenticator could not be told apart.
                raise AirlockError(ErrorCode.INTERNAL, f"{self.path}: cannot read the sign counters ({exc})") from None
            self._counts = {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int)}
        return self._counts

    def get(self, credential_id: str) -> int:
        return self._load().get(credential_id, 0)

    def set(self, credential_id: str, count: int) -> None:
        counts = dict(self._load())
        counts[credential_id] = count
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(counts, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temporary, self.path)
        except OSError as exc:
            raise AirlockError(
                ErrorCode.INTERNAL, f"{self.path}: cannot keep the sign counter ({exc.strerror})"
            ) from None
        self._counts = counts


def _refused(exc: Refused) -> AirlockError:
    code = ErrorCode.INVALID_ARGUMENTS if exc.reason == "malformed" else ErrorCode.UNAUTHORIZED
    return AirlockError(code, exc.message, {"reason": exc.reason})


def _no(reason: str, message: str, **details: Any) -> AirlockError:
    return AirlockError(ErrorCode.UNAUTHORIZED, message, {"reason": reason, **details})


def _token_id(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Passkeys:
    """The issue-33 part of `Approval`; the attributes below are `Approval`'s."""

    config: Config
    audit: Audit
    runner: Client
    log: Any
    host: str
    pending: dict[tuple[int, str], Pending]
    enrollments: dict[str, Enrollment]
    logins: OrderedDict[str, tuple[bytes, float]]
    used_assertions: OrderedDict[str, float]
    counters: CounterStore
    passkey_refusals: RefusalLimit

    def _find(self, ref: Any, expect: str | None = None) -> Pending:
        raise NotImplementedError  # Approval's

    async def _check_expected(self, call: Call, entry: Pending, action: str) -> None:
        raise NotImplementedError  # Approval's

    def _check_vote(self, entry: Pending, voter: quorum.Voter) -> None:
        raise NotImplementedError  # Votes'

    def _require_operator_reason(self, entry: Pending, reason: str, *, carried: bool = False) -> None:
        raise NotImplementedError  # Votes'

    def _grant_for(self, entry: Pending, operator: Peer, args: Any) -> Grant | None:
        raise NotImplementedError  # Votes'

    async def _add_grant(self, grant: Grant, ids: Ids, operator: str, reason: str) -> None:
        raise NotImplementedError  # Votes'

    def _vote_progress(self, entry: Pending, verdict: str) -> dict[str, Any]:
        raise NotImplementedError  # Votes'

    def _count(self, entry: Pending, verdict: str, voter: quorum.Voter, reason: str) -> dict[str, Any]:
        raise NotImplementedError  # Votes'

    # --- who is who -----------------------------------------------------------------

    def _web(self) -> tuple[str, str]:
        """(origin, RP ID), or `conflict` when web.url is not set (passkeys off)."""
        web = self.config.web
        if not web.url:
            raise AirlockError(ErrorCode.CONFLICT, "passkeys are off: set web.url (docs/operations.md, Passkeys)")
        return web.origin, web.relying_party

    def _role(self, account: str) -> str | None:
        """``operator``, ``observer`` or None (neither, or the web process's own user)."""
        if account == self.config.web.user:
            return None
        uid = uid_of(account)
        if uid is None:
            return None
        try:
            import pwd

            peer = identify(0, uid, pwd.getpwuid(uid).pw_gid)
        except (KeyError, AirlockError):
            return None
        o = self.config.operators
        if may_decide(peer, o.users, o.groups, o.observers.users):
            return "operator"
        if account in o.observers.users or str(uid) in o.observers.users or set(o.observers.groups) & peer.groups:
            return "observer"
        return None

    def _credentials(self) -> list[Credential]:
        try:
            found, bad = passkeyfile.read(self.config.approval.passkeys)
        except (PasskeyFileError, OSError) as exc:
            raise AirlockError(ErrorCode.INTERNAL, f"the passkeys file cannot be read: {exc}") from None
        if bad:
            self.log.warning("approval.passkeys.unreadable_lines", path=str(self.config.approval.passkeys), lines=bad)
        return found

    def _credential(self, credential_id: bytes) -> Credential:
        cid = webauthn.b64u(credential_id)
        for credential in self._credentials():
            if credential.credential_id == cid:
                if credential.revoked is not None:
                    raise _no("revoked", f"passkey {cid} was revoked", credential_id=cid)
                return credential
        raise _no("unknown_credential", "this passkey is not enrolled here", credential_id=cid)

    def _verified(self, credential: object, challenge: bytes) -> tuple[Credential, int, str]:
        """The enrolled credential that made this assertion over ``challenge``, its new counter, its digest."""
        origin, rp_id = self._web()
        try:
            assertion = webauthn.parse_assertion(credential, origin)
        except Refused as exc:
            raise _refused(exc) from None
        enrolled = self._credential(assertion.credential_id)
        try:
            count = webauthn.verify_assertion(
                assertion, rp_id, challenge, webauthn.unb64u(enrolled.public_key, "public_key", 4096)
            )
        except Refused as exc:
            refused = _refused(exc)
            refused.details["credential_id"] = enrolled.credential_id
            raise refused from None
        if assertion.digest in self.used_assertions:
            raise _no("replayed", "this assertion was used already", credential_id=enrolled.credential_id)
        last = self.counters.get(enrolled.credential_id)
        if (count or last) and count <= last:
            # A counter that does not grow: a cloned authenticator, or a replay.
            raise _no(
                "counter",
                f"the sign counter did not increase ({count} after {last}): a cloned authenticator?",
                credential_id=enrolled.credential_id,
            )
        return enrolled, count, assertion.digest

    def _spend(self, credential_id: str, count: int, digest: str) -> None:
        """Keep the counter (before the assertion takes effect) and remember the assertion."""
        if count:
            self.counters.set(credential_id, count)
        self.used_assertions[digest] = time.time()
        while len(self.used_assertions) > USED:
            self.used_assertions.popitem(last=False)

    # --- enrollment ---------------------------------------------------------------

    def _live_enrollment(self, token: object) -> tuple[str, Enrollment]:
        if not isinstance(token, str) or not 16 <= len(token) <= 128:
            raise _no("token", "no such enrollment link (or it expired or was used)")
        key = _token_id(token)
        found = self.enrollments.get(key)
        if found is None or found.spent or found.expires <= time.time():
            raise _no("token", "no such enrollment link (or it expired or was used)")
        return key, found

    def _prune_enrollments(self) -> None:
        now = time.time()
        for key, e in list(self.enrollments.items()):
            if e.expires <= now or e.spent:
                if not e.done.done():
                    e.done.set_result("")
                del self.enrollments[key]

    async def passkey_enroll(self, call: Call) -> dict[str, Any]:
        account = validate.text("account", call.args.get("account"), max_len=64, allow_empty=False)
        if call.peer.uid != 0 and call.peer.user != account:
            raise _no("not_yours", "only root or the account itself may enroll a passkey for it")
        role = self._role(account)
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
        return {
            "token": token,
            "expires": int(expires),
            "expires_at": iso_utc(expires, timespec="seconds"),
            "account": account,
            "url": url,
        }

    async def passkey_enroll_wait(self, call: Call) -> dict[str, Any]:
        token = call.args.get("token")
        if not isinstance(token, str) or len(token) > 128:
            raise validate.bad("token", "must be the token passkey.enroll gave")
        found = self.enrollments.get(_token_id(token))
        if found is None:
            raise AirlockError(ErrorCode.NOT_FOUND, "no such enrollment link (or it expired)")
        if call.peer.uid not in (0, found.creator_uid):
            raise AirlockError(ErrorCode.NOT_FOUND, "no such enrollment link (or it expired)")
        timeout = call.args.get("timeout_seconds", MAX_WAIT_SECONDS)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= MAX_WAIT_SECONDS:
            raise validate.bad("timeout_seconds", f"must be a number of seconds up to {MAX_WAIT_SECONDS:g}")
        bound = max(0.0, min(float(timeout), found.expires - time.time()))
        try:
            credential_id = await asyncio.wait_for(asyncio.shield(found.done), bound)
        except TimeoutError:
            credential_id = ""
        return {
            "enrolled": bool(credential_id),
            "credential_id": credential_id or None,
            "account": found.account,
            "expired": not credential_id and found.expires <= time.time(),
        }

    async def passkey_register_begin(self, call: Call) -> dict[str, Any]:
        _origin, rp_id = self._web()
        _key, found = self._live_enrollment(call.args.get("token"))
        found.challenge = secrets.token_bytes(32)
        exclude = [c.credential_id for c in self._credentials() if c.account == found.account and c.revoked is None]
        options = webauthn.creation_options(rp_id, f"airlock on {self.host}", found.account, found.challenge, exclude)
        return {"options": options, "account": found.account}

    async def passkey_register_finish(self, call: Call) -> dict[str, Any]:
        origin, rp_id = self._web()
        key, found = self._live_enrollment(call.args.get("token"))
        found.spent = True  # spent by this call, whatever it brings: a link is used once
        self.enrollments.pop(key, None)
        try:
            if found.challenge is None:
                raise _no("challenge", "register_begin was not called for this link")
            try:
                registered = webauthn.verify_registration(call.args.get("credential"), origin, rp_id, found.challenge)
            except Refused as exc:
                raise _refused(exc) from None
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
                self.counters.set(credential.credential_id, registered.sign_count)
        except AirlockError:
            if not found.done.done():
                found.done.set_result("")
            raise
        if not found.done.done():
            found.done.set_result(credential.credential_id)
        self.log.info("approval.passkey.enrolled", account=found.account, credential_id=credential.credential_id)
        return {"credential_id": credential.credential_id, "account": found.account}

    # --- sign-in ------------------------------------------------------------------

    async def passkey_login_begin(self, call: Call) -> dict[str, Any]:
        _origin, rp_id = self._web()
        now = time.time()
        for key, (_c, expires) in list(self.logins.items()):
            if expires <= now:
                del self.logins[key]
        while len(self.logins) >= MAX_LOGINS:
            self.logins.popitem(last=False)
        challenge = secrets.token_bytes(32)
        challenge_id = secrets.token_urlsafe(18)
        self.logins[challenge_id] = (challenge, now + LOGIN_SECONDS)
        return {"options": webauthn.request_options(rp_id, challenge, []), "challenge_id": challenge_id}

    async def passkey_login_finish(self, call: Call) -> dict[str, Any]:
        self._web()
        challenge_id = call.args.get("challenge_id")
        found = self.logins.pop(challenge_id, None) if isinstance(challenge_id, str) else None  # once
        if found is None or found[1] <= time.time():
            raise _no("challenge", "no such sign-in challenge (or it expired or was used)")
        enrolled, count, digest = self._verified(call.args.get("credential"), found[0])
        role = self._role(enrolled.account)
        if role is None:
            raise _no("not_operator", f"{enrolled.account!r} is no longer an operator or an observer")
        self._spend(enrolled.credential_id, count, digest)
        self.log.info("approval.passkey.login", account=enrolled.account, credential_id=enrolled.credential_id)
        return {"account": enrolled.account, "role": role, "credential_id": enrolled.credential_id}

    # --- deciding -----------------------------------------------------------------

    def _decision_args(self, call: Call) -> tuple[str, str, float | None, str | None]:
        decision = call.args.get("decision")
        if decision not in ("allow", "deny"):
            raise validate.bad("decision", "must be allow or deny")
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        seconds = call.args.get("grant_seconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))):
            raise validate.bad("grant_seconds", "must be a number of seconds")
        scope = call.args.get("scope")
        if scope is not None and scope not in ("command", "rule"):
            raise validate.bad("scope", "must be command or rule")
        if decision == "deny" and (seconds is not None or scope is not None):
            raise validate.bad("grant_seconds", "a deny takes no grant")
        return str(decision), reason, seconds, scope

    def _challenge(self, entry: Pending, decision: str, reason: str, seconds: float | None, scope: str | None) -> bytes:
        assert entry.published is not None
        statement = entry.published.statements[decision].to_bytes()
        return webauthn.decision_challenge(statement, webauthn.extras(reason, seconds, scope))

    def _deciders(self) -> list[str]:
        return [
            c.credential_id for c in self._credentials() if c.revoked is None and self._role(c.account) == "operator"
        ]

    async def passkey_decide_begin(self, call: Call) -> dict[str, Any]:
        _origin, rp_id = self._web()
        entry = self._find(call.args.get("id"), refs.expected(call.args))
        await self._check_expected(call, entry, "statement")
        decision, reason, seconds, scope = self._decision_args(call)
        assert entry.published is not None
        statement = entry.published.statements[decision]
        challenge = self._challenge(entry, decision, reason, seconds, scope)
        return {
            "request_id": entry.request_id,
            "decision": decision,
            "statement": statement.render(),
            "expires": statement.expires,
            "challenge": webauthn.b64u(challenge),
            "options": webauthn.request_options(rp_id, challenge, self._deciders()),
        }

    async def passkey_decide(self, call: Call) -> dict[str, Any]:
        """A decision carried by airlock-web: approval verifies the assertion over this request's statement."""
        self._web()
        self.passkey_refusals.check(call.peer.uid)
        entry = self._find(call.args.get("id"), refs.expected(call.args))
        decision, reason, seconds, scope = self._decision_args(call)
        await self._check_expected(call, entry, "approve" if decision == "allow" else "deny")
        assert entry.published is not None
        ids = Ids(entry.request_id, entry.operation_id, call.peer.uid)
        carrier = {"uid": call.peer.uid, "user": call.peer.user}
        credential_id: str | None = None
        try:
            shown = call.args.get("statement")
            if shown != entry.published.statements[decision].render():
                raise AirlockError(
                    ErrorCode.CONFLICT,
                    "the statement sent is not this request's current one (it was asked again, or approval restarted)",
                    {"reason": "request_changed"},
                )
            if entry.published.statements[decision].expires <= time.time():
                raise _no("expired", "this request's statement has expired")
            enrolled, count, digest = self._verified(
                call.args.get("credential"), self._challenge(entry, decision, reason, seconds, scope)
            )
            credential_id = enrolled.credential_id
            if self._role(enrolled.account) != "operator":
                raise _no("not_operator", f"{enrolled.account!r} is not an operator: an observer's passkey only views")
            person = _person(enrolled.account)
            if entry.future.done():
                raise AirlockError(ErrorCode.CONFLICT, "this request was already decided")
            voter = quorum.Voter(person.uid, person.user, frozenset(person.groups))  # the person is the account
            grant = None
            if decision == "allow":
                if person.uid == entry.peer.uid and not self.config.approval.allow_self_approval:
                    raise _no("self_approval", "operators cannot approve their own requests")
                self._require_operator_reason(entry, reason)
                # Only what the passkey signed (the challenge's extras): never a field the carrier added.
                grant = self._grant_for(entry, person, {"grant_seconds": seconds, "scope": scope})
                self._check_vote(entry, voter)
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
        self._spend(enrolled.credential_id, count, digest)
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
            | self._vote_progress(entry, decision)
            | ({"grant_id": grant.grant_id} if grant else {}),
        )
        if grant is not None and not entry.future.done():
            await self._add_grant(grant, ids, person.user, reason)
        out = self._count(entry, decision, voter, reason)
        by = {"user": person.user, "uid": person.uid, "credential_id": enrolled.credential_id}
        return out | {"by": by} | ({"grant": grant.to_dict()} if grant is not None else {})

    # --- managing -----------------------------------------------------------------

    async def passkey_list(self, call: Call) -> dict[str, Any]:
        account = validate.optional_text("account", call.args.get("account"), max_len=64)
        o = self.config.operators
        web = call.peer.user == self.config.web.user and call.peer.uid != 0  # an observer, whatever its groups
        if web or not (call.peer.uid == 0 or may_decide(call.peer, o.users, o.groups, o.observers.users)):
            if account not in (None, call.peer.user) or web:
                raise _no("not_yours", "an observer may list only its own passkeys")
            account = call.peer.user
        return {
            "passkeys": [
                c.to_dict()
                | {
                    "created_at": iso_utc(c.created, timespec="seconds"),
                    "sign_count": self.counters.get(c.credential_id),
                }
                for c in self._credentials()
                if account is None or c.account == account
            ]
        }

    async def passkey_revoke(self, call: Call) -> dict[str, Any]:
        cid = validate.text("credential_id", call.args.get("credential_id"), max_len=1400, allow_empty=False)
        reason = validate.text("reason", call.args.get("reason") or "", max_len=4096)
        found = [c for c in self._credentials() if c.credential_id == cid and c.revoked is None]
        if not found:
            raise AirlockError(ErrorCode.NOT_FOUND, f"no passkey {cid!r} in use (see airlock passkey list)")
        if call.peer.uid != 0 and call.peer.user != found[0].account:
            raise _no("not_yours", "only root or the passkey's own account may revoke it")
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
        return {"credential_id": cid, "account": found[0].account, "revoked": True}


def _person(account: str) -> Peer:
    import pwd

    try:
        entry = pwd.getpwnam(account)
    except KeyError:
        raise _no("not_operator", f"no account {account!r} here") from None
    return identify(0, entry.pw_uid, entry.pw_gid)

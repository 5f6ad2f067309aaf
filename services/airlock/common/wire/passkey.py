"""The passkey verbs' messages (issue 33), declared on the operator door (`wire.operator`).

airlock-web carries them for a browser; each decides by the token or the
WebAuthn assertion it carries (approval/passkeys.py, approval/webauthn.py),
so a secret field (an enrolment token, a challenge, a console session, a
credential) is checked by its handler: a malformed one is refused exactly as
a wrong one is (``unauthorized`` with its reason), never as a malformed field
that would tell a probe which is which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from airlock.common import actions, groups, validate
from airlock.common.wire.message import Document, Public
from airlock.common.wire.picking import DECISIONS, GRANT_SCOPES, REASON_MAX, Pick, reason, ref
from airlock.common.wire.runner import KILL_REASON_CHARS

ENROLL_MAX_WAIT_SECONDS: Final = 900.0
IMPORT_MAX: Final = 1024  # credentials in one passkey.import
# Absent values of a public reply are null where protocol.md says so.
_NULL: dict[str, Any] = {"null": True}


@dataclass(frozen=True)
class Account(Public):
    account: str

    def check(self) -> None:
        validate.text("account", self.account, max_len=64, allow_empty=False)


@dataclass(frozen=True)
class AccountMaybe(Public):
    account: str | None = None

    def check(self) -> None:
        validate.optional_text("account", self.account, max_len=64)


@dataclass(frozen=True)
class EnrollWait(Public):
    token: str
    timeout_seconds: float = ENROLL_MAX_WAIT_SECONDS

    def check(self) -> None:
        if len(self.token) > 128:
            raise validate.bad("token", "must be the token passkey.enroll gave")
        if not 0 < self.timeout_seconds <= ENROLL_MAX_WAIT_SECONDS:
            raise validate.bad("timeout_seconds", f"must be a number of seconds up to {ENROLL_MAX_WAIT_SECONDS:g}")


@dataclass(frozen=True)
class Enrolment(Public):
    # The one-time link's secret: any malformed token is refused as a wrong one (unauthorized, reason token).
    token: Any = None


@dataclass(frozen=True)
class Register(Enrolment):
    credential: Any = None  # the browser's PublicKeyCredential: approval/webauthn.py checks it, naming the fault


@dataclass(frozen=True)
class LoginBegin(Public):
    client: str  # airlock-web's pre-session cookie and tab key, hashed

    def check(self) -> None:
        validate.text("client", self.client, max_len=128, allow_empty=False)


@dataclass(frozen=True)
class LoginFinish(LoginBegin):
    challenge_id: Any = None  # a wrong or malformed one is "no such challenge" (approval/logins.py)
    credential: Any = None  # approval/webauthn.py checks it


@dataclass(frozen=True)
class DecideBegin(Pick):
    decision: str = field(kw_only=True)
    reason: str | None = None
    grant_seconds: float | None = None  # bound by the approve it becomes (approval.max_grant_seconds)
    scope: str | None = None

    def check(self) -> None:
        super().check()
        if self.decision not in DECISIONS:
            raise validate.bad("decision", "must be allow or deny")
        reason(self.reason)
        if self.scope is not None and self.scope not in GRANT_SCOPES:
            raise validate.bad("scope", "must be command or rule")
        if self.scope is not None and self.grant_seconds is None:
            raise validate.bad("scope", "is only meaningful with grant_seconds")
        if self.decision == "deny" and (self.grant_seconds is not None or self.scope is not None):
            raise validate.bad("grant_seconds", "a deny takes no grant")


@dataclass(frozen=True)
class Group(Public):
    """Issue 49: the group one touch signs (`airlock.common.groups`): its request key, its members' digests."""

    strict: ClassVar[bool] = True  # the group's text is what is signed: a key it does not know is refused
    key: str
    members: tuple[str, ...]

    def check(self) -> None:
        try:
            self.group()
        except groups.GroupRefused as exc:
            named, _, text = exc.message.partition(": ")  # "group.members: ...": named under this field
            raise validate.bad(named.removeprefix("group."), text) from None

    def group(self) -> groups.Group:
        return groups.Group(self.key, self.members)


@dataclass(frozen=True)
class Decide(DecideBegin):
    statement: Any = None  # compared with the request's current statement (request_changed when not it)
    credential: Any = None  # approval/webauthn.py checks it
    group: Group | None = None  # issue 49: one touch over many hosts (this host checks it is a member)


@dataclass(frozen=True)
class ActBegin(Public):
    """Issue 49: a person's action on this host, to be signed (the fleet console asks for it)."""

    action: str
    ref: str | None = None  # kill: the running job's request or operation ID (AGENT/ID when agents share it)
    signal: str | None = None  # kill: TERM when left out (the runner names the signals it sends)
    reason: str | None = None  # hold: required; kill: optional

    def check(self) -> None:
        if self.action not in actions.ACTIONS:
            raise validate.bad("action", "must be kill, hold or release")
        reason(self.reason, KILL_REASON_CHARS if self.action == "kill" else REASON_MAX)
        if self.action == "kill":
            if self.ref is None:
                raise validate.bad("ref", "kill needs the running job's request or operation ID")
            ref("ref", self.ref)
            validate.optional_text("signal", self.signal, max_len=16)
        elif self.ref is not None or self.signal is not None:
            raise validate.bad("ref" if self.ref is not None else "signal", f"{self.action} takes no job")
        if self.action == "hold" and not self.reason:
            raise validate.bad("reason", "a hold needs a reason")


@dataclass(frozen=True)
class Act(Public):
    """Issue 49: the signed action carried back: which challenge, the list one touch signed, the assertion."""

    challenge_id: Any = None  # a wrong or malformed one is "no such action challenge" (approval/hostactions.py)
    members: tuple[str, ...] = ()  # the statement digests the touch signed (empty: this host's alone)
    credential: Any = None  # approval/webauthn.py checks it

    def check(self) -> None:
        if self.members:
            try:
                actions.members(self.members)
            except ValueError as exc:
                raise validate.bad("members", str(exc).removeprefix("members: ")) from None


@dataclass(frozen=True)
class PasskeyImport(Public):
    """Issue 49: lines of `airlock passkey export` (root lists them here; a revoked line revokes)."""

    credentials: tuple[dict[str, Any], ...]  # each checked by approval (passkeyfile.checked), its line named
    source: str | None = None  # where they came from (journaled)

    def check(self) -> None:
        if not 1 <= len(self.credentials) <= IMPORT_MAX:
            raise validate.bad("credentials", f"must be a list of 1 to {IMPORT_MAX} lines of `airlock passkey export`")
        validate.optional_text("source", self.source, max_len=256)


@dataclass(frozen=True)
class Session(Public):
    session: Any = None  # a console session's secret: any malformed one is refused as an ended one


@dataclass(frozen=True)
class PasskeyRevoke(Public):
    credential_id: str
    reason: str | None = None

    def check(self) -> None:
        validate.text("credential_id", self.credential_id, max_len=1400, allow_empty=False)
        reason(self.reason)


@dataclass(frozen=True)
class SessionsEnd(Account):
    reason: str | None = None

    def check(self) -> None:
        super().check()
        reason(self.reason)


@dataclass(frozen=True)
class Enrolled(Public):
    token: str
    expires: int
    expires_at: str
    account: str
    url: str | None = field(default=None, metadata=_NULL)


@dataclass(frozen=True)
class EnrollWaited(Public):
    enrolled: bool
    account: str
    expired: bool
    credential_id: str | None = field(default=None, metadata=_NULL)


@dataclass(frozen=True)
class RegisterOptions(Public):
    options: dict[str, Any]  # WebAuthn's PublicKeyCredentialCreationOptions (approval/webauthn.py builds it)
    account: str


@dataclass(frozen=True)
class Registered(Public):
    credential_id: str
    account: str


@dataclass(frozen=True)
class LoginOptions(Public):
    options: dict[str, Any]  # WebAuthn's PublicKeyCredentialRequestOptions (approval/webauthn.py builds it)
    challenge_id: str


@dataclass(frozen=True)
class SignedIn(Public):
    account: str
    role: str
    credential_id: str
    session: str
    expires: int


@dataclass(frozen=True)
class ConsoleSession(Public):
    account: str
    role: str
    credential_id: str


@dataclass(frozen=True)
class SessionsEnded(Public):
    account: str
    ended: int


@dataclass(frozen=True)
class PasskeyRevoked(Public):
    credential_id: str
    account: str
    revoked: bool
    sessions_ended: int


@dataclass(frozen=True)
class Imported(Public):
    credential_id: str
    account: str
    result: str  # imported, listed already, revoked (N console session(s) ended), ...


@dataclass(frozen=True)
class PasskeysImported(Public):
    results: tuple[Imported, ...]


@dataclass(frozen=True)
class ActChallenge(Public):
    """``passkey.act_begin``: the action statement this host made, its digest, and the challenge of it alone."""

    challenge_id: str
    statement: str
    digest: str
    expires: int
    options: dict[str, Any]  # WebAuthn's PublicKeyCredentialRequestOptions over this statement alone


@dataclass(frozen=True)
class Acted(Public):
    """``passkey.act``: what this host did, and the person it journaled."""

    action: str
    by: dict[str, Any]  # user, uid, credential_id
    result: dict[str, Any]  # kill: the runner's answer; hold/release: the hold's state


@dataclass(frozen=True)
class Passkeys(Public):
    passkeys: tuple[dict[str, Any], ...]  # each approval/credentials.py's record plus its live sessions


class DecideChallenge(Document):
    """``passkey.decide_begin``: the statement and the WebAuthn challenge over it."""

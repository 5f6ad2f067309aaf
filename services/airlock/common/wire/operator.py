"""Declarations of the operator door (operator.sock, served by approval): people, the relay and airlock-web.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use the declared verbs and messages (`wire.verb.Stub`, or the CLI's
`cli.base.call` with a declared verb).

Who calls: an operator (root, ``operators.users``/``groups``) may call every
verb; an observer (``operators.observers``, the relay) the ones that only
read, and the passkey verbs; airlock-web (``web.user``) is an observer that
carries the passkey verbs.  A verb without arguments is declared `Empty`
(an unknown argument is refused).  The others' arguments are `Public`
messages: the public shapes docs/protocol.md documents, field for field
(a key a message does not declare is ignored, as it always was, but for
the journal's ``events`` and ``audit.*``, which refuse it);
what can be checked without approval's state is checked here (`check`), so
a malformed request is refused, with the field named, before a handler runs.
Replies are the documented public shapes; a reply whose fields protocol.md
spells out as a document (`Document`) is listed in `DOCUMENTS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

from airlock.common import validate
from airlock.common.wire import journal as jwire
from airlock.common.wire import passkey as pk
from airlock.common.wire import picking
from airlock.common.wire import runner as rwire
from airlock.common.wire.message import Document, Public
from airlock.common.wire.picking import DECISIONS, GRANT_MAX_USES, GRANT_SCOPES, REASON_MAX, Pick
from airlock.common.wire.verb import Caller, DoorName, Empty, Message, Verb, declare, declared

DOOR = DoorName.OPERATOR

# An observer reads; airlock-web is an observer (so it reads too) that also carries the passkey verbs.
READERS: Final = frozenset({Caller.OPERATOR, Caller.OBSERVER})
OPERATORS: Final = frozenset({Caller.OPERATOR})
PASSKEY_CALLERS: Final = frozenset({Caller.OPERATOR, Caller.OBSERVER, Caller.WEB})

TOKEN_MAX_TTL_SECONDS: Final = 30 * 24 * 3600
TOKEN_DEFAULT_TTL_SECONDS: Final = 3600


# --- arguments ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Show(Public):
    ref: str
    stdin: bool | None = None  # issue 45: a pending request's whole stdin (operators only)

    def check(self) -> None:
        picking.ref("ref", self.ref)


@dataclass(frozen=True)
class Statement(Pick):
    decision: str = "allow"

    def check(self) -> None:
        super().check()
        if self.decision not in DECISIONS:
            raise validate.bad("decision", "must be allow or deny")


@dataclass(frozen=True)
class Decision(Pick):
    """``approve`` and ``deny``: a person's vote, an SSH signature carried by a person, or a grant."""

    reason: str | None = None
    signature: str | None = None
    principal: str | None = None
    grant_seconds: float | None = None  # its bound is approval.max_grant_seconds now (the handler's)
    scope: str | None = None
    uses: int | None = None

    def check(self) -> None:
        super().check()
        if self.signature is not None:
            for name in ("grant_seconds", "uses"):
                if getattr(self, name) is not None:
                    raise validate.bad(name, "a grant is given by an operator's own approve, not with a signature")
            validate.optional_text("principal", self.principal, max_len=256)
            return
        picking.reason(self.reason)
        if self.grant_seconds is None:
            if self.scope is not None:
                raise validate.bad("scope", "is only meaningful with grant_seconds")
            if self.uses is not None:
                raise validate.bad("uses", "is only meaningful with grant_seconds")
            return
        if self.uses is not None and not 1 <= self.uses <= GRANT_MAX_USES:
            raise validate.bad("uses", f"must be a whole number of uses from 1 to {GRANT_MAX_USES}")
        if self.scope is not None and self.scope not in GRANT_SCOPES:
            raise validate.bad("scope", "must be command or rule")


@dataclass(frozen=True)
class GrantRevoke(Public):
    grant_id: str
    reason: str | None = None

    def check(self) -> None:
        validate.text("grant_id", self.grant_id, max_len=64, allow_empty=False)
        picking.reason(self.reason)


@dataclass(frozen=True)
class Cancel(Public):
    operation_id: str  # ``AGENT/OPERATION`` when agents share it
    reason: str | None = None

    def check(self) -> None:
        picking.ref("operation_id", self.operation_id)
        picking.reason(self.reason)


@dataclass(frozen=True)
class Kill(Public):
    ref: str
    signal: str | None = None  # the runner names the signals it sends (runner.jobverbs.KILL_SIGNALS)
    reason: str | None = None

    def check(self) -> None:
        picking.ref("ref", self.ref)
        picking.reason(self.reason, rwire.KILL_REASON_CHARS)


@dataclass(frozen=True)
class Hold(Public):
    reason: str

    def check(self) -> None:
        validate.text("reason", self.reason, max_len=REASON_MAX, allow_empty=False)


@dataclass(frozen=True)
class PolicyCheck(Public):
    """What the policy decides for ``argv`` (or a ``pipeline``) of ``user`` (the caller by default)."""

    argv: Any = None  # each stage checked as exec checks argv (validate.argv), with its field named
    pipeline: Any = None
    user: str | None = None
    privileged: bool | None = None
    session: str | None = None
    cwd: str | None = None
    stdin: str | None = None

    def check(self) -> None:
        validate.optional_text("user", self.user, max_len=256)
        if not isinstance(self.stages_given, list) or not self.stages_given:
            raise validate.bad("argv", "give argv or pipeline")
        for i, stage in enumerate(self.stages_given):
            validate.argv(f"pipeline[{i}]", stage)
        for name in ("cwd", "stdin"):
            validate.optional_text(name, getattr(self, name), max_len=2 << 20)
        validate.optional_text("session", self.session)

    @property
    def stages_given(self) -> Any:
        return self.pipeline or ([self.argv] if self.argv is not None else None)

    @property
    def stages(self) -> tuple[tuple[str, ...], ...]:
        return tuple(validate.argv(f"pipeline[{i}]", s) for i, s in enumerate(self.stages_given))


@dataclass(frozen=True)
class TokenIssue(Public):
    session: str
    user: str  # the agent account (a user name or uid that exists here: approval looks it up)
    ttl_seconds: float = TOKEN_DEFAULT_TTL_SECONDS
    reason: str | None = None

    def check(self) -> None:
        validate.text("session", self.session, max_len=256, allow_empty=False)
        if not 1 <= self.ttl_seconds <= TOKEN_MAX_TTL_SECONDS:
            raise validate.bad("ttl_seconds", f"must be a number of seconds from 1 to {TOKEN_MAX_TTL_SECONDS}")
        picking.reason(self.reason)
        validate.text("user", self.user, max_len=256, allow_empty=False)


@dataclass(frozen=True)
class TokenRevoke(Public):
    token: str | None = None
    session: str | None = None
    reason: str | None = None

    def check(self) -> None:
        if (self.token is None) == (self.session is None):
            raise validate.bad("token", "give exactly one of token and session")
        picking.reason(self.reason)
        validate.optional_text("token", self.token, max_len=256)
        validate.optional_text("session", self.session, max_len=256)
        if self.token == "" or self.session == "":
            raise validate.bad("token" if self.token == "" else "session", "must not be empty")


@dataclass(frozen=True)
class JobRef(Public):
    """``output`` and ``logs``: a job by its request ID, operation ID or ``AGENT/ID``."""

    ref: str

    def check(self) -> None:
        picking.ref("ref", self.ref)


# The journal's own arguments, asked by a person: the journal's checks, a front door's wording.
@dataclass(frozen=True)
class Events(Public, jwire.Events):
    """``events``: a page of the feed (reference/004), passed to the journal as it is."""

    strict: ClassVar[bool] = True  # reference/004: an unknown paging argument is invalid_arguments


@dataclass(frozen=True)
class Verify(Public, jwire.Verify):
    """``audit.verify``: the journal's chain and anchor check."""

    strict: ClassVar[bool] = True


@dataclass(frozen=True)
class Archive(Public, jwire.Archive):
    """``audit.archive``: archive sealed segments, and delete past the limits when confirmed."""

    strict: ClassVar[bool] = True  # a misspelt ``confirm`` must not archive without deleting, silently


# --- replies ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Held(Public):
    hold: bool
    reason: str


@dataclass(frozen=True)
class Released(Public):
    hold: bool
    released: tuple[str, ...]


@dataclass(frozen=True)
class GrantRevoked(Public):
    grant_id: str
    revoked: bool


@dataclass(frozen=True)
class TokenIssued(Public):
    token: str
    token_id: str
    session: str
    user: str
    uid: int
    expires_at: str


@dataclass(frozen=True)
class TokenRevoked(Public):
    revoked: int
    token_id: str | None = None
    session: str | None = None


@dataclass(frozen=True)
class Grants(Public):
    grants: tuple[dict[str, Any], ...]  # each approval/grants.py `Grant.listing`


@dataclass(frozen=True)
class Cancelled(Public):
    operation_id: str
    cancelling: bool
    was: str


# The replies protocol.md spells out as documents (a request's story, the status page, a policy
# decision, a job's output...): carried as `Document`s, key for key as approval builds them.
_NULL: dict[str, Any] = {"null": True}  # a documented key that is null when it does not apply


@dataclass(frozen=True, kw_only=True)
class StatusReport(Public):
    """``status``: the hold, what is live, the services', the policy's and the relay's state (protocol.md)."""

    hold: bool
    hold_reason: str | None = field(default=None, metadata=_NULL)
    hold_by: str | None = field(default=None, metadata=_NULL)
    hold_uid: int | None = field(default=None, metadata=_NULL)
    hold_since: str | None = field(default=None, metadata=_NULL)
    pending: int
    config_refused: str | None = field(default=None, metadata=_NULL)  # issue 44: running on a kept copy
    tokens: int
    grants: int
    services: dict[str, Any]  # per service: up/down, listening/missing; the journal's disk (approval/servicestate.py)
    policy: dict[str, Any]  # default, rules, sources, standing (approval/rules.py)
    relay: dict[str, Any]  # channels, state_dir, approval's timeout and why


class PendingList(Document):
    """``pending``: the waiting requests as an operator (or an observer) may see them."""


class Story(Document):
    """``show``: one request's story (common/trail.py), or a pending request's detail."""


class StatementText(Document):
    """``statement``: the exact text to sign, and the quorum so far."""


class Vote(Document):
    """``approve``/``deny``/``passkey.decide``: the decision or the quorum's progress (approval/ballot.py)."""


class Checked(Document):
    """``policy.check``: the policy's decision (approval/rules.py ``Decision.to_dict``) and its notes."""


class AuditReport(Document):
    """``audit.verify``/``audit.archive``: the journal's report, as docs/operations.md names its fields."""


class Output(Document):
    """``output``/``logs``: a job's stored output, checked against the chain (approval/output.py)."""


def _verb(
    name: str, callers: frozenset[Caller], args: type[Message], reply: type[Message], summary: str, **kw: Any
) -> Verb[Any, Any]:
    return declare(DOOR, name, callers, args, reply, summary, **kw)


# Reading: operators and observers.
STATUS = _verb(
    "status", READERS, Empty, StatusReport, "hold, pending count, live tokens and grants, the services' state"
)
PENDING = _verb(
    "pending", READERS, Empty, PendingList, "the requests waiting for a decision (observers: no file content)"
)
SHOW = _verb("show", READERS, Show, Story, "one request's story by request or operation ID (or a pending prefix)")
EVENTS = _verb("events", READERS, Events, jwire.Page, "a page of the journal's events (after, tail, limit, scope)")
STATEMENT = _verb(
    "statement", READERS, Statement, StatementText, "the exact text to sign to approve or deny a pending request"
)
GRANTS = _verb("grants", READERS, Empty, Grants, "the live grants")
RUNNING = _verb("running", READERS, Empty, rwire.Running, "the commands running now (the runner's list)")

# Deciding and changing: operators only.
APPROVE = _verb("approve", OPERATORS, Decision, Vote, "approve a pending request (a vote, a signature, a grant)")
DENY = _verb("deny", OPERATORS, Decision, Vote, "deny a pending request")
GRANT_REVOKE = _verb("grant.revoke", OPERATORS, GrantRevoke, GrantRevoked, "revoke a live grant")
CANCEL = _verb("cancel", OPERATORS, Cancel, Cancelled, "withdraw a pending operation or stop a running one")
KILL = _verb("kill", OPERATORS, Kill, rwire.Killed, "signal a running job (journaled first)")
HOLD = _verb("hold", OPERATORS, Hold, Held, "every request waits for an operator, even those a rule allows")
RELEASE = _verb("release", OPERATORS, Empty, Released, "lift the hold; requests only the hold kept waiting run")
POLICY_CHECK = _verb(
    "policy.check", OPERATORS, PolicyCheck, Checked, "what the policy decides for a command; runs nothing"
)
AUDIT_VERIFY = _verb("audit.verify", OPERATORS, Verify, AuditReport, "check the journal's chain and anchors")
AUDIT_HEAD = _verb("audit.head", OPERATORS, Empty, jwire.Head, "the journal's newest seq and hash (an anchor)")
AUDIT_ARCHIVE = _verb(
    "audit.archive", OPERATORS, Archive, AuditReport, "archive sealed segments (and delete past the limits)"
)
TOKEN_ISSUE = _verb("token.issue", OPERATORS, TokenIssue, TokenIssued, "issue an agent's session token")
TOKEN_REVOKE = _verb(
    "token.revoke", OPERATORS, TokenRevoke, TokenRevoked, "revoke a token, or every token of a session"
)
OUTPUT = _verb("output", OPERATORS, JobRef, Output, "a job's stored output, checked against its chain")
LOGS = _verb("logs", OPERATORS, JobRef, Output, "a running job's output as it comes", streams=True)

# Issue 33: the passkey verbs.  Each decides by the token or the assertion it carries, or checks its
# caller itself (enroll, list, revoke), so observers and airlock-web may call them.
PASSKEY_ENROLL = _verb(
    "passkey.enroll",
    PASSKEY_CALLERS,
    pk.Account,
    pk.Enrolled,
    "a one-time enrolment link for an operator's or observer's account",
)
PASSKEY_ENROLL_WAIT = _verb(
    "passkey.enroll_wait", PASSKEY_CALLERS, pk.EnrollWait, pk.EnrollWaited, "wait until an enrolment token is used"
)
PASSKEY_REGISTER_BEGIN = _verb(
    "passkey.register_begin",
    PASSKEY_CALLERS,
    pk.Enrolment,
    pk.RegisterOptions,
    "WebAuthn creation options for an enrolment token",
)
PASSKEY_REGISTER_FINISH = _verb(
    "passkey.register_finish", PASSKEY_CALLERS, pk.Register, pk.Registered, "register the credential an enrolment made"
)
PASSKEY_LOGIN_BEGIN = _verb(
    "passkey.login_begin",
    PASSKEY_CALLERS,
    pk.LoginBegin,
    pk.LoginOptions,
    "a sign-in challenge for one browser (5 minutes, once, rated)",
)
PASSKEY_LOGIN_FINISH = _verb(
    "passkey.login_finish",
    PASSKEY_CALLERS,
    pk.LoginFinish,
    pk.SignedIn,
    "check a sign-in assertion: the account and its role",
)
PASSKEY_DECIDE_BEGIN = _verb(
    "passkey.decide_begin",
    PASSKEY_CALLERS,
    pk.DecideBegin,
    pk.DecideChallenge,
    "the challenge of a decision over a pending request's statement",
)
PASSKEY_DECIDE = _verb(
    "passkey.decide", PASSKEY_CALLERS, pk.Decide, Vote, "a decision carried by airlock-web, checked by its assertion"
)
PASSKEY_LIST = _verb(
    "passkey.list", PASSKEY_CALLERS, pk.AccountMaybe, pk.Passkeys, "the enrolled passkeys (an observer: its own)"
)
PASSKEY_REVOKE = _verb(
    "passkey.revoke",
    PASSKEY_CALLERS,
    pk.PasskeyRevoke,
    pk.PasskeyRevoked,
    "revoke a passkey (its console sessions end)",
)
PASSKEY_SESSION = _verb(
    "passkey.session",
    PASSKEY_CALLERS,
    pk.Session,
    pk.ConsoleSession,
    "is a console session live (asked by airlock-web on every request)",
)
PASSKEY_SESSIONS_END = _verb(
    "passkey.sessions_end", PASSKEY_CALLERS, pk.SessionsEnd, pk.SessionsEnded, "end every console session of an account"
)
# Issue 49: root lists passkeys enrolled with a fleet console's origin (each one journaled).
PASSKEY_IMPORT = _verb(
    "passkey.import",
    OPERATORS,
    pk.PasskeyImport,
    pk.PasskeysImported,
    "list exported passkeys here (root; revoked lines revoke)",
)
# Issue 49: a person's kill, hold or release from the fleet console, each a passkey assertion over an
# action statement this host made (approval/hostactions.py); the carrier (an observer) decides nothing.
PASSKEY_ACT_BEGIN = _verb(
    "passkey.act_begin",
    PASSKEY_CALLERS,
    pk.ActBegin,
    pk.ActChallenge,
    "an action statement (kill, hold, release) for a person's passkey to sign",
)
PASSKEY_ACT = _verb(
    "passkey.act", PASSKEY_CALLERS, pk.Act, pk.Acted, "do a signed action: the assertion is checked here, then it acts"
)
# Issue 49: what `airlock passkey carry --verb NAME` carries from the fleet console to this host's approval
# (a decision, a sign-in's two steps and its session's check, an enrollment's two steps, an action's two
# steps: the host verifies each).
CARRIED: Final = {
    "decide": PASSKEY_DECIDE,
    "login_begin": PASSKEY_LOGIN_BEGIN,
    "login_finish": PASSKEY_LOGIN_FINISH,
    "session": PASSKEY_SESSION,
    "register_begin": PASSKEY_REGISTER_BEGIN,
    "register_finish": PASSKEY_REGISTER_FINISH,
    "act_begin": PASSKEY_ACT_BEGIN,
    "act": PASSKEY_ACT,
}

# Derived from the declarations above (never a copy): intake refuses each of these it does not
# serve itself to an agent with the refusal a bad token gets, so a probe learns nothing.
VERBS: Final = frozenset(declared(DOOR))
PASSKEY_VERBS: Final = frozenset(name for name, v in declared(DOOR).items() if Caller.WEB in v.callers)
# What an observer may call: the verbs that read, and the passkey verbs.
OBSERVER_VERBS: Final = frozenset(name for name, v in declared(DOOR).items() if Caller.OBSERVER in v.callers)
# The replies still carried as documents (issue 47: each to become field-typed; a test keeps this list honest).
DOCUMENTS: Final = frozenset(name for name, v in declared(DOOR).items() if issubclass(v.reply, Document))

"""Declarations of the operator door (operator.sock, served by approval): people, the relay and airlock-web.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.

Who calls: an operator (root, ``operators.users``/``groups``) may call every
verb; an observer (``operators.observers``, the relay) the ones that only
read, and the passkey verbs; airlock-web (``web.user``) is an observer that
carries the passkey verbs.  A verb without arguments is declared `Empty`
(an unknown argument is refused); the others are `Open`: their arguments are
the public shapes docs/protocol.md documents, checked field by field in
approval's handlers.  Replies are the documented public shapes (`Open`).
"""

from __future__ import annotations

from typing import Any, Final

from airlock.common.wire.verb import Caller, DoorName, Empty, Message, Open, Verb, declare, declared

DOOR = DoorName.OPERATOR

# An observer reads; airlock-web is an observer (so it reads too) that also carries the passkey verbs.
READERS: Final = frozenset({Caller.OPERATOR, Caller.OBSERVER})
OPERATORS: Final = frozenset({Caller.OPERATOR})
PASSKEY_CALLERS: Final = frozenset({Caller.OPERATOR, Caller.OBSERVER, Caller.WEB})


def _verb(name: str, callers: frozenset[Caller], args: type[Message], summary: str, **kw: Any) -> Verb[Any, Open]:
    return declare(DOOR, name, callers, args, Open, summary, **kw)


# Reading: operators and observers.
STATUS = _verb("status", READERS, Empty, "hold, pending count, live tokens and grants, the services' state")
PENDING = _verb("pending", READERS, Empty, "the requests waiting for a decision (observers: no file content)")
SHOW = _verb("show", READERS, Open, "one request's story by request or operation ID (or a pending prefix)")
EVENTS = _verb("events", READERS, Open, "a page of the journal's events (after, tail, limit, scope)")
STATEMENT = _verb("statement", READERS, Open, "the exact text to sign to approve or deny a pending request")
GRANTS = _verb("grants", READERS, Empty, "the live grants")
RUNNING = _verb("running", READERS, Empty, "the commands running now (the runner's list)")

# Deciding and changing: operators only.
APPROVE = _verb("approve", OPERATORS, Open, "approve a pending request (a vote, a signature, a grant)")
DENY = _verb("deny", OPERATORS, Open, "deny a pending request")
GRANT_REVOKE = _verb("grant.revoke", OPERATORS, Open, "revoke a live grant")
CANCEL = _verb("cancel", OPERATORS, Open, "withdraw a pending operation or stop a running one")
KILL = _verb("kill", OPERATORS, Open, "signal a running job (journaled first)")
HOLD = _verb("hold", OPERATORS, Open, "every request waits for an operator, even those a rule allows")
RELEASE = _verb("release", OPERATORS, Empty, "lift the hold; requests only the hold kept waiting run")
POLICY_CHECK = _verb("policy.check", OPERATORS, Open, "what the policy decides for a command; runs nothing")
AUDIT_VERIFY = _verb("audit.verify", OPERATORS, Open, "check the journal's chain and anchors")
AUDIT_HEAD = _verb("audit.head", OPERATORS, Empty, "the journal's newest seq and hash (an anchor)")
AUDIT_ARCHIVE = _verb("audit.archive", OPERATORS, Open, "archive sealed segments (and delete past the limits)")
TOKEN_ISSUE = _verb("token.issue", OPERATORS, Open, "issue an agent's session token")
TOKEN_REVOKE = _verb("token.revoke", OPERATORS, Open, "revoke a token, or every token of a session")
OUTPUT = _verb("output", OPERATORS, Open, "a job's stored output, checked against its chain")
LOGS = _verb("logs", OPERATORS, Open, "a running job's output as it comes", streams=True)

# Issue 33: the passkey verbs.  Each decides by the token or the assertion it carries, or checks its
# caller itself (enroll, list, revoke), so observers and airlock-web may call them.
PASSKEY_ENROLL = _verb(
    "passkey.enroll", PASSKEY_CALLERS, Open, "a one-time enrolment link for an operator's or observer's account"
)
PASSKEY_ENROLL_WAIT = _verb("passkey.enroll_wait", PASSKEY_CALLERS, Open, "wait until an enrolment token is used")
PASSKEY_REGISTER_BEGIN = _verb(
    "passkey.register_begin", PASSKEY_CALLERS, Open, "WebAuthn creation options for an enrolment token"
)
PASSKEY_REGISTER_FINISH = _verb(
    "passkey.register_finish", PASSKEY_CALLERS, Open, "register the credential an enrolment made"
)
PASSKEY_LOGIN_BEGIN = _verb(
    "passkey.login_begin", PASSKEY_CALLERS, Open, "a sign-in challenge for one browser (5 minutes, once, rated)"
)
PASSKEY_LOGIN_FINISH = _verb(
    "passkey.login_finish", PASSKEY_CALLERS, Open, "check a sign-in assertion: the account and its role"
)
PASSKEY_DECIDE_BEGIN = _verb(
    "passkey.decide_begin", PASSKEY_CALLERS, Open, "the challenge of a decision over a pending request's statement"
)
PASSKEY_DECIDE = _verb(
    "passkey.decide", PASSKEY_CALLERS, Open, "a decision carried by airlock-web, checked by its assertion"
)
PASSKEY_LIST = _verb("passkey.list", PASSKEY_CALLERS, Open, "the enrolled passkeys (an observer: its own)")
PASSKEY_REVOKE = _verb("passkey.revoke", PASSKEY_CALLERS, Open, "revoke a passkey (its console sessions end)")
PASSKEY_SESSION = _verb(
    "passkey.session", PASSKEY_CALLERS, Open, "is a console session live (asked by airlock-web on every request)"
)
PASSKEY_SESSIONS_END = _verb("passkey.sessions_end", PASSKEY_CALLERS, Open, "end every console session of an account")
# Issue 49: root lists passkeys enrolled with a fleet console's origin (each one journaled).
PASSKEY_IMPORT = _verb("passkey.import", OPERATORS, Open, "list exported passkeys here (root; revoked lines revoke)")

# Derived from the declarations above (never a copy): intake refuses each of these it does not
# serve itself to an agent with the refusal a bad token gets, so a probe learns nothing.
VERBS: Final = frozenset(declared(DOOR))
PASSKEY_VERBS: Final = frozenset(name for name, v in declared(DOOR).items() if Caller.WEB in v.callers)
# What an observer may call: the verbs that read, and the passkey verbs.
OBSERVER_VERBS: Final = frozenset(name for name, v in declared(DOOR).items() if Caller.OBSERVER in v.callers)

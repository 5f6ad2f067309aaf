"""Declarations of approval's internal door (approval.sock): intake asks for decisions, the runner redeems tickets.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.

The spec travels once: ``decide`` carries the agent's words about its
request (`Asking`) and the spec beside them, never the spec inside the
request as well; approval rebuilds what operators are shown from the two.
A spec field is carried as JSON here and rebuilt by approval's own
``ExecSpec.from_dict``/``FileSpec.from_dict``: that is approval's named
re-check of intake (a process must not trust another), not a second parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import MAX_MARKS
from airlock.common.wire.verb import Caller, DoorName, Message, declare

DOOR = DoorName.APPROVAL

TOKEN_MAX = 256
# What a decide message adds to the agent's own request line (the peer, the IDs, the marks, JSON's
# keys): approval's internal door takes an agent's largest request plus this, not twice it.
ENVELOPE_BYTES = 16 * 1024


def _bad(field: str, message: str) -> AirlockError:
    return AirlockError(ErrorCode.INVALID_ARGUMENTS, f"{field}: {message}", {"field": field})


@dataclass(frozen=True)
class PeerFacts(Message):
    """A peer as intake's kernel saw it at accept (`common.peer.Peer.to_dict`); ``Peer.from_dict`` rebuilds it."""

    pid: int
    uid: int
    gid: int
    user: str
    groups: tuple[str, ...] = ()
    group_ids: tuple[int, ...] | None = None

    def check(self) -> None:
        if min(self.pid, self.uid, self.gid) < 0:
            raise _bad("peer", "pid, uid and gid must be non-negative integers")


@dataclass(frozen=True)
class Asking(Message):
    """What an agent said about its request beside the spec: shown to operators, journaled with the decision."""

    request_id: str
    reason: str | None = None
    session: str | None = None
    host: str | None = None
    time: str | None = None


@dataclass(frozen=True)
class Decide(Message):
    """A request to decide: an exec's ``spec`` or a file operation's ``file`` (exactly one), carried once."""

    request: Asking
    peer: PeerFacts
    # The spec's own fields: approval's ExecSpec.from_dict / FileSpec.from_dict check them (its re-check of intake).
    spec: dict[str, Any] | None = None
    file: dict[str, Any] | None = None
    operation_id: str | None = None
    after: tuple[str, ...] = ()  # the marks of intake's deferred records (issue 21)
    wait: bool = True  # False (an agent's `sudo -n`): answer approval_required instead of asking a person

    def check(self) -> None:
        if (self.spec is None) == (self.file is None):
            raise _bad("spec", "give exactly one of spec and file")
        if len(self.after) > MAX_MARKS:
            raise _bad("after", f"must be a list of at most {MAX_MARKS} marks")


@dataclass(frozen=True)
class Decided(Message):
    """An allow (a deny, a timeout, a withdrawal are errors): the ticket and what it binds beyond the spec."""

    decision: str
    rule: str
    decided_by: str
    ticket: str
    # What approval resolved (binaries, sandbox, arguments, credentials, a file's content): the runner
    # presents it at redeem and enforces it; its fields are runner/approval's (pending.ticket_binding).
    bound: dict[str, Any]
    mark: str | None = None  # a rule's deferred approval.decided (issue 21)


@dataclass(frozen=True)
class Explain(Message):
    """`airlock can`: what the policy would do with this exec request of this peer (nothing journaled)."""

    request: Asking
    peer: PeerFacts
    spec: dict[str, Any]  # approval's ExecSpec.from_dict checks it


# The agent's `can` answer is a documented public shape (protocol.md): its absent values are null.
_NULL: dict[str, Any] = {"null": True}


@dataclass(frozen=True)
class RuleNote(Message):
    name: str
    description: str | None = field(default=None, metadata=_NULL)


@dataclass(frozen=True)
class StageAnswer(Message):
    argv: tuple[str, ...]
    decision: str
    rules: tuple[RuleNote, ...]
    default: bool
    not_found: bool
    binary: str | None = field(default=None, metadata=_NULL)  # None: not found


@dataclass(frozen=True)
class Explained(Message):
    decision: str
    rule: str
    stages: tuple[StageAnswer, ...]
    run_as: str
    searched: str
    approvals_needed: int
    held: bool
    # Issue 44: set when the policy files on disk were refused (what decides instead, and why).
    policy_note: str | None = None


@dataclass(frozen=True)
class Redeem(Message):
    """The runner presents a ticket with the spec's digest and what approval bound, before the job starts."""

    ticket: str
    digest: str
    bound: dict[str, Any]  # as `Decided.bound`: compared whole through the ticket's binding

    def check(self) -> None:
        if not 0 < len(self.ticket) <= TOKEN_MAX:
            raise _bad("ticket", f"must be 1 to {TOKEN_MAX} characters")
        if not 0 < len(self.digest) <= 128:
            raise _bad("digest", "must be 1 to 128 characters")


@dataclass(frozen=True)
class Redeemed(Message):
    valid: bool
    mark: str | None = None


@dataclass(frozen=True)
class TokenCheck(Message):
    """Which session does this token stand for, presented by this uid (the agent's, from intake's accept)?"""

    token: str
    uid: int

    def check(self) -> None:
        # Any failure is `unauthorized`, a malformed token included: nothing tells a guess from a near miss.
        if not 0 < len(self.token) <= TOKEN_MAX or self.uid < 0:
            raise AirlockError(ErrorCode.UNAUTHORIZED, "unauthorized")


@dataclass(frozen=True)
class Session(Message):
    session: str


@dataclass(frozen=True)
class Withdraw(Message):
    """The agent went away or cancelled: its own pending request (by its uid) is withdrawn."""

    request_id: str
    uid: int

    def check(self) -> None:
        if not 0 < len(self.request_id) <= 256:
            raise _bad("request_id", "must be 1 to 256 characters")
        if self.uid < 0:
            raise _bad("uid", "must be the requesting agent's uid")


@dataclass(frozen=True)
class Withdrawn(Message):
    withdrawn: bool


@dataclass(frozen=True)
class ApproveSigned(Message):
    """An agent carries an operator's signature over its own pending request; ``peer`` is the carrier."""

    request_id: str
    signature: str  # armoured (several lines): approval reads it strictly (approval/statement.py)
    peer: PeerFacts
    reason: str = ""


@dataclass(frozen=True)
class SignedVote(Message):
    """The signature's vote, counted: decided, or (a quorum) how far it has come."""

    request_id: str
    decision: str
    signer: dict[str, Any]  # quorum.Voter.to_dict: who the signature is (person, principal, key, carrier)
    complete: bool | None = None
    approvals: int | None = None
    needed: int | None = None
    progress: str | None = None
    approvers: tuple[dict[str, Any], ...] | None = None  # each a Voter.to_dict
    requirement: dict[str, Any] | None = None  # quorum.Requirement.to_dict


_INTAKE = {Caller.INTAKE}

DECIDE = declare(
    DOOR,
    "decide",
    _INTAKE,
    Decide,
    Decided,
    "decide an agent's request: allow with a ticket, or an error (waits for operators on an ask)",
    streams=True,
)
EXPLAIN = declare(DOOR, "explain", _INTAKE, Explain, Explained, "what the policy would do with an agent's own request")
REDEEM = declare(DOOR, "redeem", {Caller.RUNNER}, Redeem, Redeemed, "spend a ticket, once, for the spec it binds")
TOKEN_CHECK = declare(DOOR, "token.check", _INTAKE, TokenCheck, Session, "the session a token stands for")
WITHDRAW = declare(DOOR, "withdraw", _INTAKE, Withdraw, Withdrawn, "withdraw an agent's pending request")
APPROVE_SIGNED = declare(
    DOOR, "approve_signed", _INTAKE, ApproveSigned, SignedVote, "an agent carries a signed approval of its request"
)

"""Declarations of the runner's door (runner.sock): intake hands it
approved work, approval its operators' cancels, kills and previews.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.

The exec and file specs travel as themselves (`wire.message.carry`): decoded
once, by their own ``from_dict``, when the message is; the runner's handler
gets the typed spec and re-checks only what it must not take on trust
(runner/recheck.py names those checks).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from airlock.common import validate
from airlock.common.containment import Containment
from airlock.common.fileop_spec import FileSpec
from airlock.common.kinds import MAX_MARKS
from airlock.common.spec import ExecSpec
from airlock.common.wire.verb import Caller, DoorName, Empty, Message, Stub, carry, declare

if typing.TYPE_CHECKING:
    from airlock.common.ipc import Client

DOOR = DoorName.RUNNER

carry(ExecSpec)
carry(FileSpec)

ID_CHARS = 256  # an operation, request or session ID, a ticket, a kill's ref or who killed
# An ``exec`` line carries the agent's request once (at most limits.max_request_bytes) plus what
# approval bound to the ticket beyond it: each stage's binary identity (a path of up to 4096
# characters), sandbox, path arguments and credentials, a few KiB a stage.  A job has at most as
# many stages as its end record can name (runner/endrecord.py: about 200 in 64 KiB), so this much
# room is enough; the runner door's line is the request's limit plus this, not twice the request.
BOUND_ROOM = 1024 * 1024


def max_line(max_request_bytes: int) -> int:
    """The runner door's longest line: a request's own limit, plus room for approval's binding."""
    return max_request_bytes + BOUND_ROOM


def _text(name: str, value: str | None, *, required: bool = False) -> None:
    if value is None:
        return
    validate.text(name, value, max_len=ID_CHARS, allow_empty=not required)


def _marks(after: tuple[str, ...]) -> None:
    if len(after) > MAX_MARKS:
        raise validate.bad("after", f"must be a list of at most {MAX_MARKS} marks")
    for mark in after:
        validate.text("after", mark, max_len=64, allow_empty=False)


@dataclass(frozen=True)
class Requester(Message):
    """The process that asked, as intake identified it (``forward_agent`` finds its SSH agent)."""

    pid: int
    uid: int

    def check(self) -> None:
        if self.pid < 1 or self.uid < 0:
            raise validate.bad("peer", "pid and uid must be a process and a user")


def _approved(m: Exec | Files) -> None:
    _text("operation_id", m.operation_id, required=True)
    _text("ticket", m.ticket, required=True)
    _text("request_id", m.request_id)
    _text("session", m.session)
    _marks(m.after)


# What every approved piece of work carries besides its spec: whose operation, and the ticket
# that lets it run.  ``bound`` is what approval bound to the ticket (binaries, sandbox, path
# arguments, credentials, a file's pre-state), carried as approval made it because ``redeem``
# compares it with the ticket's own copy; the runner parses it only once redeem said it is
# approval's (runner/recheck.py).  ``after`` names the request's deferred journal records (issue 21).
# ``ticket`` is "" until intake has approval's answer (`approved`); the runner refuses "".


@dataclass(frozen=True)
class Exec(Message):
    """An approved exec: the spec once, and what goes with it but not into its digest."""

    spec: ExecSpec
    operation_id: str
    ticket: str = ""
    bound: dict[str, Any] = field(default_factory=dict)
    after: tuple[str, ...] = ()
    request_id: str | None = None
    session: str | None = None
    protected_env: dict[str, str] = field(default_factory=dict)  # one-shot values, never journaled
    stream: bool = False
    peer: Requester | None = None

    def check(self) -> None:
        _approved(self)
        validate.env_map("protected_env", self.protected_env)


@dataclass(frozen=True)
class Ran(Message):
    """An exec's outcome.

    ``evidence`` is the agent's reply as docs/protocol.md documents it (built
    by the runner, passed on by intake as it is); ``audit_mark`` names the
    deferred ``exec.finished`` that intake's ``request.replied`` commits with.
    """

    evidence: dict[str, Any]
    audit_mark: str | None = None


@dataclass(frozen=True)
class Files(Message):
    """An approved file operation."""

    spec: FileSpec
    operation_id: str
    ticket: str = ""
    bound: dict[str, Any] = field(default_factory=dict)
    after: tuple[str, ...] = ()
    request_id: str | None = None
    session: str | None = None

    def check(self) -> None:
        _approved(self)


# Work intake sends on: an exec or a file operation (`approved` fills in approval's answer).
W = TypeVar("W", Exec, Files)


def approved(work: W, *, ticket: str, bound: dict[str, Any], operation_id: str, after: list[str]) -> W:
    """``work`` with approval's answer filled in (intake's drive, once approval decided)."""
    return dataclasses.replace(work, ticket=ticket, bound=bound, operation_id=operation_id, after=tuple(after))


@dataclass(frozen=True)
class Outcome(Message):
    """A file operation's outcome, as the agent gets it (its shape depends on the tool: docs/protocol.md)."""

    outcome: dict[str, Any]


def outcome(reply: Ran | Outcome) -> dict[str, Any]:
    """The agent's outcome of a piece of work; an exec's ``audit_mark`` among it (intake takes it out)."""
    if isinstance(reply, Ran):
        return dict(reply.evidence) | ({"audit_mark": reply.audit_mark} if reply.audit_mark is not None else {})
    return dict(reply.outcome)


@dataclass(frozen=True)
class Cancel(Message):
    operation_id: str
    uid: int | None = None  # intake names the agent whose operation it is; approval's operator may cancel any

    def check(self) -> None:
        _text("operation_id", self.operation_id, required=True)


@dataclass(frozen=True)
class Cancelling(Message):
    operation_id: str
    cancelling: bool


KILL_REASON_CHARS = 1024


@dataclass(frozen=True)
class Kill(Message):
    """An operator's signal to a running job (``ref``: its request or operation ID; ``uid``: that agent's only)."""

    ref: str
    by: str
    uid: int | None = None
    signal: str | None = None  # a name from runner.jobverbs.KILL_SIGNALS; TERM when left out
    reason: str = ""
    dry: bool = False  # approval journals whom it kills first

    def check(self) -> None:
        _text("ref", self.ref, required=True)
        _text("by", self.by, required=True)
        validate.text("reason", self.reason, max_len=KILL_REASON_CHARS)
        if self.signal is not None:
            validate.text("signal", self.signal, max_len=16, allow_empty=False)


@dataclass(frozen=True)
class Killed(Message):
    operation_id: str
    agent_uid: int
    request_id: str | None = None
    signal: str | None = None  # left out of a dry run's answer
    was: str | None = None  # "running" or "not started" (then it never starts)


@dataclass(frozen=True)
class RunningJob(Message):
    operation_id: str
    stages: tuple[tuple[str, ...], ...]
    agent_uid: int
    uid: int
    containment: Containment
    started_at: str
    request_id: str | None = None


@dataclass(frozen=True)
class Running(Message):
    running: tuple[RunningJob, ...]


@dataclass(frozen=True)
class Inspect(Message):
    """A root job's path arguments to classify, before anyone decides (runner/arguments.py)."""

    spec: ExecSpec
    programs: tuple[str, ...]  # each stage's canonical binary, as approval resolved it

    def check(self) -> None:
        if len(self.programs) != len(self.spec.stages):
            raise validate.bad("programs", "must name each stage's canonical binary")
        for i, program in enumerate(self.programs):
            validate.text(f"programs[{i}]", program, max_len=4096)


@dataclass(frozen=True)
class Inspected(Message):
    # Each changeable path argument as common/arguments.py encodes it: approval binds the list to
    # the ticket and the runner parses it (common.arguments.parse_bound) once redeemed.
    arguments: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class Review(Message):
    # The statement approval builds for the reviewer: the reviewer's stdin, as JSON (runner/review.py).
    statement: dict[str, Any]


@dataclass(frozen=True)
class Reviewed(Message):
    """The reviewer's run: whether it ran (and ``why`` not), its exit and output."""

    ran: bool
    why: str | None = None
    timed_out: bool | None = None
    exit_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None
    truncated: bool | None = None


@dataclass(frozen=True)
class Output(Message):
    file: str  # an output log's name (runner/outputlog.py checks it)
    follow: bool = False


@dataclass(frozen=True)
class Chunk(Message):
    stream: str
    stage: int
    ms: int
    data: str  # base64


@dataclass(frozen=True)
class OutputRead(Message):
    """A stored log (``chunks``, ``complete``, ``streams``), or the end of a followed one (``ended``)."""

    file: str
    running: bool
    complete: bool | None = None
    chunks: tuple[Chunk, ...] | None = None
    # Each stream's digest and size as the log's trailer has them (runner/outputlog.py).
    streams: tuple[dict[str, Any], ...] | None = None
    ended: bool | None = None
    # The SHA-256 of the whole stored log, frames and notes in order (issue 51).
    log_sha256: str | None = None


@dataclass(frozen=True)
class Preview(Message):
    spec: FileSpec
    as_requester: bool = False  # run as the agent that asked (see runner/fileop_verbs.py)


@dataclass(frozen=True)
class PasskeyWrite(Message):
    """Add a credential (every field checked by common.passkeyfile) or revoke one by its ID."""

    op: str  # add or revoke
    # A credential as one line of the passkeys file: common.passkeyfile.checked reads it field by field.
    credential: dict[str, Any] | None = None
    credential_id: str | None = None

    def check(self) -> None:
        if self.op not in ("add", "revoke"):
            raise validate.bad("op", "must be add or revoke")
        if self.op == "revoke":
            validate.text("credential_id", self.credential_id, max_len=1400, allow_empty=False)


@dataclass(frozen=True)
class Written(Message):
    written: bool


_INTAKE = {Caller.INTAKE}
_APPROVAL = {Caller.APPROVAL}

EXEC = declare(DOOR, "exec", _INTAKE, Exec, Ran, "run approved work (the ticket is redeemed first)", streams=True)
FILES = declare(DOOR, "files", _INTAKE, Files, Outcome, "perform an approved file operation")
CANCEL = declare(DOOR, "cancel", _INTAKE | _APPROVAL, Cancel, Cancelling, "stop a running operation")
KILL = declare(DOOR, "kill", _APPROVAL, Kill, Killed, "an operator's signal to a running job")
RUNNING = declare(DOOR, "running", _APPROVAL, Empty, Running, "the commands running now")
INSPECT = declare(DOOR, "inspect", _APPROVAL, Inspect, Inspected, "a root job's changeable path arguments")
REVIEW = declare(DOOR, "review", _APPROVAL, Review, Reviewed, "run the configured reviewer on a statement")
OUTPUT = declare(
    DOOR, "output", _APPROVAL, Output, OutputRead, "a job's kept output log, or follow a running job's", streams=True
)
FILES_PREVIEW = declare(
    DOOR, "files_preview", _APPROVAL, Preview, Outcome, "the diff a pending write would make (writes nothing)"
)
PASSKEYS_WRITE = declare(
    DOOR, "passkeys.write", _APPROVAL, PasskeyWrite, Written, "add or revoke a line of approval.passkeys"
)


def stub(client: Client) -> Stub:
    """The runner door's stub over ``client`` (a `common.ipc.Client` to runner.sock)."""
    return Stub(DOOR, client)

"""Declarations of the journal's door (journal.sock): intake, approval and the runner append and read the chain.

Each verb: its name, who may call it, its argument and reply messages
(`wire.verb`).  The server builds its door table from these (`wire.verb.serve`);
callers use a `wire.verb.Stub` with them.  Who calls is the peer's uid
(SO_PEERCRED) mapped to the services' accounts, never a field of the message.

A record's ``payload`` and a page's records are carried as JSON without a
type check here: the payload is the event's own (the journal bounds its size
and shape, journal/records.py), and a record is the journal's own encoding
(`journal.records.Event.to_dict`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from airlock.common import validate
from airlock.common.kinds import MAX_PAYLOAD_BYTES
from airlock.common.wire.verb import Caller, DoorName, Empty, Message, declare

DOOR = DoorName.JOURNAL

# Bounds the journal held before its verbs were typed (the same refusals, now at decode).
MAX_KIND: Final = 64
MAX_ID: Final = 256
MAX_KEY: Final = 512
MAX_MARKS: Final = 256  # marks one ``sync`` asks about (journal/records.py MAX_PAGE)
MAX_ANCHORS_PER_CALL: Final = 4096  # anchors one ``verify`` carries (the CLI sends more in several calls)
MAX_PAGE_LIMIT: Final = 256
MAX_RECORDS: Final = 4096  # records one ``records`` call returns
# The largest outcome ``op.complete`` stores for replay (canonical JSON; journal/records.py refuses more).
MAX_OUTCOME_BYTES: Final = 1024 * 1024
# The journal door's longest line: the largest message its own caps let through -- an outcome, the
# record that goes with it (at most MAX_PAYLOAD_BYTES of payload) and their envelope.  Nothing an agent
# sends travels here whole (a request is journaled as its description, under the payload cap), so
# ``limits.max_request_bytes`` does not bound it: a small request limit must not cost a large
# output its audit record and its replay (tests/integration/test_journal_line_limit.py).
MAX_LINE: Final = MAX_OUTCOME_BYTES + MAX_PAYLOAD_BYTES + 64 * 1024

_SERVICES = frozenset({Caller.INTAKE, Caller.APPROVAL, Caller.RUNNER})


@dataclass(frozen=True)
class Append(Message):
    """One event to append.  ``writer`` only picks among the services the peer's uid is (`airlock dev up`)."""

    kind: str
    writer: str | None = None
    request_id: str | None = None
    operation_id: str | None = None
    peer_uid: int | None = None
    session: str | None = None
    payload: dict[str, Any] = field(default_factory=dict)  # the event's own; journal/records.py bounds it
    after: tuple[str, ...] | None = None  # marks of deferred records that must be durable first
    durable: bool = True  # False: queued, answered at once with a mark (issue 21)

    def check(self) -> None:
        validate.text("kind", self.kind, max_len=MAX_KIND)
        for name in ("request_id", "operation_id", "session"):
            validate.optional_text(name, getattr(self, name), max_len=MAX_ID)
        validate.integer("peer_uid", self.peer_uid)


@dataclass(frozen=True)
class Appended(Message):
    """A durable append's place in the chain (``seq``, ``hash``), or a deferred one's ``mark``."""

    seq: int | None = None
    hash: str | None = None
    mark: str | None = None


@dataclass(frozen=True)
class Claim(Message):
    """A request ID claimed for the replay window (``key`` is ``<uid>:<request ID>``)."""

    key: str
    window_seconds: float

    def check(self) -> None:
        validate.text("key", self.key, max_len=MAX_KEY, allow_empty=False)


@dataclass(frozen=True)
class Claimed(Message):
    claimed: bool


@dataclass(frozen=True)
class OpBegin(Message):
    """Claim the request ID (optional), journal the event (optional), begin the operation: one commit."""

    operation_id: str
    digest: str
    has_protected: bool = False
    claim: Claim | None = None
    event: Append | None = None

    def check(self) -> None:
        validate.text("operation_id", self.operation_id, max_len=MAX_ID, allow_empty=False)
        validate.text("digest", self.digest, max_len=128, allow_empty=False)


class OpState(enum.StrEnum):
    """What ``op.begin`` found of an operation ID (journal/operations.py)."""

    NEW = "new"  # first seen: go on and run it
    REPLAY = "replay"  # settled before: its stored outcome is the answer


@dataclass(frozen=True)
class OpBegun(Message):
    """``claimed`` false: the request ID was taken (nothing written).  ``outcome``: a replay's stored outcome."""

    claimed: bool
    state: OpState | None = None
    outcome: dict[str, Any] | None = None  # the outcome intake stored, replayed as it is
    event: Appended | None = None


@dataclass(frozen=True)
class OpComplete(Message):
    operation_id: str
    digest: str
    outcome: dict[str, Any]  # intake's settled reply, replayed as it is; journal/records.py bounds it
    event: Append | None = None

    def check(self) -> None:
        validate.text("operation_id", self.operation_id, max_len=MAX_ID, allow_empty=False)
        validate.text("digest", self.digest, max_len=128, allow_empty=False)


@dataclass(frozen=True)
class OpAbandon(Message):
    operation_id: str
    event: Append | None = None

    def check(self) -> None:
        validate.text("operation_id", self.operation_id, max_len=MAX_ID)


@dataclass(frozen=True)
class Journaled(Message):
    """The event a combined verb carried, when it carried one."""

    event: Appended | None = None


@dataclass(frozen=True)
class Sync(Message):
    marks: tuple[str, ...]
    writer: str | None = None

    def check(self) -> None:
        if len(self.marks) > MAX_MARKS:
            raise validate.bad("marks", f"must be a list of at most {MAX_MARKS} marks")


@dataclass(frozen=True)
class Synced(Message):
    lost: tuple[str, ...]


@dataclass(frozen=True)
class Events(Message):
    """One page of the events feed (reference/004): ``after`` a cursor, or the ``tail``; ``scope`` matches exactly."""

    after: int | None = None
    tail: int | None = None
    limit: int | None = None
    scope: dict[str, Any] | None = None  # field -> value; the journal checks each against its scopes

    def check(self) -> None:
        validate.integer("after", self.after)
        validate.integer("tail", self.tail)
        validate.integer("limit", self.limit, minimum=1, maximum=MAX_PAGE_LIMIT)


@dataclass(frozen=True)
class Page(Message):
    events: tuple[dict[str, Any], ...]  # each the journal's own encoding of a record
    next_cursor: int
    latest: int


@dataclass(frozen=True)
class Records(Message):
    """Records of some kinds written by some services whose payload has the given fields' values.

    The journal reads without knowing what the records mean: the service that
    wrote them interprets them (approval its holds and grants, approval/restore.py).
    """

    writers: tuple[str, ...]
    kinds: tuple[str, ...]
    fields: dict[str, str] | None = None  # payload field -> value (all must match)
    field_in: dict[str, tuple[str, ...]] | None = None  # payload field -> one of these values
    since_seq: int | None = None  # only records after this seq
    newest: bool = True  # the newest ``limit`` (else the first ``limit`` after ``since_seq``), oldest first
    limit: int = MAX_RECORDS
    pick: tuple[str, ...] | None = None  # only these payload fields (a smaller reply)

    def check(self) -> None:
        for name, names in (("writers", self.writers), ("kinds", self.kinds)):
            if not names or len(names) > 16:
                raise validate.bad(name, "must be a list of 1 to 16 names")
            for one in names:
                validate.text(name, one, max_len=MAX_KIND, allow_empty=False)
        keys = [*(self.fields or {}), *(self.field_in or {}), *(self.pick or ())]
        if len(keys) > 16:
            raise validate.bad("fields", "at most 16 payload fields")
        for key in keys:
            if not key or len(key) > 64 or not key.replace("_", "").replace("-", "").isalnum() or not key.isascii():
                raise validate.bad("fields", f"{key!r} is not a payload field name")
        for values in (self.field_in or {}).values():
            if not values or len(values) > 16:
                raise validate.bad("field_in", "each field takes 1 to 16 values")
        validate.integer("since_seq", self.since_seq)
        validate.integer("limit", self.limit, minimum=1, maximum=MAX_RECORDS)


@dataclass(frozen=True)
class Found(Message):
    records: tuple[dict[str, Any], ...]  # {seq, time, peer_uid, kind, writer, payload}, oldest first
    # The live segment's opening record's ``carried`` part, as journal/segments.py wrote it (None before a rollover).
    carried: dict[str, Any] | None = None


@dataclass(frozen=True)
class Head(Message):
    seq: int
    hash: str


@dataclass(frozen=True)
class Disk(Message):
    """The journal's size and its filesystem's free space (journal/disk.py `Disk`; `airlock status`)."""

    database: str
    segment: str
    journal_bytes: int
    filesystem_bytes: int
    free_bytes: int
    free_percent: float
    records: int
    rate_window_seconds: float
    low: bool
    warn_percent: float
    warn_bytes: int
    measured: str
    bytes_per_day: float | None = None
    days_left: float | None = None


@dataclass(frozen=True)
class Verify(Message):
    anchors: tuple[Any, ...] | None = None  # each parsed by journal/chain.py `parse_anchor`, which names the fault
    own_anchors: bool = False
    chain: bool = True
    from_seq: int | None = field(default=None, metadata={"key": "from"})
    anchor: str | None = None
    full: bool = False

    def check(self) -> None:
        if self.anchors is not None and len(self.anchors) > MAX_ANCHORS_PER_CALL:
            raise validate.bad("anchors", f"must be a list of at most {MAX_ANCHORS_PER_CALL} anchors")
        validate.integer("from", self.from_seq)
        validate.optional_text("anchor", self.anchor, max_len=128)


@dataclass(frozen=True)
class Archive(Message):
    confirm: bool = False
    shipped: str | None = None  # "SEQ:HASH": what a collector holds (checked against the chain)

    def check(self) -> None:
        validate.optional_text("shipped", self.shipped, max_len=128)


@dataclass(frozen=True)
class Report(Message):
    """An ``airlock audit`` report, shown by the CLI as it is (docs/operations.md names its fields)."""

    report: dict[str, Any]


def _operator_actions(actions: tuple[str, ...], limit: int) -> Records:
    return Records(
        writers=("approval", "operator"), kinds=("operator.action",), field_in={"action": actions}, limit=limit
    )


# approval's own records it reads back at start (approval/restore.py interprets them): its newest hold or
# release, and its newest grant records (``operator`` is the writer of older journals' operator actions).
HOLD_RECORDS: Final = _operator_actions(("hold", "release"), 1)
GRANT_RECORDS: Final = _operator_actions(("grant", "grant.revoke", "grant.expired", "grant.exhausted"), MAX_RECORDS)
# Issue 45: a person's denials (approval.decided with ``remembered: denial``), only what approval keys them by.
DENIAL_RECORDS: Final = Records(
    writers=("approval",),
    kinds=("approval.decided",),
    fields={"remembered": "denial"},
    limit=MAX_RECORDS,
    pick=("denial",),
)
# What a new segment's opening record carries over from the database it seals (journal/rollover.py), by
# name: the answers to these queries, so a service's read still finds its newest records after a rollover.
# Declared by the service that reads them back; the journal runs them without knowing what they mean.
CARRIED: Final = MappingProxyType({"hold": HOLD_RECORDS, "grants": GRANT_RECORDS, "denials": DENIAL_RECORDS})


APPEND = declare(DOOR, "append", _SERVICES, Append, Appended, "append one event to the chain (durable, or deferred)")
OP_BEGIN = declare(
    DOOR, "op.begin", {Caller.INTAKE}, OpBegin, OpBegun, "claim a request ID, journal its event, begin the operation"
)
OP_COMPLETE = declare(
    DOOR, "op.complete", {Caller.INTAKE}, OpComplete, Journaled, "store an operation's outcome for replay"
)
OP_ABANDON = declare(DOOR, "op.abandon", {Caller.INTAKE}, OpAbandon, Journaled, "free an operation that did not settle")
REQUEST_CLAIM = declare(
    DOOR, "request.claim", {Caller.INTAKE}, Claim, Claimed, "claim a request ID for the replay window"
)
SYNC = declare(DOOR, "sync", {Caller.RUNNER}, Sync, Synced, "which of the caller's deferred marks are not durable")
EVENTS = declare(DOOR, "events", _SERVICES, Events, Page, "one page of the events feed")
RECORDS = declare(
    DOOR, "records", {Caller.APPROVAL}, Records, Found, "a service's newest records by kind and payload fields"
)
HEAD = declare(DOOR, "head", {Caller.APPROVAL}, Empty, Head, "the chain's head")
DISK = declare(DOOR, "disk", {Caller.APPROVAL}, Empty, Disk, "the journal's size and free space")
VERIFY = declare(DOOR, "verify", {Caller.APPROVAL}, Verify, Report, "check the chain against anchors")
ARCHIVE = declare(DOOR, "archive", {Caller.APPROVAL}, Archive, Report, "sealed segments, archive and retention")

"""A request's lifecycle: its states, the journal kinds that move it, one table.

Every request an agent sends tells one story in the audit journal, written by
three services: intake (``request.received`` … ``request.replied``), approval
(``approval.pending``, ``approval.decided``) and the runner (``exec.*`` /
``files.*``).  This module is that story's grammar, in the spirit of h11's
``_state.py``: one table of transitions, and a fold that walks a request's
events (oldest first, as the journal's feed returns them) through it and names
the first step the table forbids (its kind, its seq and the state it met).

The table is the single source of truth: the journal's kinds table
(``airlock.common.kinds``) takes each kind's transitions from here and refuses
to load a kind this module does not classify; ``common/trail.py`` (``airlock
show``/``wait``) folds with it; ``airlock audit verify --lifecycle`` folds every
request in the journal with it; docs/architecture.md prints it (a test keeps
the two equal).  Exec and file operations share it: they differ only in which
runner kinds start and end the work (``Transition.family``), and an operation
that started as one cannot finish as the other.

States (``STATES``): a request is ``new`` until ``request.received``.  The
decision leaves it ``approved``, ``denied``, ``expired`` (the approval timeout)
or ``withdrawn`` (the agent left or cancelled while it waited); an approved one
is ``running`` from its start record, ``cancelled`` when it was stopped, then
``ended``; the runner may instead have ``refused`` it (a bad or reused ticket,
the hold, ``binary_changed``, a program it could not start).  Intake's
``request.replied`` closes every story: ``finished`` (status ok, after the
work ended) or ``failed`` (an error, from any open state: a denial, a timeout,
a refusal, ``file_changed``, or an interruption -- a service that stopped
mid-request, e.g. ``approval_interrupted`` from ``pending`` or
``runner_unavailable`` from ``running``).  A retried operation answered from
its stored outcome is ``replayed`` at once.  ``finished``, ``failed`` and
``replayed`` are terminal: no lifecycle event may follow them.

Records written before an effect (``request.received``, ``approval.decided``,
``exec.started``/``files.started``) are required: if the journal cannot take
them, the effect does not happen.  The first two are deferred appends
(issue 21): durable together with ``exec.started``, which the journal refuses
if either was lost; the order of records is unchanged.  The end record (``exec.finished``,
``files.finished``) is written after the work; the runner checks that it will
fit before the work starts (issue 29), so only a journal that restarted at that
moment can lose it (``runner.audit.unrecorded`` in journald).  The table lets
intake's ``ok`` reply follow ``running`` directly, but `missing_end` names that
step, and ``airlock audit verify --lifecycle`` holds it a violation unless the
journal restarted between the start and the reply.

A story may also stop in an open state for ever: a service was killed before
it wrote the next record (intake killed while the job ran leaves ``ended``
with no reply).  That is an incomplete story, not a forbidden one.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

# --- states ------------------------------------------------------------------------

NEW: Final = "new"

STATES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "new": "nothing journaled yet",
        "received": "intake accepted the request (request.received)",
        "pending": "waiting for an operator (approval.pending)",
        "approved": "a rule or an operator allowed it; a ticket was issued",
        "denied": "a rule or an operator denied it",
        "expired": "no operator decided within approval.timeout_seconds",
        "withdrawn": "the agent left or cancelled before a decision",
        "running": "the runner journaled the start; the work runs",
        "cancelled": "the work was stopped before it ended on its own (its end record follows)",
        "ended": "the work ended; its outcome is journaled, intake's reply follows",
        "refused": "the runner refused the work: nothing ran (or the program could not be started)",
        "finished": "intake replied ok: the work ran and its outcome was returned",
        "failed": "intake replied with an error (denied, expired, withdrawn, refused, interrupted, ...)",
        "replayed": "a retried operation was answered from its stored outcome; nothing ran",
    }
)

# No lifecycle event may follow these.
TERMINAL: Final = frozenset({"finished", "failed", "replayed"})

# Nothing more will run: the outcome is known, at most intake's reply follows
# (``airlock wait`` stops here).
SETTLED: Final = TERMINAL | frozenset({"denied", "expired", "withdrawn", "refused", "ended"})

# --- the table ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Transition:
    """``kind`` (with ``when`` = its payload's decision or status, if it matters) moves ``sources`` → ``target``."""

    kind: str
    when: str | None
    sources: frozenset[str]
    target: str
    family: str | None = None  # "exec" or "files": the runner's kinds of one kind of work

    @property
    def label(self) -> str:
        return self.kind if self.when is None else f"{self.kind}[{self.when}]"


def _t(kind: str, when: str | None, sources: str, target: str, family: str | None = None) -> Transition:
    return Transition(kind, when, frozenset(sources.split()), target, family)


# Whose payload field picks the row, for the kinds that have more than one.
SELECTORS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "approval.decided": "decision",
        "request.replied": "status",
    }
)

_OPEN_AFTER_RECEIVED = "received pending approved denied expired withdrawn running cancelled ended refused"

TRANSITIONS: Final[tuple[Transition, ...]] = (
    _t("request.received", None, "new", "received"),
    _t("request.rejected", None, "new received", "failed"),
    _t("operation.replayed", None, "received", "replayed"),
    _t("approval.pending", None, "received", "pending"),
    _t("approval.decided", "allow", "received pending", "approved"),
    _t("approval.decided", "deny", "received pending", "denied"),
    _t("approval.decided", "timeout", "pending", "expired"),
    _t("approval.decided", "withdrawn", "pending", "withdrawn"),
    _t("exec.started", None, "approved", "running", "exec"),
    _t("files.started", None, "approved", "running", "files"),
    _t("exec.refused", None, "approved running", "refused"),
    _t("exec.cancelled", None, "running", "cancelled", "exec"),
    _t("exec.finished", None, "running cancelled", "ended", "exec"),
    _t("files.finished", None, "running", "ended", "files"),
    # From running/cancelled too: the end record is written after the work, and a journal
    # that dies then loses it (the runner logs runner.audit.unrecorded and returns the
    # outcome, which intake settles).  Every record written *before* an effect is required.
    _t("request.replied", "ok", "running cancelled ended", "finished"),
    _t("request.replied", "error", _OPEN_AFTER_RECEIVED, "failed"),
)

# Journal kinds that do not move a request's lifecycle, and why.
OUTSIDE: Final[Mapping[str, str]] = MappingProxyType(
    {
        "operator.action": "an operator's verb; a cancel's effect is journaled by approval or the runner",
        "approval.promoted": "an attached pending request became a question of its own: still pending",
        "policy.reloaded": "the policy, not a request",
        "policy.rejected": "the policy, not a request",
        "connection.dropped": "a client connection, not a request",
        "service.started": "a service, not a request",
        "service.stopping": "a service, not a request",
        "chain.acknowledged": "the journal's chain, not a request",
        "segment.sealed": "the journal's chain, not a request",
        "segment.opened": "the journal's chain, not a request",
        "segment.deleted": "the journal's chain, not a request",
        "output_log.deleted": "output-log retention, not a request",
        "chain.verified": "the journal's chain, not a request",
    }
)


def _index(rows: tuple[Transition, ...]) -> Mapping[tuple[str, str | None], Transition]:
    by_key: dict[tuple[str, str | None], Transition] = {}
    for row in rows:
        if (row.kind, row.when) in by_key:
            raise ValueError(f"two rows for {row.label}")
        if row.target not in STATES or not row.sources <= set(STATES) - TERMINAL:
            raise ValueError(f"{row.label}: states must be known and sources not terminal")
        if (row.when is None) == (row.kind in SELECTORS):
            raise ValueError(f"{row.label}: a row has a 'when' exactly when its kind has a selector")
        by_key[(row.kind, row.when)] = row
    if set(OUTSIDE) & {kind for kind, _ in by_key}:
        raise ValueError("a kind is both in the lifecycle and outside it")
    return MappingProxyType(by_key)


_BY_KEY: Final = _index(TRANSITIONS)

LIFECYCLE_KINDS: Final = frozenset(row.kind for row in TRANSITIONS)


def transitions_of(kind: str) -> tuple[Transition, ...]:
    """The kind's rows; empty for a kind outside the lifecycle (``OUTSIDE``)."""
    return tuple(row for row in TRANSITIONS if row.kind == kind)


def classified(kind: str) -> bool:
    return kind in LIFECYCLE_KINDS or kind in OUTSIDE


# --- the fold ----------------------------------------------------------------------


class LifecycleError(Exception):
    """The first step of a story the table forbids."""

    def __init__(self, kind: str, seq: Any, state: str, reason: str) -> None:
        self.kind, self.seq, self.state, self.reason = kind, seq, state, reason
        super().__init__(f"seq {seq}: {kind} in state {state}: {reason}")

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "kind": self.kind, "state": self.state, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Story:
    """Where a request's story stands: its state, which work started, the seq of its last lifecycle event."""

    state: str = NEW
    family: str | None = None
    seq: Any = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def settled(self) -> bool:
        return self.state in SETTLED


def _selector(kind: str, payload: Any) -> tuple[str | None, str | None]:
    """(the row's 'when', a reason it has none) for an event of a lifecycle kind."""
    field = SELECTORS.get(kind)
    if field is None:
        return None, None
    value = payload.get(field) if isinstance(payload, Mapping) else None
    if not isinstance(value, str):
        return None, f"its payload has no {field}"
    if (kind, value) not in _BY_KEY:
        return None, f"{field} {value!r} is not in the table"
    return value, None


def step(story: Story, event: Mapping[str, Any]) -> Story:
    """The story after ``event``; raises `LifecycleError` if the table forbids it."""
    kind = event.get("kind")
    seq = event.get("seq")
    if not isinstance(kind, str):
        raise LifecycleError(repr(kind), seq, story.state, "an event without a kind")
    if kind in OUTSIDE:
        return story
    if kind not in LIFECYCLE_KINDS:
        raise LifecycleError(kind, seq, story.state, "a kind the lifecycle does not know")
    when, problem = _selector(kind, event.get("payload"))
    if problem is not None:
        raise LifecycleError(kind, seq, story.state, problem)
    row = _BY_KEY[(kind, when)]
    if story.terminal:
        raise LifecycleError(row.label, seq, story.state, f"after the terminal state {story.state}")
    if story.state not in row.sources:
        allowed = " or ".join(sorted(row.sources))
        raise LifecycleError(row.label, seq, story.state, f"allowed only in {allowed}")
    if row.family is not None and story.family not in (None, row.family):
        raise LifecycleError(row.label, seq, story.state, f"the work started as {story.family}")
    return Story(row.target, row.family or story.family, seq)


def missing_end(story: Story, event: Mapping[str, Any]) -> bool:
    """Is ``event`` intake's ``ok`` reply to work whose end record the journal does not hold?

    Allowed by the table (a journal that restarted between the work's start and
    its end may have lost the record), a violation otherwise: the audit must
    never lose a job's end (issue 29).  The caller knows whether the journal
    restarted in between (a ``service.started`` record of the journal after
    ``story.seq``).
    """
    if event.get("kind") != "request.replied" or story.state not in ("running", "cancelled"):
        return False
    payload = event.get("payload")
    return isinstance(payload, Mapping) and payload.get("status") == "ok"


def fold(events: Iterable[Mapping[str, Any]], story: Story | None = None) -> Story:
    """Fold one request's events (oldest first); raises `LifecycleError` at the first forbidden step."""
    current = story or Story()
    for event in events:
        current = step(current, event)
    return current


def trace(events: Iterable[Mapping[str, Any]]) -> tuple[Story, LifecycleError | None]:
    """Like `fold`, but never raises: the story up to the first forbidden step, and that step."""
    current = Story()
    for event in events:
        try:
            current = step(current, event)
        except LifecycleError as exc:
            return current, exc
    return current, None


# --- a whole journal ---------------------------------------------------------------


def check_journal(events: Iterable[Mapping[str, Any]], *, listed: int = 1000) -> dict[str, Any]:
    """Fold every request of a journal (its events, oldest first) through the table.

    A request is its ID *and* its agent: request IDs are each agent's own (the
    replay guard claims "<uid>:<id>"), so two agents' requests may share one.  A
    record without the uid (a runner refusal before it parsed the spec) goes
    with the ID's only story.  An ok reply with no end record (`missing_end`) is
    a violation, unless the journal restarted in between (its own
    ``service.started``): then it is listed in ``unrecorded_ends``, not held
    against the journal.  ``listed``: violations listed in full; beyond, counted.
    """
    stories: dict[tuple[str, Any], Story] = {}
    operations: dict[tuple[str, Any], Any] = {}
    broken: dict[tuple[str, Any], dict[str, Any]] = {}
    uids: dict[str, list[Any]] = {}
    restarts: list[int] = []  # seqs of the journal's own service.started records
    unrecorded: list[dict[str, Any]] = []
    read = 0
    for event in events:
        read += 1
        seq = event.get("seq")
        if event.get("kind") == "service.started" and event.get("writer") == "journal" and isinstance(seq, int):
            restarts.append(seq)
        request_id = event.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            continue
        uid = event.get("peer_uid")
        known = uids.setdefault(request_id, [])
        if uid is None and len(known) == 1:
            uid = known[0]
        key = (request_id, uid)
        if key in broken:
            continue
        if event.get("kind") in OUTSIDE and key not in stories:
            continue  # e.g. an operator's action naming a request: not a story of its own
        if uid not in known:
            known.append(uid)
        operations.setdefault(key, event.get("operation_id"))
        story = stories.get(key, Story())
        try:
            if missing_end(story, event):
                since = story.seq if isinstance(story.seq, int) else 0
                until = seq if isinstance(seq, int) else 0
                restart = next((r for r in restarts if since < r < until), None)
                if restart is None:
                    raise LifecycleError(
                        "request.replied[ok]",
                        seq,
                        story.state,
                        "intake replied ok but the journal holds no end record of the work (the runner's "
                        "exec.finished); the journal did not restart in between",
                    )
                unrecorded.append({"request_id": request_id, "peer_uid": uid, "seq": seq, "restart": restart})
            stories[key] = step(story, event)
        except LifecycleError as exc:
            broken[key] = {"request_id": request_id, "peer_uid": uid, "operation_id": operations.get(key)} | (
                exc.to_dict()
            )
            stories.pop(key, None)
    states: dict[str, int] = {}
    for kept in stories.values():
        states[kept.state] = states.get(kept.state, 0) + 1
    violations = sorted(broken.values(), key=lambda v: v["seq"] if isinstance(v["seq"], int) else 0)
    return {
        "ok": not violations,
        "events": read,
        "requests": len(stories) + len(broken),
        "states": dict(sorted(states.items())),
        "open": sum(n for state, n in states.items() if state not in TERMINAL),
        "violations": violations[:listed],
        "violation_count": len(violations),
        # Answered ok with no end record, but the journal restarted in between: said, not held against it.
        "unrecorded_ends": unrecorded[:listed],
    }


# --- the table as text (docs/architecture.md prints it; a test compares) -----------


def table_markdown() -> str:
    """The transitions as a Markdown table: one row per (kind, when), its from-states and its to-state."""
    lines = ["| event (payload) | from | to | work |", "|---|---|---|---|"]
    for row in TRANSITIONS:
        sources = ", ".join(f"`{s}`" for s in sorted(row.sources, key=list(STATES).index))
        lines.append(f"| `{row.label}` | {sources} | `{row.target}` | {row.family or ''} |")
    for kind, why in OUTSIDE.items():
        lines.append(f"| `{kind}` | outside the lifecycle: {why} | | |")
    return "\n".join(lines)


def states_markdown() -> str:
    lines = ["| state | meaning | terminal | settled |", "|---|---|---|---|"]
    for name, meaning in STATES.items():
        lines.append(
            f"| `{name}` | {meaning} | {'yes' if name in TERMINAL else ''} | {'yes' if name in SETTLED else ''} |"
        )
    return "\n".join(lines)

"""Operation replay decisions (reference/001), without I/O.

An operation ID names one piece of work across retries.  `OperationTable`
answers ``op.begin``: *new* (run it), *replay* (a settled outcome with the same
digest: return it, run nothing), *conflict* (same ID, another digest) or *in
progress*.  Only settled outcomes are kept — non-zero exits, timeouts and
cancellations included — for ``retention`` seconds from completion.  A replay
does not refresh the expiry.

Each agent has its own share (issue 39): intake keys an operation
``u<uid>:<digest of the ID>`` and the part before the colon is its owner.  An
owner keeps at most ``per_owner`` outcomes, its own oldest out; and the table
at most ``capacity`` in all, where a new operation of an owner that has no
outcome of its own to give up is refused with ``busy``.  Nothing evicts
another owner's unexpired outcome, so one agent's flood cannot make another
agent's retry run again.

Active work lives only in memory: after a restart an operation that was
running is simply unknown, as reference/001 describes.

The store persists settled outcomes and feeds them back with `load`; this
module only decides.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire.journal import OpState

MAX_ID_CHARS: Final = 256
_OWNER = re.compile(r"u[0-9]{1,10}:")


def owner_of(operation_id: str) -> str:
    """Whose operation this is: intake's ``u<uid>:`` prefix (one shared owner for keys without one)."""
    found = _OWNER.match(operation_id)
    return found.group(0) if found else ""


@dataclass(frozen=True, slots=True)
class OpBegin:
    """The answer to ``op.begin``; ``outcome`` is set only for a replay."""

    state: OpState
    outcome: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "outcome": self.outcome}


@dataclass(frozen=True, slots=True)
class Settled:
    """A settled outcome as stored: the outcome is kept as canonical JSON text
    so every replay hands out a fresh copy nobody else can mutate."""

    operation_id: str
    digest: str
    outcome_json: str
    completed_at: float

    def outcome(self) -> dict[str, Any]:
        value = json.loads(self.outcome_json)
        assert isinstance(value, dict)
        return value


def check_id(name: str, value: object) -> str:
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_ID_CHARS:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS, f"{name} must be a string of 1 to {MAX_ID_CHARS} characters", {"field": name}
        )
    return value


class OperationTable:
    """Active operations and settled outcomes, with retention and per-owner capacity."""

    def __init__(
        self, *, retention: float, capacity: int, clock: Callable[[], float], per_owner: int | None = None
    ) -> None:
        if not retention > 0:
            raise ValueError("operation retention must be positive")
        if capacity < 1 or (per_owner is not None and per_owner < 1):
            raise ValueError("operation capacity must be at least 1")
        self.retention = retention
        self.capacity = capacity
        self.per_owner = per_owner if per_owner is not None else capacity
        self._clock = clock
        self._active: dict[str, str] = {}
        # Completion order is eviction order: the first entry is the oldest (overall, and per owner).
        self._settled: OrderedDict[str, Settled] = OrderedDict()
        self._owned: dict[str, OrderedDict[str, None]] = {}
        # Keys evicted from memory, for the store to delete from its table with its next settle.
        self.evicted: list[str] = []

    def load(self, entries: Iterable[Settled]) -> None:
        """Take stored outcomes, oldest first, dropping expired and excess ones."""
        for entry in entries:
            self._remove(entry.operation_id)
            self._add(entry)
        self._expire()
        for keys in list(self._owned.values()):
            while len(keys) > self.per_owner:
                self._remove(next(iter(keys)), evicted=True)
        while len(self._settled) > self.capacity:  # a smaller capacity than the stored table's
            self._remove(next(iter(self._settled)), evicted=True)

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)

    def __len__(self) -> int:
        return len(self._settled)

    def owned(self, owner: str) -> int:
        """Settled outcomes ``owner`` has in the table (expired ones until they are pruned)."""
        return len(self._owned.get(owner, ()))

    def begin(self, operation_id: str, digest: str, *, has_protected: bool = False) -> OpBegin:
        check_id("operation_id", operation_id)
        check_id("digest", digest)
        settled = self._lookup(operation_id)
        if settled is not None:
            if settled.digest != digest:
                raise _conflict(operation_id)
            if has_protected:
                # Protected values are one-shot: a retry that sends them again
                # must not get a replay that looks like they were used again.
                raise AirlockError(
                    ErrorCode.PROTECTED_REDELIVERY_FORBIDDEN,
                    f"operation {operation_id!r} already completed; protected values cannot be delivered again",
                    {"operation_id": operation_id},
                )
            return OpBegin(OpState.REPLAY, settled.outcome())
        running = self._active.get(operation_id)
        if running is not None:
            if running != digest:
                raise _conflict(operation_id)
            raise AirlockError(
                ErrorCode.OPERATION_IN_PROGRESS,
                f"operation {operation_id!r} is in progress",
                {"operation_id": operation_id},
            )
        self.check_room(operation_id)
        self._active[operation_id] = digest
        return OpBegin(OpState.NEW)

    def check_room(self, operation_id: str) -> None:
        """Raises ``busy`` when the table is full and the owner has no outcome of its own to give up:
        new work is refused rather than another agent's outcome evicted (its retry would run again).
        A settled or running operation (a replay, a conflict) always has room."""
        if len(self._settled) + len(self._active) < self.capacity:
            return
        if operation_id in self._active or self._lookup(operation_id) is not None:
            return
        self._expire()
        if len(self._settled) + len(self._active) >= self.capacity and not self.owned(owner_of(operation_id)):
            raise AirlockError(
                ErrorCode.BUSY,
                f"the replay store is full ({self.capacity} operations kept for "
                f"{self.retention:g} s); retry when older outcomes expire",
                {"capacity": self.capacity},
            )

    def check_complete(self, operation_id: str, digest: str) -> bool:
        """May this outcome be stored?  False: it already is (a repeated
        completion is harmless).  Raises a conflict for another digest."""
        check_id("operation_id", operation_id)
        check_id("digest", digest)
        running = self._active.get(operation_id)
        if running is not None and running != digest:
            raise _conflict(operation_id)
        settled = self._lookup(operation_id)
        if settled is not None:
            if settled.digest != digest:
                raise _conflict(operation_id)
            return False
        return True

    def settle(self, entry: Settled) -> None:
        """Record a durable outcome and end the operation's active state."""
        self._active.pop(entry.operation_id, None)
        self._remove(entry.operation_id)
        self._add(entry)
        self._expire()
        self._trim(owner_of(entry.operation_id))

    def abandon(self, operation_id: str) -> None:
        """End an operation without an outcome: a retry may run it again."""
        self._active.pop(operation_id, None)

    def expiry_cutoff(self) -> float:
        """Outcomes completed at or before this time have expired."""
        return self._clock() - self.retention

    def take_evicted(self) -> list[str]:
        """Keys evicted from memory so far, to delete from the stored table."""
        taken, self.evicted = self.evicted, []
        return taken

    def planned_evictions(self, settling: Iterable[Settled]) -> list[str]:
        """Keys that storing ``settling`` will evict past their owner's share: deleted from the stored
        table in the same transaction, so the table and memory agree at once."""
        taken: list[str] = []
        adding: dict[str, int] = {}
        for entry in settling:
            if entry.operation_id not in self._settled:
                owner = owner_of(entry.operation_id)
                adding[owner] = adding.get(owner, 0) + 1
        for owner, count in adding.items():
            keys = self._owned.get(owner, OrderedDict())
            excess = len(keys) + count - self.per_owner
            if excess > 0:
                taken.extend(list(keys)[:excess])
        return taken

    def _add(self, entry: Settled) -> None:
        self._settled[entry.operation_id] = entry
        self._owned.setdefault(owner_of(entry.operation_id), OrderedDict())[entry.operation_id] = None

    def _remove(self, operation_id: str, *, evicted: bool = False) -> None:
        if self._settled.pop(operation_id, None) is None:
            return
        owner = owner_of(operation_id)
        keys = self._owned.get(owner)
        if keys is not None:
            keys.pop(operation_id, None)
            if not keys:
                del self._owned[owner]
        if evicted:
            self.evicted.append(operation_id)

    def _trim(self, owner: str) -> None:
        """The owner's own oldest out: past its share, or (while the table is over capacity) to make room.

        Over capacity the owner gives up its own outcomes only, down to the one
        just stored; the table may then exceed ``capacity`` by
        the operations that were in flight when it filled, never by more.
        """
        keys = self._owned.get(owner)
        while keys and (len(keys) > self.per_owner or (len(self._settled) > self.capacity and len(keys) > 1)):
            self._remove(next(iter(keys)), evicted=True)
            keys = self._owned.get(owner)

    def _lookup(self, operation_id: str) -> Settled | None:
        entry = self._settled.get(operation_id)
        if entry is not None and entry.completed_at <= self.expiry_cutoff():
            self._remove(operation_id)
            return None
        return entry

    def _expire(self) -> None:
        cutoff = self.expiry_cutoff()
        # Completion order: the expired ones are at the front.
        while self._settled:
            first = next(iter(self._settled.values()))
            if first.completed_at > cutoff:
                break
            self._remove(first.operation_id)


def _conflict(operation_id: str) -> AirlockError:
    return AirlockError(
        ErrorCode.OPERATION_ID_CONFLICT,
        f"operation {operation_id!r} was already used for a different request",
        {"operation_id": operation_id},
    )

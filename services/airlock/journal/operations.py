"""Operation replay decisions (reference/001), without I/O.

An operation ID names one piece of work across retries.  `OperationTable`
answers ``op.begin``: *new* (run it), *replay* (a settled outcome with the same
digest: return it, run nothing), *conflict* (same ID, another digest) or *in
progress*.  Only settled outcomes are kept — non-zero exits, timeouts and
cancellations included — for ``retention`` seconds from completion and at most
``capacity`` of them, oldest out.  A replay does not refresh the expiry.
Active work lives only in memory: after a restart an operation that was
running is simply unknown, as reference/001 describes.

The store persists settled outcomes and feeds them back with `load`; this
module only decides.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

from airlock.common.errors import AirlockError, ErrorCode

MAX_ID_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class OpBegin:
    """The answer to ``op.begin``; ``outcome`` is set only for a replay."""

    state: Literal["new", "replay"]
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
    """Active operations and settled outcomes, with retention and capacity."""

    def __init__(self, *, retention: float, capacity: int, clock: Callable[[], float]) -> None:
        if not retention > 0:
            raise ValueError("operation retention must be positive")
        if capacity < 1:
            raise ValueError("operation capacity must be at least 1")
        self.retention = retention
        self.capacity = capacity
        self._clock = clock
        self._active: dict[str, str] = {}
        # Completion order is eviction order: the first entry is the oldest.
        self._settled: OrderedDict[str, Settled] = OrderedDict()

    def load(self, entries: Iterable[Settled]) -> None:
        """Take stored outcomes, oldest first, dropping expired and excess ones."""
        for entry in entries:
            self._settled.pop(entry.operation_id, None)
            self._settled[entry.operation_id] = entry
        self._prune()

    @property
    def active(self) -> frozenset[str]:
        return frozenset(self._active)

    def __len__(self) -> int:
        return len(self._settled)

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
            return OpBegin("replay", settled.outcome())
        running = self._active.get(operation_id)
        if running is not None:
            if running != digest:
                raise _conflict(operation_id)
            raise AirlockError(
                ErrorCode.OPERATION_IN_PROGRESS,
                f"operation {operation_id!r} is in progress",
                {"operation_id": operation_id},
            )
        self._active[operation_id] = digest
        return OpBegin("new")

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
        self._settled.pop(entry.operation_id, None)
        self._settled[entry.operation_id] = entry
        self._prune()

    def abandon(self, operation_id: str) -> None:
        """End an operation without an outcome: a retry may run it again."""
        self._active.pop(operation_id, None)

    def expiry_cutoff(self) -> float:
        """Outcomes completed at or before this time have expired."""
        return self._clock() - self.retention

    def _lookup(self, operation_id: str) -> Settled | None:
        entry = self._settled.get(operation_id)
        if entry is not None and entry.completed_at <= self.expiry_cutoff():
            del self._settled[operation_id]
            return None
        return entry

    def _prune(self) -> None:
        cutoff = self.expiry_cutoff()
        for operation_id in [k for k, v in self._settled.items() if v.completed_at <= cutoff]:
            del self._settled[operation_id]
        while len(self._settled) > self.capacity:
            self._settled.popitem(last=False)


def _conflict(operation_id: str) -> AirlockError:
    return AirlockError(
        ErrorCode.OPERATION_ID_CONFLICT,
        f"operation {operation_id!r} was already used for a different request",
        {"operation_id": operation_id},
    )

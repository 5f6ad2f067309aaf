"""How a pending request may end: one transition table, consulted on every settlement (issue 47).

Pure: no I/O.  In the spirit of h11's ``_state.py``: a request is `State.PENDING` until exactly one
event (`Decided`) moves it to a terminal state; `move` looks the pair up in `MOVES` and raises
`IllegalMove`, naming the event and the state, for anything else -- a second decision of a decided
request is a bug, never a silent overwrite.  `approval/table.PendingTable.settle` is the only caller;
the SPIN model (model/airlock.pml) tags its own transitions with these names, and a test holds the two
to each other.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from airlock.approval.verdict import Decided


class State(enum.StrEnum):
    PENDING = "pending"
    ALLOWED = "allowed"
    DENIED = "denied"
    TIMED_OUT = "timed out"
    WITHDRAWN = "withdrawn"
    INTERRUPTED = "interrupted"


MOVES: Final[Mapping[tuple[State, Decided], State]] = MappingProxyType(
    {
        (State.PENDING, Decided.ALLOW): State.ALLOWED,  # a person (or a quorum, a release) approved
        (State.PENDING, Decided.DENY): State.DENIED,  # a person denied, or an operator cancelled it
        (State.PENDING, Decided.TIMEOUT): State.TIMED_OUT,  # nobody decided in approval.timeout_seconds
        (State.PENDING, Decided.WITHDRAWN): State.WITHDRAWN,  # its agent cancelled or went away
        (State.PENDING, Decided.INTERRUPTED): State.INTERRUPTED,  # approval stopped meanwhile
    }
)

# A decision that an attached identical request (issue 34) shares with its leader; any other end
# leaves the followers waiting, and the oldest becomes a question of its own.
SHARED: Final = frozenset({Decided.ALLOW, Decided.DENY})


class IllegalMove(Exception):
    """A settlement the table does not allow: the event and the state it met, named."""

    def __init__(self, event: Decided, state: State) -> None:
        super().__init__(f"cannot settle a request that is {state.value} with {event.value!r}")
        self.event, self.state = event, state


@dataclasses.dataclass(frozen=True, slots=True)
class Outcome:
    """How a pending request ended, and who or what ended it."""

    decided: Decided
    by: str
    operator_uid: int | None = None
    reason: str = ""

    def __post_init__(self) -> None:
        if self.decided is Decided.ASK:
            raise ValueError("ask is not an outcome: the request is still pending")


def move(state: State, event: Decided) -> State:
    """The state ``event`` moves a request in ``state`` to (`MOVES`), or `IllegalMove`."""
    try:
        return MOVES[(state, event)]
    except KeyError:
        raise IllegalMove(event, state) from None

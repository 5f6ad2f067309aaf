"""One channel's waiting messages: a FIFO per requester uid, served round-robin.

Pure: no I/O.  The relay reads the events feed ahead of what it has delivered and
files each message under the uid of the agent whose request it is about, so
one agent's burst waits behind every other agent's next message instead of in
front of it (issue 28).  Within one agent's lane the order is the journal's.

A request that settles before its ``pending`` message went out needs no
"please decide" any more: the outcome takes the pending message's place in
its lane, carrying its details (collapsed), and a request the agent withdrew
before anyone was told is dropped with its outcome (nobody has anything to
do).  Every item names the event seqs it stands for, so the relay's cursor
passes them once it is delivered or dropped.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

Lane = int | None  # the requester's uid (None: an event without one)


@dataclass
class Item:
    """One message waiting for its channel, and the events it stands for."""

    message: dict[str, Any]
    seqs: list[int]
    lane: Lane
    request_id: str | None
    kind: str  # the message's event: pending, decided
    superseded: bool = False  # in flight when its request settled (or its journal went): stop retrying it
    generation: int = 0  # which journal the relay followed when it was read (see Worker._journal_replaced)
    details: dict[str, Any] | None = field(default=None, repr=False)  # a pending message, for its outcome


class FairQueue:
    """The channel's queue: lanes per requester uid, taken in turn."""

    def __init__(self) -> None:
        self.lanes: collections.OrderedDict[Lane, collections.deque[Item]] = collections.OrderedDict()
        self.waiting: dict[str, Item] = {}  # request ID -> its pending item, queued or in flight
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def push(self, item: Item) -> None:
        self.lanes.setdefault(item.lane, collections.deque()).append(item)
        self.count += 1
        if item.kind == "pending" and item.request_id is not None:
            self.waiting[item.request_id] = item

    def settle(self, request_id: str, withdrawn: bool) -> Item | None:
        """The request settled: its pending item, if not yet delivered (None: it was, or never queued).

        The pending item leaves its lane; the caller queues the outcome with
        its details (or, for a withdrawn request, drops both).  An item in
        flight is marked superseded instead: the sender gives it up.
        """
        item = self.waiting.pop(request_id, None)
        if item is None:
            return None
        lane = self.lanes.get(item.lane)
        if lane is not None and item in lane:
            index = lane.index(item)
            del lane[index]
            self.count -= 1
            if not lane:
                del self.lanes[item.lane]
        else:
            item.superseded = True  # in flight
        return item

    def delivered(self, item: Item) -> None:
        """The item went out (or was given up): its request is no longer waiting to be told."""
        if item.request_id is not None and self.waiting.get(item.request_id) is item:
            del self.waiting[item.request_id]

    def pop(self, *, kind: str | None = None) -> Item | None:
        """The next item in turn (only lanes whose head is of ``kind``, when given)."""
        for lane, items in self.lanes.items():
            if kind is not None and items[0].kind != kind:
                continue
            item = items.popleft()
            self.count -= 1
            if items:
                self.lanes.move_to_end(lane)  # this lane had its turn
            else:
                del self.lanes[lane]
            return item
        return None

    def seqs(self) -> list[int]:
        return [seq for items in self.lanes.values() for item in items for seq in item.seqs]

"""The relay's per-channel queue: agents served in turn, settled requests collapsed (issue 28)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airlock.relay import cursor
from airlock.relay.queue import FairQueue, Item


def _item(uid: int, seq: int, kind: str = "pending", request_id: str | None = None) -> Item:
    rid = request_id or f"r{seq}"
    return Item({"event": kind, "seq": seq, "request_id": rid}, [seq], uid, rid, kind)


def test_one_agents_burst_does_not_push_another_back() -> None:
    q = FairQueue()
    for seq in range(1, 101):
        q.push(_item(1000, seq))  # the flood, read first
    q.push(_item(2000, 101))  # the victim's one request, after it
    first = [q.pop() for _ in range(3)]
    assert [i.lane for i in first if i] == [1000, 2000, 1000]
    assert len(q) == 98


def test_within_one_agent_the_journal_order_holds() -> None:
    q = FairQueue()
    for seq, uid in ((1, 1), (2, 2), (3, 1), (4, 2), (5, 1)):
        q.push(_item(uid, seq))
    order = []
    while (item := q.pop()) is not None:
        order.append((item.lane, item.seqs[0]))
    assert [s for u, s in order if u == 1] == [1, 3, 5] and [s for u, s in order if u == 2] == [2, 4]


def test_a_request_that_settled_before_delivery_leaves_the_queue() -> None:
    q = FairQueue()
    q.push(_item(1, 1, request_id="a"))
    q.push(_item(1, 2, request_id="b"))
    settled = q.settle("a", withdrawn=True)
    assert settled is not None and settled.seqs == [1] and len(q) == 1
    assert q.settle("a", withdrawn=True) is None  # once
    assert q.settle("never-queued", withdrawn=False) is None
    nxt = q.pop()
    assert nxt is not None and nxt.request_id == "b"


def test_a_request_settled_while_its_message_is_in_flight_is_superseded() -> None:
    q = FairQueue()
    q.push(_item(1, 1, request_id="a"))
    flying = q.pop()
    assert flying is not None and not flying.superseded
    assert q.settle("a", withdrawn=False) is flying and flying.superseded
    q.push(_item(1, 2, request_id="b"))
    delivered = q.pop()
    assert delivered is not None
    q.delivered(delivered)
    assert q.settle("b", withdrawn=False) is None  # told already: its outcome goes as a follow-up


def test_digest_takes_only_pending_heads() -> None:
    q = FairQueue()
    q.push(_item(1, 1, kind="decided"))
    q.push(_item(2, 2))
    got = q.pop(kind="pending")
    assert got is not None and got.lane == 2
    assert q.pop(kind="pending") is None and len(q) == 1


def test_a_cursor_names_its_journal_and_what_was_delivered_past_it(tmp_path: Path) -> None:
    path = cursor.path_for(tmp_path, "hook")
    cursor.save(path, cursor.Cursor(5, "b" * 64, frozenset({3, 7, 9})))
    raw = json.loads(path.read_text())
    assert raw == {"seq": 5, "journal": "b" * 64, "done": [7, 9], "delivered": None, "delivered_at": None}
    path.write_text('{"seq": 4}')  # a cursor from before issue 28: no journal yet
    assert cursor.load(path) == cursor.Cursor(4)
    for bad in ('{"seq": 4, "journal": "x"}', '{"seq": 4, "done": [-1]}', '{"seq": true}'):
        path.write_text(bad)
        with pytest.raises(cursor.CursorError):
            cursor.load(path)

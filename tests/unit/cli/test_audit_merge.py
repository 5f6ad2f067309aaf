"""`airlock audit verify` over several batches of anchors: one answer, the lowest bad seq."""

from __future__ import annotations

from typing import Any

from airlock.cli.audit import BATCH, _batch, _batches, merge, render
from airlock.journal.chain import Anchor


def _answer(ok: bool, bad: int | None = None, checked: int = 0, acknowledged: int = 0) -> dict[str, Any]:
    return {
        "ok": ok,
        "first_bad_seq": bad,
        "reason": None if ok else f"bad at {bad}",
        "checked": 10,
        "head_seq": 10,
        "head_hash": "0" * 64,
        "segments": [],
        "anchors": {"ok": ok, "checked": checked, "acknowledged": acknowledged, "given": checked + acknowledged},
    }


def test_merge_keeps_the_lowest_bad_seq_and_sums_the_counts() -> None:
    merged = merge(
        [_answer(True, checked=3), _answer(False, 9, checked=2), _answer(False, 4, checked=1, acknowledged=5)]
    )
    assert (merged["ok"], merged["first_bad_seq"], merged["reason"]) == (False, 4, "bad at 4")
    assert merged["anchors"]["checked"] == 6 and merged["anchors"]["acknowledged"] == 5
    assert merge([_answer(True, checked=1), _answer(True, checked=1)])["ok"] is True


def test_every_batch_carries_the_ack_anchors() -> None:
    found = [Anchor(i, f"{i:064x}") for i in range(1, 2 * BATCH + 2)] + [Anchor(99_999, "a" * 64, ack=True)]
    assert _batches(found) == 3
    batches = [_batch(found, n) for n in range(3)]
    assert all(b[0] == {"seq": 99_999, "hash": "a" * 64, "ack": True} for b in batches)
    assert sum(len(b) - 1 for b in batches) == 2 * BATCH + 1


def test_render_names_the_first_bad_record_and_the_segments() -> None:
    data = _answer(False, 4) | {
        "segments": [
            {"seq": 12, "operator": "alice", "reason": "restored\x1b[2J", "previous_seq": 7, "confirmed": False}
        ]
    }
    data["anchors"]["source"] = "journald"
    text = render(data)
    assert text.startswith("FAILED at record 4: bad at 4")
    assert "segment: from seq 12, acknowledged by alice: restored\\x1b[2J (previous head 7)" in text
    assert "[no ack anchor in this source]" in text


def test_verify_full_says_sealed_plus_live_and_the_total() -> None:
    """Issue 44: `--full` printed the live segment's count as if it were all."""
    data = _answer(True) | {"checked": 112, "mode": "full", "anchors": {"source": "none"}}
    data["full"] = {"ok": True, "segments": 3, "checked": 812, "live": {"ok": True, "checked": 112}, "deleted": []}
    first = render(data).splitlines()[0]
    assert first.startswith(
        "ok: 812 record(s) verified in all: 700 in 3 sealed segment file(s) + 112 in the live segment; head 10"
    ), first
    assert render(_answer(True)).startswith("ok: 10 record(s) verified; head 10")  # without --full, as before

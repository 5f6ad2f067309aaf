"""The pure anchor logic: parsing anchor lines, judging a database against anchors, acknowledged gaps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airlock.journal.chain import (
    ACK_KIND,
    GENESIS,
    Anchor,
    check_anchors,
    compute_hash,
    parse_anchor_lines,
    verify_rows,
)

H = [f"{i:064x}" for i in range(20)]  # stand-in hashes: hash of record i is H[i]


def check(
    anchors: list[Anchor],
    *,
    head: int = 10,
    high: int | None = None,
    stored: dict[int, str] | None = None,
    acks: dict[int, str] | None = None,
    before: dict[int, int] | None = None,
) -> Any:
    stored = {i: H[i] for i in range(1, head + 1)} if stored is None else stored
    return check_anchors(
        anchors, stored=stored, head_seq=head, high_water=head if high is None else high, acks=acks or {}, before=before
    )


def test_matching_anchors_are_ok() -> None:
    result = check([Anchor(1, H[1]), Anchor(5, H[5]), Anchor(10, H[10]), Anchor(10, H[10])])
    assert result.ok and result.checked == 3 and result.first_bad_seq is None  # duplicates count once


def test_no_anchors_checks_only_the_high_water_mark() -> None:
    assert check([]).ok
    cut = check([], head=7, high=10)
    assert not cut.ok and cut.first_bad_seq == 8 and "8 to 10" in str(cut.reason)


def test_truncation_is_the_first_missing_seq() -> None:
    # Rows 8..10 deleted and the high-water mark lowered too: only the anchor shows it.
    result = check([Anchor(5, H[5]), Anchor(10, H[10])], head=7)
    assert not result.ok and result.first_bad_seq == 8
    assert "ends at seq 7" in str(result.reason)


def test_rewrite_with_rehash_names_the_anchored_seq() -> None:
    stored = {i: H[i] for i in range(1, 11)} | {6: "a" * 64, 7: "b" * 64, 8: "c" * 64, 9: "d" * 64, 10: "e" * 64}
    result = check([Anchor(5, H[5]), Anchor(8, H[8]), Anchor(10, H[10])], stored=stored)
    assert not result.ok and result.first_bad_seq == 8
    assert "after seq 5" in str(result.reason)


def test_cut_and_rewritten_with_the_same_numbers() -> None:
    # Cut at 5, then new records reusing 6..10: the head is where it was, the hashes are not.
    stored = {i: H[i] for i in range(1, 6)} | {i: "f" * 64 for i in range(6, 11)}
    result = check([Anchor(10, H[10])], stored=stored)
    assert not result.ok and result.first_bad_seq == 10


def test_missing_anchored_record() -> None:
    stored = {i: H[i] for i in range(1, 11) if i != 4}
    result = check([Anchor(4, H[4])], stored=stored)
    assert not result.ok and result.first_bad_seq == 4 and "missing" in str(result.reason)


def test_a_confirmed_acknowledgement_excuses_older_anchors() -> None:
    # Cut after 7, acknowledged at 11: the anchor at 10 no longer counts, the later ones do.
    stored = {i: H[i] for i in range(1, 8)} | {11: H[11], 12: H[12]}
    anchors = [Anchor(5, H[5]), Anchor(10, H[10]), Anchor(11, H[11], ack=True), Anchor(12, H[12])]
    result = check(anchors, head=12, stored=stored, acks={11: H[11]})
    assert result.ok and result.acknowledged == 2 and result.checked == 2


def test_an_acknowledgement_without_its_ack_anchor_excuses_nothing() -> None:
    stored = {i: H[i] for i in range(1, 8)} | {11: H[11]}
    anchors = [Anchor(10, H[10]), Anchor(11, H[11])]  # the anchor at 11 is not marked ack
    result = check(anchors, head=11, stored=stored, acks={11: H[11]})
    assert not result.ok and result.first_bad_seq == 10


def test_an_ack_anchor_with_another_hash_excuses_nothing() -> None:
    stored = {i: H[i] for i in range(1, 8)} | {11: H[11]}
    anchors = [Anchor(10, H[10]), Anchor(11, H[12], ack=True)]
    result = check(anchors, head=11, stored=stored, acks={11: H[11]})
    assert not result.ok and result.first_bad_seq == 10


def test_anchors_after_an_acknowledgement_still_count() -> None:
    stored = {i: H[i] for i in range(1, 8)} | {11: H[11], 12: "9" * 64}
    anchors = [Anchor(10, H[10]), Anchor(11, H[11], ack=True), Anchor(12, H[12])]
    result = check(anchors, head=12, stored=stored, acks={11: H[11]})
    assert not result.ok and result.first_bad_seq == 12


@pytest.mark.parametrize(
    "bad",
    [
        {"seq": 0, "hash": H[1]},
        {"seq": True, "hash": H[1]},
        {"seq": 3, "hash": "xyz"},
        {"seq": "3", "hash": H[1]},
        {"seq": 3, "hash": H[1], "ack": "yes"},
        [3, H[1]],
    ],
)
def test_malformed_anchor_lines_are_counted_not_trusted(bad: object) -> None:
    text = json.dumps({"seq": 1, "hash": H[1]}) + "\n" + json.dumps(bad) + "\nnot json\n"
    anchors, unreadable = parse_anchor_lines(text)
    assert anchors == [Anchor(1, H[1])] and unreadable == 2


def test_a_torn_last_line_is_neither_anchor_nor_unreadable() -> None:
    text = json.dumps({"seq": 1, "hash": H[1], "ack": True}) + "\n" + '{"seq": 2, "ha'
    assert parse_anchor_lines(text) == ([Anchor(1, H[1], ack=True)], 0)


# -- verify_rows: the one gap it accepts ------------------------------------


def _row(seq: int, prev: str, kind: str = "request.received") -> dict[str, Any]:
    record = {
        "seq": seq,
        "time": "2026-12-03T00:00:00.000Z",
        "kind": kind,
        "request_id": None,
        "operation_id": None,
        "peer_uid": 0,
        "session": None,
        "writer": "journal",
        "payload": {"n": seq},
        "prev_hash": prev,
    }
    record["hash"] = compute_hash(record)
    return record


def _chain(seqs: list[int], kinds: dict[int, str] | None = None) -> list[dict[str, Any]]:
    rows, prev = [], GENESIS
    for seq in seqs:
        row = _row(seq, prev, (kinds or {}).get(seq, "request.received"))
        rows.append(row)
        prev = row["hash"]
    return rows


def test_an_acknowledgement_may_follow_a_gap() -> None:
    result = verify_rows(_chain([1, 2, 3, 11, 12], {11: ACK_KIND}))
    assert result.ok and result.head_seq == 12 and result.checked == 5


def test_any_other_record_after_a_gap_is_a_missing_seq() -> None:
    result = verify_rows(_chain([1, 2, 3, 11, 12]))
    assert not result.ok and result.first_bad_seq == 4


def test_an_acknowledgement_must_still_link_to_the_record_before_it() -> None:
    rows = _chain([1, 2, 3])
    forged = _row(11, "7" * 64, ACK_KIND)
    result = verify_rows([*rows, forged])
    assert not result.ok and result.first_bad_seq == 11


def test_a_missing_anchored_record_is_reported_from_the_start_of_its_gap() -> None:
    stored = {i: H[i] for i in (1, 2, 3, 9, 10)}
    result = check([Anchor(6, H[6])], stored=stored, before={6: 3})
    assert not result.ok and result.first_bad_seq == 4


def test_an_ack_anchor_of_another_database_is_not_compared() -> None:
    # A stray ack anchor (another journal's, on the same host) confirms nothing and accuses nothing.
    result = check([Anchor(5, H[5]), Anchor(7, "c" * 64, ack=True)], acks={})
    assert result.ok and result.checked == 1

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.common.codec import canonical_json
from airlock.journal.chain import GENESIS, compute_hash, verify_rows


def make_chain(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    prev: str = GENESIS
    for seq, payload in enumerate(payloads, start=1):
        record: dict[str, Any] = {
            "seq": seq,
            "time": "2026-12-02T12:00:00.000Z",
            "kind": "request.received",
            "request_id": f"r{seq}",
            "operation_id": None,
            "peer_uid": 1000,
            "session": None,
            "writer": "intake",
            "payload": payload,
            "prev_hash": prev,
        }
        record["hash"] = compute_hash(record)
        rows.append(record)
        prev = record["hash"]
    return rows


def test_empty_chain_is_ok() -> None:
    result = verify_rows([])
    assert result.ok and result.checked == 0 and (result.head_seq, result.head_hash) == (0, GENESIS)


def test_good_chain() -> None:
    rows = make_chain([{"i": i} for i in range(10)])
    result = verify_rows(rows)
    assert result.ok and result.checked == 10
    assert (result.head_seq, result.head_hash) == (10, rows[-1]["hash"])


def test_hash_covers_prev_hash_and_is_sha256_hex() -> None:
    rows = make_chain([{"a": 1}])
    assert len(rows[0]["hash"]) == 64
    other = dict(rows[0], prev_hash="1" * 64)
    assert compute_hash(other) != rows[0]["hash"]


def test_edited_payload() -> None:
    rows = make_chain([{"i": i} for i in range(6)])
    rows[3]["payload"] = {"i": 99}
    result = verify_rows(rows)
    assert (result.ok, result.first_bad_seq, result.head_seq) == (False, 4, 3)
    assert "content" in (result.reason or "")


def test_deleted_row() -> None:
    rows = make_chain([{"i": i} for i in range(6)])
    del rows[2]
    result = verify_rows(rows)
    assert (result.ok, result.first_bad_seq) == (False, 3)
    assert "missing" in (result.reason or "")


def test_deleted_first_row() -> None:
    result = verify_rows(make_chain([{"i": i} for i in range(3)])[1:])
    assert (result.ok, result.first_bad_seq) == (False, 1)


def test_deleted_and_renumbered() -> None:
    rows = make_chain([{"i": i} for i in range(6)])
    del rows[2]
    for seq, row in enumerate(rows, start=1):
        row["seq"] = seq
    result = verify_rows(rows)
    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_reordered_rows() -> None:
    rows = make_chain([{"i": i} for i in range(6)])
    rows[2], rows[3] = rows[3], rows[2]
    result = verify_rows(rows)
    assert (result.ok, result.first_bad_seq) == (False, 3)


def test_non_canonical_payload_text() -> None:
    rows = make_chain([{"a": 1, "b": 2}])
    stored = dict(rows[0], payload=canonical_json({"a": 1, "b": 2}).decode())
    assert verify_rows([stored]).ok
    spaced = dict(rows[0], payload='{"a": 1, "b": 2}')
    result = verify_rows([spaced])
    assert (result.ok, result.first_bad_seq) == (False, 1)
    assert verify_rows([dict(rows[0], payload="{not json")]).first_bad_seq == 1


def test_from_seq_and_anchor() -> None:
    rows = make_chain([{"i": i} for i in range(8)])
    assert verify_rows(rows[4:], from_seq=5).ok
    assert verify_rows(rows[4:], from_seq=5, anchor=rows[4]["hash"]).ok
    bad = verify_rows(rows[4:], from_seq=5, anchor=rows[3]["hash"])
    assert (bad.ok, bad.first_bad_seq) == (False, 5)
    # The rows were rewritten from seq 5 on, consistently: only the anchor notices.
    forged = make_chain([{"i": i} for i in range(4)] + [{"i": -1}] + [{"i": i} for i in range(5, 8)])
    assert verify_rows(forged).ok
    assert not verify_rows(forged[4:], from_seq=5, anchor=rows[4]["hash"]).ok
    # Cut short before the anchor.
    cut = verify_rows([], from_seq=9, anchor=rows[7]["hash"])
    assert (cut.ok, cut.first_bad_seq) == (False, 9)
    with pytest.raises(ValueError, match="an anchor needs from_seq"):
        verify_rows(rows, anchor=rows[0]["hash"])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
FIELDS = ["time", "kind", "request_id", "operation_id", "peer_uid", "session", "writer", "payload", "prev_hash"]


@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(st.dictionaries(st.text(max_size=5), json_values, max_size=3), min_size=1, max_size=8),
    data=st.data(),
)
def test_any_single_field_edit_names_its_row(payloads: list[dict[str, Any]], data: st.DataObject) -> None:
    rows = make_chain(payloads)
    assert verify_rows(rows).ok
    index = data.draw(st.integers(0, len(rows) - 1))
    field = data.draw(st.sampled_from(FIELDS))
    original = rows[index][field]
    replacement = {
        "payload": {"tampered": True},
        "peer_uid": 0,
        "prev_hash": "f" * 64,
    }.get(field, "tampered")
    if replacement == original:
        return
    rows[index][field] = replacement
    result = verify_rows(rows)
    assert (result.ok, result.first_bad_seq) == (False, index + 1)


def test_the_hash_with_the_payload_text_spliced_in_is_the_records_hash() -> None:
    """The store hashes with the payload's canonical text spliced in (issue 21: encoded once): same bytes."""
    from airlock.common.codec import canonical_json
    from airlock.journal import chain as ch

    tricky = {"a": 'x"payload":null', "payload": None, "z": [1, 2.5, "é", {"payload": "null"}]}
    for kind in ("exec.started", 'k"payload":null'):
        record = {
            "seq": 7,
            "time": "2026-12-03T09:00:00.000Z",
            "kind": kind,
            "request_id": '"payload":null',
            "operation_id": None,
            "peer_uid": 1000,
            "session": None,
            "writer": "runner",
            "payload": tricky,
            "prev_hash": "0" * 64,
        }
        assert ch.compute_hash_with(record, canonical_json(tricky).decode()) == ch.compute_hash(record)

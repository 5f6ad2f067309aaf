"""The fast chain walk (`fastwalk.verify_stored`) gives exactly the reference's answer (`chain.verify_rows`).

Stored rows are tuples in `STORED_COLUMNS` order with the payload as text,
as the journal's SELECT returns them.  Hypothesis builds good chains, then
tampers with them every way a row can go wrong -- fields of other types,
strings that need escaping, payload texts that mean the same but are not
canonical (with the hash left, or recomputed over the text as a forger
would), deleted, swapped and renumbered rows -- and the two must agree on
everything: ok, checked, first bad seq, reason and head.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airlock.common.codec import canonical_json
from airlock.journal.chain import ACK_KIND, GENESIS, compute_hash, verify_rows
from airlock.journal.fastwalk import STORED_COLUMNS, verify_stored

TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    ['a"b', "back\\slash", "new\nline", "tab\t", "\x00nul", "\u2028", "é", "\x7f", "</script>"]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
PAYLOAD = st.dictionaries(TEXT, JSON, max_size=4)
OPTIONAL_TEXT = st.none() | TEXT


@st.composite
def chains(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    n = draw(st.integers(0, 12))
    rows: list[tuple[Any, ...]] = []
    prev = GENESIS
    for seq in range(1, n + 1):
        record = {
            "seq": seq,
            "time": draw(st.sampled_from(["2026-12-03T10:00:00.000Z", "t\u00e9"])),
            "kind": draw(st.sampled_from(["request.received", "exec.finished", ACK_KIND, 'we"ird'])),
            "request_id": draw(OPTIONAL_TEXT),
            "operation_id": draw(OPTIONAL_TEXT),
            "peer_uid": draw(st.none() | st.integers(0, 2**40)),
            "session": draw(OPTIONAL_TEXT),
            "writer": draw(st.sampled_from(["intake", "runner", "journal"])),
            "payload": draw(PAYLOAD),
            "prev_hash": prev,
        }
        digest = compute_hash(record)
        rows.append(_stored(record, canonical_json(record["payload"]).decode(), digest))
        prev = digest
    return rows


def _stored(record: dict[str, Any], text: str, digest: str) -> tuple[Any, ...]:
    return tuple(text if name == "payload" else digest if name == "hash" else record[name] for name in STORED_COLUMNS)


def _splice_hash(row: list[Any]) -> str:
    """The hash a forger computes over the stored text as it is (not over its canonical form)."""
    fields = dict(zip(STORED_COLUMNS, row, strict=True))
    skeleton = canonical_json({k: (None if k == "payload" else fields[k]) for k in STORED_COLUMNS[:-1]})
    head, _, tail = skeleton.partition(b'"payload":null')
    body = head + b'"payload":' + str(fields["payload"]).encode("utf-8", "surrogatepass") + tail
    return hashlib.sha256(bytes.fromhex(fields["prev_hash"]) + body).hexdigest()


ODD_VALUES = st.sampled_from([None, True, 1.5, b"bytes", 7, -1, "x", "\ud800", 2**63 - 1, "a" * 64])


@st.composite
def tampered(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    rows = [list(r) for r in draw(chains())]
    for _ in range(draw(st.integers(0, 3))):
        if not rows:
            break
        i = draw(st.integers(0, len(rows) - 1))
        how = draw(
            st.sampled_from(
                ["field", "payload_ws", "payload_order", "payload_escape", "forge", "delete", "swap", "renumber"]
            )
        )
        row = rows[i]
        if how == "field":
            row[draw(st.integers(0, len(STORED_COLUMNS) - 1))] = draw(ODD_VALUES | TEXT)
        elif how in ("payload_ws", "payload_order", "payload_escape", "forge") and isinstance(row[8], str):
            try:
                value = json.loads(row[8])
            except ValueError:
                continue
            if how == "payload_ws":
                row[8] = " " + row[8] if draw(st.booleans()) else json.dumps(value, sort_keys=True)
            elif how == "payload_order":
                row[8] = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
                if isinstance(value, dict) and len(value) > 1:
                    keys = sorted(value, reverse=True)
                    row[8] = json.dumps({k: value[k] for k in keys}, separators=(",", ":"), ensure_ascii=False)
            elif how == "payload_escape":
                row[8] = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
            else:  # the payload rewritten to a text that is not canonical, and its hash recomputed over that text
                row[8] = draw(
                    st.sampled_from(
                        [
                            row[8] + " ",
                            "{" + row[8][1:],
                            json.dumps(value, sort_keys=True),
                            '{"a":1,"a":2}',
                            '{"x":1e5}',
                            "[]",
                            '{"x":[1',
                            "",
                        ]
                    )
                )
                if draw(st.booleans()):
                    try:
                        row[10] = _splice_hash(row)
                    except (TypeError, ValueError):
                        pass
        elif how == "delete":
            del rows[i]
        elif how == "swap" and i + 1 < len(rows):
            rows[i], rows[i + 1] = rows[i + 1], rows[i]
        elif how == "renumber":
            row[0] = draw(st.integers(-1, 20))
    return [tuple(r) for r in rows]


def _batches(rows: list[tuple[Any, ...]], size: int) -> list[list[tuple[Any, ...]]]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _reference(rows: list[tuple[Any, ...]], **kw: Any) -> Any:
    return verify_rows((dict(zip(STORED_COLUMNS, r, strict=True)) for r in rows), **kw)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=tampered(), size=st.integers(1, 5))
def test_fast_walk_agrees_with_the_reference(rows: list[tuple[Any, ...]], size: int) -> None:
    assert verify_stored(_batches(rows, size)) == _reference(rows)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=tampered(), size=st.integers(1, 5), start=st.integers(0, 6), how=st.sampled_from(["trust", "prev", "anchor"])
)
def test_fast_walk_agrees_from_a_start_point(rows: list[tuple[Any, ...]], size: int, start: int, how: str) -> None:
    """From a seq: the first prev_hash taken on trust, given (a segment's start), or the record anchored."""
    rest = rows[start:]
    first = rest[0] if rest else None
    kw: dict[str, Any] = {"from_seq": start + 1}
    if how == "prev":
        kw["prev_hash"] = (
            rows[start - 1][10] if 0 < start <= len(rows) and isinstance(rows[start - 1][10], str) else GENESIS
        )
        if not isinstance(kw["prev_hash"], str) or len(kw["prev_hash"]) != 64:
            kw["prev_hash"] = GENESIS
    elif how == "anchor":
        kw["anchor"] = (
            first[10] if first is not None and isinstance(first[10], str) and len(first[10]) == 64 else "1" * 64
        )
        try:
            int(kw["anchor"], 16)
            assert kw["anchor"] == kw["anchor"].lower()
        except (ValueError, AssertionError):
            kw["anchor"] = "1" * 64
    assert verify_stored(_batches(rest, size), **kw) == _reference(rest, **kw)


def test_a_forged_non_canonical_payload_is_refused_like_the_reference() -> None:
    """The one case a bare splice would accept: the text is not canonical and the hash was made over it."""
    good = []
    prev = GENESIS
    for seq in (1, 2, 3):
        record = {
            "seq": seq,
            "time": "t",
            "kind": "k",
            "request_id": None,
            "operation_id": None,
            "peer_uid": None,
            "session": None,
            "writer": "w",
            "payload": {"b": 1, "a": seq},
            "prev_hash": prev,
        }
        digest = compute_hash(record)
        good.append(list(_stored(record, canonical_json(record["payload"]).decode(), digest)))
        prev = digest
    assert verify_stored([[tuple(r) for r in good]]).ok  # control
    good[2][8] = '{"b":1,"a":3}'  # same meaning, keys out of order
    good[2][10] = _splice_hash(good[2])
    rows = [tuple(r) for r in good]
    fast, reference = verify_stored([rows]), _reference(rows)
    assert fast == reference and not fast.ok and fast.first_bad_seq == 3
    assert fast.reason == "payload is not in canonical form"


@pytest.mark.parametrize("size", [1, 3, 2048])
def test_a_good_chain_checks_out_in_any_batching(size: int) -> None:
    rows = []
    prev = GENESIS
    for seq in range(1, 50):
        record = {
            "seq": seq,
            "time": "2026-12-03T10:00:00.000Z",
            "kind": "exec.finished",
            "request_id": f"r{seq}",
            "operation_id": None,
            "peer_uid": 1000,
            "session": "s\u00e9",
            "writer": "runner",
            "payload": {"argv": ["true"], "n": seq, "q": 'a"b\n'},
            "prev_hash": prev,
        }
        digest = compute_hash(record)
        rows.append(_stored(record, canonical_json(record["payload"]).decode(), digest))
        prev = digest
    result = verify_stored(_batches(rows, size))
    assert result.ok and result.checked == 49 and (result.head_seq, result.head_hash) == (49, prev)
    assert result == _reference(rows)


def _long_chain(n: int) -> list[tuple[Any, ...]]:
    """``n`` plain records, as a dev stack writes them (the batch path takes them whole)."""
    rows = []
    prev = GENESIS
    for seq in range(1, n + 1):
        record = {
            "seq": seq,
            "time": f"2026-12-03T10:00:{seq % 60:02d}.000Z",
            "kind": ("request.received", "exec.finished", "request.replied")[seq % 3],
            "request_id": f"req-{seq // 3}",
            "operation_id": None if seq % 7 == 0 else f"op-{seq // 3}",
            "peer_uid": None if seq % 5 == 0 else 1000,
            "session": "sess-1",
            "writer": "intake",
            "payload": {"argv": ["/usr/bin/true"], "exit_code": 0, "n": seq, "env": {"LANG": "C.UTF-8"}},
            "prev_hash": prev,
        }
        digest = compute_hash(record)
        rows.append(_stored(record, canonical_json(record["payload"]).decode(), digest))
        prev = digest
    return rows


LONG = _long_chain(40)


@settings(max_examples=300, deadline=None)
@given(
    i=st.integers(0, len(LONG) - 1),
    column=st.integers(0, len(STORED_COLUMNS) - 1),
    offset=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    size=st.sampled_from([1, 7, 2048]),
)
def test_a_single_byte_changed_anywhere_in_a_record_is_reported(
    i: int, column: int, offset: int, byte: int, size: int
) -> None:
    """One byte of one record's stored form changed -- any column, as the database holds it -- fails the
    walk at that record or before it, in any batching, and the fast walk says what the reference says."""
    assert verify_stored(_batches(LONG, size)).ok  # control: the same chain untouched checks out
    rows = [list(r) for r in LONG]
    value = rows[i][column]
    stored = b"null" if value is None else str(value).encode()
    at = offset % len(stored)
    if stored[at] == byte:
        return  # not a change
    changed = stored[:at] + bytes([byte]) + stored[at + 1 :]
    try:
        text = changed.decode()
    except UnicodeDecodeError:
        return  # the database would not hand it out as text (sqlite3 refuses it before any walk)
    if value is None or isinstance(value, int):
        try:
            rows[i][column] = None if text == "null" else int(text)
        except ValueError:
            rows[i][column] = text  # a column of INTEGER affinity keeps text it cannot read as a number
        if rows[i][column] == value and type(rows[i][column]) is type(value):
            return  # the same value (e.g. "1000" -> 1000): not a change the database can hold
    else:
        rows[i][column] = text
    tampered = [tuple(r) for r in rows]
    result = verify_stored(_batches(tampered, size))
    assert not result.ok and result.first_bad_seq is not None and result.first_bad_seq <= LONG[i][0]
    assert result == _reference(tampered)

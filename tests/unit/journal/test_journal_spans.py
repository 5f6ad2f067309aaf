"""A walk split into spans (`spans.walk_spans`) gives exactly the one walk's answer (`chain.verify_rows`).

The database's side is modelled as it is in journal/verification.py: rows as
SQLite holds them (unique integer seqs in order), the spans cut from the
snapshot's last seq, each span's link and last hash read from the stored
rows, a helper's result computed as journal/spanchild.py computes it, or missing
(a helper that did not answer) -- and the answer compared with the reference's on everything: ok, checked,
first bad seq, reason and head.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_journal_verify_fast import LONG, _batches, _reference, tampered

from airlock.journal.chain import GENESIS, VerifyResult, _Walk
from airlock.journal.fastwalk import STORED_COLUMNS, verify_stored
from airlock.journal.spans import Span, cut, join, span, walk_spans

Row = tuple[Any, ...]


def _as_stored(rows: list[Row]) -> list[Row]:
    """The rows a database could hand out: integer seqs, each once, in order (the seq is the row id)."""
    by_seq: dict[int, Row] = {}
    for row in rows:
        if type(row[0]) is int:
            by_seq.setdefault(row[0], row)
    return [by_seq[seq] for seq in sorted(by_seq)]


def _between(rows: list[Row], first: int, last: int | None = None) -> list[Row]:
    return [r for r in rows if r[0] >= first and (last is None or r[0] <= last)]


def _split_walk(
    rows: list[Row],
    parts: int,
    size: int,
    helper: Callable[[list[Row], Span], VerifyResult | None],
    lead: int = 0,
    **kw: Any,
) -> VerifyResult:
    """journal/verification.py's split walk over ``rows`` as the snapshot (no I/O)."""
    walk = _Walk(kw.get("from_seq"), kw.get("anchor"), kw.get("prev_hash"))
    start = kw.get("from_seq") or 1
    stored = {r[0]: r[-1] for r in rows}
    last = max(stored, default=None)
    later: list[Span] = []
    if last is not None and last - start + 1 >= parts:
        for first, end in cut(start, last, parts, lead)[1:]:
            part = span(first, end, stored.get(first - 1), stored.get(end))
            if part is None:
                later = []
                break
            later.append(part)
    if not later:
        return verify_stored(_batches(_between(rows, start), size), **kw)
    spans_in = [
        (
            part,
            (lambda part=part: helper(_between(rows, part.first, part.last), part)),
            (lambda part=part: _batches(_between(rows, part.first, part.last), size)),
        )
        for part in later
    ]
    own = _batches(_between(rows, start, later[0].first - 1), size)
    return walk_spans(walk, own, spans_in, lambda: _batches(_between(rows, later[-1].last + 1), size))


def _honest(rows: list[Row], part: Span) -> VerifyResult:
    return verify_stored([rows], from_seq=part.first, prev_hash=part.link)


def _silent(rows: list[Row], part: Span) -> None:
    return None


HELPERS = {"honest": _honest, "silent": _silent}


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=tampered(),
    parts=st.integers(2, 5),
    size=st.integers(1, 5),
    helper=st.sampled_from(sorted(HELPERS)),
    lead=st.integers(0, 6),
)
def test_a_split_walk_agrees_with_the_reference(rows: list[Row], parts: int, size: int, helper: str, lead: int) -> None:
    stored = _as_stored(rows)
    # The walk's SELECT starts at seq 1 (journal/verification.py), split or not.
    assert _split_walk(stored, parts, size, HELPERS[helper], lead) == _reference(_between(stored, 1))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=tampered(),
    parts=st.integers(2, 4),
    start=st.integers(1, 6),
    how=st.sampled_from(["trust", "prev", "anchor"]),
    helper=st.sampled_from(sorted(HELPERS)),
)
def test_a_split_walk_agrees_from_a_start_point(rows: list[Row], parts: int, start: int, how: str, helper: str) -> None:
    stored = _as_stored(rows)
    kw: dict[str, Any] = {"from_seq": start}
    before = {r[0]: r[-1] for r in stored}.get(start - 1)
    at = {r[0]: r[-1] for r in stored}.get(start)
    if how == "prev":
        kw["prev_hash"] = before if isinstance(before, str) and _hex64(before) else GENESIS
    elif how == "anchor":
        kw["anchor"] = at if isinstance(at, str) and _hex64(at) else "1" * 64
    rest = _between(stored, start)
    assert _split_walk(stored, parts, 3, HELPERS[helper], **kw) == _reference(rest, **kw)


def _hex64(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


@settings(max_examples=300, deadline=None)
@given(
    edge=st.sampled_from([-1, 0, 1]),
    span_index=st.integers(1, 3),
    parts=st.integers(2, 4),
    column=st.integers(0, len(STORED_COLUMNS) - 1),
    offset=st.integers(0, 10_000),
    byte=st.integers(0, 255),
    helper=st.sampled_from(sorted(HELPERS)),
)
def test_a_single_byte_changed_at_a_span_edge_is_reported(
    edge: int, span_index: int, parts: int, column: int, offset: int, byte: int, helper: str
) -> None:
    """One byte changed in the record before a span, its first, or its last: reported as the reference does."""
    ranges = cut(1, len(LONG), parts)
    first, last = ranges[min(span_index, parts - 1)]
    seq = {-1: first - 1, 0: first, 1: last}[edge]
    rows = [list(r) for r in LONG]
    value = rows[seq - 1][column]
    stored = b"null" if value is None else str(value).encode()
    at = offset % len(stored)
    if stored[at] == byte:
        return
    try:
        text = (stored[:at] + bytes([byte]) + stored[at + 1 :]).decode()
    except UnicodeDecodeError:
        return
    if column == 0:
        return  # the seq is the row id: changing it moves the row (the hypothesis walk above deletes and swaps)
    if value is None or isinstance(value, int):
        try:
            rows[seq - 1][column] = None if text == "null" else int(text)
        except ValueError:
            rows[seq - 1][column] = text
        if rows[seq - 1][column] == value and type(rows[seq - 1][column]) is type(value):
            return
    else:
        rows[seq - 1][column] = text
    changed = [tuple(r) for r in rows]
    assert _split_walk(LONG, parts, 7, HELPERS[helper]).ok  # control
    result = _split_walk(changed, parts, 7, HELPERS[helper])
    assert not result.ok and result.first_bad_seq is not None and result.first_bad_seq <= seq
    assert result == _reference(changed)


def test_cut_covers_every_seq_once_evenly() -> None:
    assert cut(1, 10, 3) == [(1, 3), (4, 6), (7, 10)]
    assert cut(5, 6, 4) == [(5, 5), (6, 6)]
    assert cut(7, 6, 2) == [] and cut(1, 10, 0) == []
    assert cut(1, 10, 2, lead=4) == [(1, 7), (8, 10)]  # the first range 4 longer: 3 + 4 against 3
    assert cut(1, 10, 3, lead=100) == [(1, 8), (9, 9), (10, 10)]  # never an empty range
    for first, last, parts in [(1, 200_000, 2), (3, 1001, 4), (1, 1, 1)]:
        ranges = cut(first, last, parts)
        assert ranges[0][0] == first and ranges[-1][1] == last
        assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges))
        sizes = [b - a + 1 for a, b in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_a_span_needs_hashes_to_start_and_end_on() -> None:
    h = "a" * 64
    assert span(5, 9, h, h) == Span(5, 9, h, h)
    assert span(5, 9, None, h) is None and span(5, 9, h, "A" * 64) is None and span(5, 9, b"x", h) is None
    assert span(1, 9, h, h) is None  # nothing before seq 1 to link to


def _walked_to(seq: int, digest: str) -> _Walk:
    walk = _Walk(None, None, None)
    walk.checked, walk.expected, walk.prev, walk.head_seq, walk.head_hash = seq, seq + 1, digest, seq, digest
    return walk


@pytest.mark.parametrize(
    ("walk_to", "result"),
    [
        ((12, "a" * 64), VerifyResult(True, 5, None, None, 20, "c" * 64)),  # the walk ended one seq early
        ((13, "d" * 64), VerifyResult(True, 5, None, None, 20, "c" * 64)),  # on another hash than the link
        ((13, "a" * 64), VerifyResult(True, 5, None, None, 19, "c" * 64)),  # the span ended early
        ((13, "a" * 64), VerifyResult(True, 5, None, None, 20, "e" * 64)),  # on another hash than stored
        ((13, "a" * 64), VerifyResult(False, 2, 16, "seq 16: hash does not match", 15, "f" * 64)),  # it failed
        ((13, "a" * 64), VerifyResult(False, 7, 21, "seq 21 is missing", 20, "c" * 64)),  # not ok, whatever else
        ((13, "a" * 64), VerifyResult(True, 0, None, None, 20, "c" * 64)),  # it checked nothing
    ],
)
def test_join_refuses_a_span_that_does_not_continue_the_walk_exactly(
    walk_to: tuple[int, str], result: VerifyResult
) -> None:
    part = Span(14, 20, "a" * 64, "c" * 64)
    walk = _walked_to(*walk_to)
    before = (walk.checked, walk.expected, walk.prev, walk.head_seq, walk.head_hash)
    assert not join(walk, part, result)
    assert (walk.checked, walk.expected, walk.prev, walk.head_seq, walk.head_hash) == before


def test_join_refuses_a_walk_that_has_not_checked_its_first_record() -> None:
    """Its start point's anchor applies to its first record, which a span walked from the link never checks."""
    walk = _Walk(14, "d" * 64, "a" * 64)
    assert not join(walk, Span(14, 20, "a" * 64, "c" * 64), VerifyResult(True, 7, None, None, 20, "c" * 64))
    assert walk.checked == 0 and walk.expected == 14


def test_join_takes_a_span_that_continues_the_walk() -> None:
    walk = _walked_to(13, "a" * 64)
    assert join(walk, Span(14, 20, "a" * 64, "c" * 64), VerifyResult(True, 7, None, None, 20, "c" * 64))
    assert walk.end() == VerifyResult(True, 20, None, None, 20, "c" * 64)

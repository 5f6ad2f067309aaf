"""A chain walk split into spans of seqs walked side by side, joined into exactly the one walk's answer.

The walk keeps the first span; every later span is walked on its own (by a
helper process, journal/spanwalk.py) as `verify_rows` walks from a start
point: from its first seq, with the hash stored at the seq before it as its
``prev_hash``.  `join` takes a span's result into the walk only where it
cannot differ from what the one walk would find there: the walk so far
ended exactly at the seq before the span, on exactly the hash the span
started from, and the span checked out to its last seq, on exactly the hash
stored there.  A span that fails, ends early, starts from a link that does
not hold, or whose helper gave no answer is walked again by the walk itself
(`walk_spans`), so every failure is found and worded by the one walk: the
earliest bad seq, the reference's reason, its count and head.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from airlock.journal.chain import VerifyResult, _Walk, is_hash
from airlock.journal.fastwalk import walk_stored

Batches = Iterable[Sequence[Sequence[Any]]]


@dataclass(frozen=True, slots=True)
class Span:
    """Seqs ``first`` to ``last``, walked from ``link`` (the hash stored at ``first - 1``); ``last_hash`` is
    the hash stored at ``last``, so a span that checks out is known to end where the walk's snapshot does."""

    first: int
    last: int
    link: str
    last_hash: str


def cut(first: int, last: int, parts: int, lead: int = 0) -> list[tuple[int, int]]:
    """Seqs ``first`` to ``last`` in ``parts`` contiguous ranges (fewer if there are fewer seqs): the first
    ``lead`` seqs longer than the others (what the walk gets done while its helpers start), the rest even."""
    if last < first or parts < 1:
        return []
    total = last - first + 1
    parts = min(parts, total)
    lead = max(0, min(lead, total - parts))
    rest = total - lead
    bounds = [first] + [first + lead + rest * i // parts for i in range(1, parts + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(parts)]


def span(first: int, last: int, link: object, last_hash: object) -> Span | None:
    """The span from the hashes stored at ``first - 1`` and ``last``, or None when either is not a hash (or
    absent): then there is nothing to walk it from, and the one walk takes those seqs itself."""
    if first < 2 or last < first or not is_hash(link) or not is_hash(last_hash):
        return None
    return Span(first, last, str(link), str(last_hash))


def join(walk: _Walk, part: Span, result: VerifyResult) -> bool:
    """Take ``result`` (``part`` walked on its own) into ``walk`` if it is exactly what ``walk`` would find.

    The condition makes the two walks the same walk: after at least one
    record, a walk's state is the next seq expected and the previous hash
    (its start point and anchor apply only to its first seq, already
    behind it); a span walked from ``part.link`` at ``part.first`` starts in
    that very state, so it checks each of its records as the walk would.
    Anything else returns False and leaves ``walk`` untouched.
    """
    if not (
        walk.checked > 0
        and walk.expected == part.first
        and walk.prev == part.link
        and result.ok
        and result.checked > 0
        and result.head_seq == part.last
        and result.head_hash == part.last_hash
    ):
        return False
    walk.checked += result.checked
    walk.expected = part.last + 1
    walk.prev = part.last_hash
    walk.head_seq, walk.head_hash = part.last, part.last_hash
    return True


def walk_spans(
    walk: _Walk,
    own: Batches,
    later: Iterable[tuple[Span, Callable[[], VerifyResult | None], Callable[[], Batches]]],
    rest: Callable[[], Batches],
) -> VerifyResult:
    """The one walk's answer: ``own`` rows walked, then each later span joined from its helper's result
    (None: the helper gave none) or, where `join` refuses it, its rows walked here; then ``rest``."""
    bad = walk_stored(walk, own)
    if bad is not None:
        return bad
    for part, outcome, rows in later:
        result = outcome()
        if result is None or not join(walk, part, result):
            bad = walk_stored(walk, rows())
            if bad is not None:
                return bad
    return walk_stored(walk, rest()) or walk.end()

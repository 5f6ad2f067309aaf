"""The chain's fast walk: `verify_stored` gives `chain.verify_rows`'s answer for rows as the database stores
them, in batches, several times faster.

Each batch's payloads are parsed once and re-encoded canonically in one call;
anything that is not exactly canonical goes to `chain`'s reference code for
that row or batch, so every failure is reported as the reference reports it.

Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from itertools import repeat
from json.encoder import encode_basestring
from json.scanner import make_scanner
from typing import Any, Final

from airlock.journal.chain import RECORD_FIELDS, VerifyResult, _Walk

# -- the fast path ------------------------------------------------------------

# The columns `verify_stored` takes, in this order (the journal's SELECT).
STORED_COLUMNS: Final = (*RECORD_FIELDS, "hash")

_scan = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]  # the C scanner takes the decoder
_sorted_list = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, check_circular=False).encode
_TEXT: Final = (str, type(None))


def verify_stored(
    batches: Iterable[Sequence[Sequence[Any]]],
    *,
    from_seq: int | None = None,
    anchor: str | None = None,
    prev_hash: str | None = None,
) -> VerifyResult:
    """`verify_rows` for rows as the database stores them, in batches: the same answer, several times faster.

    Each row is a tuple in `STORED_COLUMNS` order with the payload as its
    stored text.  Per batch, every payload is parsed once and the batch
    re-encoded canonically in one call: equal to the stored texts joined,
    and each parse ending exactly at its text's end, each text is canonical
    (a complete JSON value cannot be a proper prefix of another, so the
    boundaries line up).  Then a record's canonical bytes are the other
    fields encoded as `canonical_json` would and the stored payload text put
    in its place, with no re-encoding.  Anything else -- a batch that is not
    canonical, a field of an unexpected type, a seq gap, a link or hash that
    does not match -- goes to `verify_rows`'s own code for that row or
    batch, so every failure is reported exactly as the reference reports it.
    """
    walk = _Walk(from_seq, anchor, prev_hash)
    return walk_stored(walk, batches) or walk.end()


def walk_stored(walk: _Walk, batches: Iterable[Sequence[Sequence[Any]]]) -> VerifyResult | None:
    """`verify_stored`'s walk through ``batches`` from ``walk``'s state, without its end: the result naming
    the first bad record, or None with ``walk`` moved past the last row (so more rows can follow)."""
    enc = encode_basestring
    sha256 = hashlib.sha256
    for batch in batches:
        if not batch:
            continue
        if not _canonical_payloads(batch):
            for row in batch:
                bad = walk.check(dict(zip(STORED_COLUMNS, row, strict=True)))
                if bad is not None:
                    return bad
            continue
        expected, prev = walk.expected, walk.prev
        prev_raw = bytes.fromhex(prev) if prev is not None else b""
        checked = walk.checked
        for row in batch:
            seq, time_, kind, request_id, operation_id, peer_uid, session, writer, payload, row_prev, stored = row
            body = None
            if (
                prev is not None
                and seq == expected
                and type(seq) is int
                and row_prev == prev
                and type(time_) is str
                and type(kind) is str
                and type(writer) is str
                and type(request_id) in _TEXT
                and type(operation_id) in _TEXT
                and type(session) in _TEXT
                and (peer_uid is None or type(peer_uid) is int)
            ):
                text = (
                    f'{{"kind":{enc(kind)},"operation_id":{"null" if operation_id is None else enc(operation_id)},'
                    f'"payload":{payload},"peer_uid":{"null" if peer_uid is None else peer_uid},'
                    f'"prev_hash":"{row_prev}","request_id":{"null" if request_id is None else enc(request_id)},'
                    f'"seq":{seq},"session":{"null" if session is None else enc(session)},'
                    f'"time":{enc(time_)},"writer":{enc(writer)}}}'
                )
                try:
                    body = text.encode()
                except UnicodeEncodeError:
                    body = None
            if body is not None:
                raw = sha256(prev_raw + body).digest()
                digest = raw.hex()
                if digest == stored and not (walk.anchor is not None and seq == walk.from_seq):
                    checked += 1
                    expected = seq + 1
                    prev, prev_raw = digest, raw
                    continue
            # Not the plain case: the reference decides this row (and reports it if it is bad).
            walk.checked, walk.expected, walk.prev = checked, expected, prev
            if checked:
                walk.head_seq, walk.head_hash = expected - 1, prev  # type: ignore[assignment]
            bad = walk.check(dict(zip(STORED_COLUMNS, row, strict=True)))
            if bad is not None:
                return bad
            checked, expected, prev = walk.checked, walk.expected, walk.prev
            prev_raw = bytes.fromhex(prev) if prev is not None else b""
        walk.checked, walk.expected, walk.prev = checked, expected, prev
        if checked:
            walk.head_seq, walk.head_hash = expected - 1, prev  # type: ignore[assignment]
    return None


def _canonical_payloads(batch: Sequence[Sequence[Any]]) -> bool:
    """Whether every payload of the batch is a JSON object stored in canonical form (C-level loops: it is hot)."""
    texts = [row[8] for row in batch]
    try:
        if set(map(type, texts)) != {str}:
            return False
        # A StopIteration (no JSON value at 0) ends map early: the lengths then differ.
        scanned = list(map(_scan, texts, repeat(0)))
        if len(scanned) != len(texts):
            return False
        values, ends = zip(*scanned, strict=True)
        if ends != tuple(map(len, texts)) or set(map(type, values)) != {dict}:
            return False
        return bool(_sorted_list(list(values)) == "[" + ",".join(texts) + "]")
    except (StopIteration, ValueError, RecursionError, TypeError):
        return False

"""Streaming redaction and bounded capture (pure, no processes)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.runner.redact import REDACTED, Capture, StreamRedactor, cut_utf8, redact


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def stream(values: list[str | bytes], chunks: list[bytes]) -> bytes:
    redactor = StreamRedactor(values)
    return b"".join(redactor.feed(c) for c in chunks) + redactor.flush()


def test_whole_buffer_replaces_every_occurrence() -> None:
    assert redact(b"a hunter2 b hunter2", ["hunter2"]) == b"a [redacted] b [redacted]"


def test_longest_value_wins_at_one_position() -> None:
    assert redact(b"xsecret-longx", ["secret", "secret-long"]) == b"x[redacted]x"


def test_empty_values_are_ignored() -> None:
    assert redact(b"abc", ["", b""]) == b"abc"
    assert stream(["", "x"], [b"axb"]) == b"a[redacted]b"


def test_replacement_is_literal() -> None:
    assert redact(b"k", ["k"], replacement=b"\\1\\g<0>") == b"\\1\\g<0>"


def test_value_straddling_two_reads() -> None:
    assert stream(["hunter2"], [b"pass=hun", b"ter2;"]) == b"pass=[redacted];"


def test_value_split_byte_by_byte() -> None:
    data = b"xx hunter2 yy hunter2"
    assert stream(["hunter2"], [bytes([b]) for b in data]) == redact(data, ["hunter2"])


def test_partial_value_at_eof_is_flushed_unredacted() -> None:
    assert stream(["hunter2"], [b"abc hunt"]) == b"abc hunt"


def test_no_values_is_a_pass_through() -> None:
    redactor = StreamRedactor([])
    assert not redactor.active
    assert redactor.feed(b"abc") == b"abc"
    assert redactor.flush() == b""


def test_holds_back_at_most_longest_minus_one() -> None:
    redactor = StreamRedactor(["abcd"])
    assert redactor.feed(b"0123456789") == b"0123456"
    assert redactor.flush() == b"789"


def test_unicode_values_are_matched_as_utf8() -> None:
    assert stream(["pässwörd"], ["x pässwörd y".encode()[:5], "x pässwörd y".encode()[5:]]) == b"x [redacted] y"


@settings(max_examples=250, deadline=None)
@given(
    values=st.lists(st.binary(min_size=1, max_size=6).filter(lambda v: len(set(v)) <= 3), min_size=0, max_size=4),
    data=st.binary(max_size=200),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
def test_any_chunking_equals_whole_buffer(values: list[bytes], data: bytes, cuts: list[int]) -> None:
    assert stream(list(values), chunked(data, cuts)) == redact(data, values)


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(st.sampled_from([b"ab", b"aba", b"b", b"abab", b"\xc3\xa9"]), max_size=3),
    parts=st.lists(st.sampled_from([b"a", b"b", b"ab", b"ba", b"\xc3", b"\xa9", b"c"]), max_size=60),
    cuts=st.lists(st.integers(min_value=0, max_value=120), max_size=30),
)
def test_overlapping_values_any_chunking(values: list[bytes], parts: list[bytes], cuts: list[int]) -> None:
    # Dense input over a tiny alphabet: values overlap and repeat constantly.
    data = b"".join(parts)
    assert stream(list(values), chunked(data, cuts)) == redact(data, values)


def test_cut_utf8_never_splits_a_character() -> None:
    euro = "€".encode()  # 3 bytes
    data = b"aaaa" + euro + b"z"
    assert cut_utf8(data, 4) == b"aaaa"
    assert cut_utf8(data, 5) == b"aaaa"
    assert cut_utf8(data, 6) == b"aaaa"
    assert cut_utf8(data, 7) == b"aaaa" + euro
    assert cut_utf8(data, 100) == data
    assert cut_utf8("😀".encode() * 2, 7) == "😀".encode()
    assert cut_utf8(b"\xff\xfe\xfd", 2) == b"\xff\xfe"  # not UTF-8: a plain byte cut


def test_capture_caps_and_flags() -> None:
    seen: list[bytes] = []
    capture = Capture(10, seen.append)
    capture.add(b"12345")
    capture.add(b"67890")
    assert not capture.truncated
    capture.add(b"x")
    assert capture.truncated
    capture.add(b"more")
    assert capture.finish() == b"1234567890"
    assert b"".join(seen) == b"1234567890"


def test_capture_exactly_at_the_cap_is_not_truncated() -> None:
    capture = Capture(3)
    capture.add(b"abc")
    assert capture.finish() == b"abc"
    assert not capture.truncated


def test_capture_cut_inside_a_character_across_chunks() -> None:
    seen: list[bytes] = []
    capture = Capture(5, seen.append)
    euro = "€".encode()
    capture.add(b"aaa" + euro[:1])
    capture.add(euro[1:] + b"bbb")
    assert capture.finish() == b"aaa"
    assert capture.truncated
    assert b"".join(seen) == b"aaa"


def test_capture_delivers_whole_characters_only() -> None:
    seen: list[bytes] = []
    capture = Capture(100, seen.append)
    text = "héllo wörld €€".encode()
    for byte in text:
        capture.add(bytes([byte]))
    assert capture.finish() == text
    for chunk in seen:
        chunk.decode()  # every delivered chunk is valid UTF-8 on its own


def test_capture_zero_cap() -> None:
    capture = Capture(0)
    capture.add(b"x")
    assert capture.finish() == b""
    assert capture.truncated


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=80), cap=st.integers(min_value=0, max_value=200), cuts=st.lists(st.integers(0, 400)))
def test_capture_is_a_valid_utf8_prefix(text: str, cap: int, cuts: list[int]) -> None:
    data = text.encode()
    seen: list[bytes] = []
    capture = Capture(cap, seen.append)
    for chunk in chunked(data, cuts):
        capture.add(chunk)
    kept = capture.finish()
    assert data.startswith(kept)
    assert len(kept) <= cap
    if capture.truncated:
        assert len(kept) > cap - 4  # at most one partial character dropped
    kept.decode()
    assert capture.truncated == (len(data) > cap)
    assert b"".join(seen) == kept


def test_replacement_constant() -> None:
    assert REDACTED == b"[redacted]"

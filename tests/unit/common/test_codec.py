"""The native codec and framing: fed whole, byte by byte, and with trailing data."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.common.codec import (
    Event,
    Request,
    Response,
    decode_reply,
    decode_request,
    encode_error,
    encode_event,
    encode_ok,
    encode_request,
    parse_object,
    recover_id,
)
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.framing import NEED_DATA, FrameDecoder

PING = b'{"v":1,"id":"r1","verb":"ping","args":{},"token":null}'


def frames(decoder: FrameDecoder) -> list[bytes]:
    out = []
    while (frame := decoder.next_frame()) is not NEED_DATA:
        assert isinstance(frame, bytes)
        out.append(frame)
    return out


def test_a_whole_line_is_one_frame() -> None:
    d = FrameDecoder()
    d.feed(PING + b"\n")
    assert frames(d) == [PING]
    d.end_of_stream()  # nothing left over: no error


def test_byte_by_byte_gives_the_same_frame() -> None:
    d = FrameDecoder()
    got = []
    for byte in PING + b"\n":
        d.feed(bytes([byte]))
        got += frames(d)
    assert got == [PING]


def test_trailing_data_stays_buffered_for_the_next_frame() -> None:
    d = FrameDecoder()
    d.feed(PING + b"\n" + b'{"v":1')
    assert frames(d) == [PING]
    assert d.buffered == len(b'{"v":1')
    with pytest.raises(AirlockError) as err:
        d.end_of_stream()
    assert err.value.code is ErrorCode.MISSING_NEWLINE
    assert "missing trailing newline" in err.value.message


def test_the_cap_counts_the_newline_and_is_checked_before_parsing() -> None:
    d = FrameDecoder(max_bytes=10)
    d.feed(b"123456789\n")
    assert frames(d) == [b"123456789"]
    d = FrameDecoder(max_bytes=10)
    d.feed(b"1234567890")
    with pytest.raises(AirlockError) as err:
        d.next_frame()
    assert err.value.code is ErrorCode.REQUEST_TOO_LARGE
    assert err.value.details == {"limit_bytes": 10}


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"\xff\xfe", ErrorCode.INVALID_UTF8),
        (b"not json", ErrorCode.INVALID_JSON),
        (b"[1,2]", ErrorCode.INVALID_REQUEST),
        (b'"text"', ErrorCode.INVALID_REQUEST),
        (b"NaN", ErrorCode.INVALID_JSON),
        (b'{"a":Infinity}', ErrorCode.INVALID_JSON),
        (b"[" * 100000 + b"]" * 100000, ErrorCode.INVALID_JSON),
        (b'{"v":1}\r', ErrorCode.INVALID_REQUEST),
        (b'{"n":' + b"9" * 5000 + b"}", ErrorCode.INVALID_JSON),
    ],
)
def test_each_kind_of_bad_line_is_its_own_error(line: bytes, code: ErrorCode) -> None:
    with pytest.raises(AirlockError) as err:
        parse_object(line)
    assert err.value.code is code


def test_unsupported_version_lists_what_is_supported() -> None:
    with pytest.raises(AirlockError) as err:
        decode_request(b'{"v":2,"id":"x","verb":"ping"}')
    assert err.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert err.value.details == {"supported": [1], "received": 2}


def test_a_missing_version_is_unsupported_version_too() -> None:
    # reference/004: "A request with any other version is rejected with
    # unsupported_version and the versions the daemon supports"; docs/protocol.md
    # says the same of a missing `v`.
    with pytest.raises(AirlockError) as err:
        decode_request(b'{"id":"x","verb":"status","args":{}}')
    assert err.value.code is ErrorCode.UNSUPPORTED_VERSION
    assert err.value.details == {"supported": [1], "received": None}


@pytest.mark.parametrize(
    "line",
    [
        b'{"id":"x","verb":"ping"}',
        b'{"v":1,"id":"x"}',
        b'{"v":1,"verb":""}',
        b'{"v":1,"verb":"p","args":[]}',
        b'{"v":1,"verb":"p","token":5}',
        b'{"v":1,"verb":"p","extra":1}',
        b'{"v":true,"verb":"p"}',
    ],
)
def test_envelope_shape_errors(line: bytes) -> None:
    with pytest.raises(AirlockError) as err:
        decode_request(line)
    assert err.value.code in (ErrorCode.INVALID_REQUEST, ErrorCode.UNSUPPORTED_VERSION)


def test_responses_have_exactly_one_of_data_and_error() -> None:
    ok = json.loads(encode_ok("a", {"x": 1}))
    assert ok == {"id": "a", "ok": True, "data": {"x": 1}}
    err = json.loads(encode_error(None, AirlockError(ErrorCode.NOT_FOUND, "gone", {"k": 1})))
    assert err == {"id": None, "ok": False, "error": {"code": "not_found", "message": "gone", "details": {"k": 1}}}
    event = json.loads(encode_event("a", "stdout", 3, {"data": "eA=="}))
    assert event == {"id": "a", "event": "stdout", "seq": 3, "data": "eA=="}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


# Request IDs are words of [A-Za-z0-9._:-] (issue 28).
request_ids = st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True)


@given(
    request_id=st.none() | request_ids,
    verb=st.text(min_size=1, max_size=20),
    args=st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    token=st.none() | st.text(max_size=20),
)
def test_decode_of_encode_is_identity(
    request_id: str | None, verb: str, args: dict[str, Any], token: str | None
) -> None:
    request = Request(id=request_id, verb=verb, args=args, token=token)
    line = encode_request(request)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_request(line[:-1]) == request


@given(data=st.dictionaries(st.text(max_size=10), json_values, max_size=5), rid=st.none() | st.text(max_size=10))
def test_replies_round_trip(data: dict[str, Any], rid: str | None) -> None:
    reply = decode_reply(encode_ok(rid, data)[:-1])
    assert isinstance(reply, Response) and reply.ok and reply.data == data and reply.id == rid
    event = decode_reply(encode_event(rid, "e", 1, data)[:-1])
    assert isinstance(event, Event) and event.seq == 1


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_yield_a_request_or_a_protocol_error(raw: bytes) -> None:
    d = FrameDecoder(max_bytes=128)
    d.feed(raw)
    try:
        while (frame := d.next_frame()) is not NEED_DATA:
            assert isinstance(frame, bytes)
            try:
                assert isinstance(decode_request(frame), Request)
            except AirlockError:
                pass
        d.end_of_stream()
    except AirlockError as exc:
        assert exc.code in (ErrorCode.REQUEST_TOO_LARGE, ErrorCode.MISSING_NEWLINE)


def _frames(decoder: FrameDecoder) -> list[bytes | str]:
    out: list[bytes | str] = []
    while True:
        try:
            frame = decoder.next_frame()
        except AirlockError as exc:
            out.append(exc.code.value)
            if not decoder.skip_overlong:
                return out
            continue
        if frame is NEED_DATA:
            return out
        assert isinstance(frame, bytes)
        out.append(frame)


@pytest.mark.parametrize("chunk", [10_000, 1])
def test_a_skipping_decoder_reports_an_overlong_line_once_and_goes_on(chunk: int) -> None:
    data = b"ok\n" + b"x" * 40 + b"\n" + b"after\n" + b"tail"
    decoder = FrameDecoder(16, skip_overlong=True)
    seen: list[bytes | str] = []
    for i in range(0, len(data), chunk):
        decoder.feed(data[i : i + chunk])
        seen += _frames(decoder)
    assert seen == [b"ok", "request_too_large", b"after"]
    assert decoder.rest() == b"tail"


def test_a_strict_decoder_stops_at_an_overlong_line() -> None:
    decoder = FrameDecoder(16)
    decoder.feed(b"x" * 40 + b"\nafter\n")
    assert _frames(decoder) == ["request_too_large"]
    with pytest.raises(AirlockError):
        decoder.next_frame()  # the stream has failed


@pytest.mark.parametrize(
    "bad_id",
    ["r1 $(touch /tmp/pwned)", "a`b", "<!channel>", "x\u202ey", "new\nline", "", "x" * 257, 7, ["r1"], "caf\u00e9"],
)
def test_a_request_id_outside_the_safe_alphabet_is_refused_and_not_echoed(bad_id: object) -> None:
    """Issue 28: an ID lands in shell lines, chat markup and terminals; only [A-Za-z0-9._:-]{1,256} gets in."""
    line = json.dumps({"v": 1, "id": bad_id, "verb": "ping", "args": {}}).encode()
    with pytest.raises(AirlockError) as caught:
        decode_request(line)
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    assert caught.value.details["field"] == "id" and caught.value.details["allowed"] == "[A-Za-z0-9._:-]{1,256}"
    assert recover_id(json.loads(line)) is None
    # Control: the same request with an ID of the alphabet (every character of it, and the longest) is read.
    for good in ("550e8400-e29b-41d4-a716-446655440000", "A.z_0:9-", "x" * 256):
        ok = json.dumps({"v": 1, "id": good, "verb": "ping", "args": {}}).encode()
        assert decode_request(ok).id == good and recover_id(json.loads(ok)) == good

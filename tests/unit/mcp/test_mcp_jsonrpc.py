"""The MCP server's JSON-RPC core: framing and decoding, fed whole, byte by byte and with trailing data.

Malformed input always gets the proper JSON-RPC error code and never an
exception out of the core.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.mcp import jsonrpc
from airlock.mcp.jsonrpc import (
    ErrorCode,
    LineBuffer,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
    TooLong,
    decode,
    sniff_id,
)

REPO = Path(__file__).resolve().parents[3]
PING = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'


def lines(buffer: LineBuffer) -> list[bytes | object]:
    out: list[bytes | object] = []
    while (line := buffer.next_line()) is not None:
        out.append(line)
    return out


@pytest.mark.parametrize("module", ["jsonrpc", "session", "tools"])
def test_the_protocol_core_does_no_io(module: str) -> None:
    tree = ast.parse((REPO / "services/airlock/mcp" / f"{module}.py").read_text())
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "os", "subprocess", "selectors", "sys", "threading"}


# --- framing ----------------------------------------------------------------------


def test_a_whole_line() -> None:
    b = LineBuffer()
    b.feed(PING + b"\n")
    assert lines(b) == [PING]
    assert b.end_of_stream() is None


def test_byte_by_byte() -> None:
    b = LineBuffer()
    got: list[bytes | object] = []
    for byte in PING + b"\n" + PING + b"\n":
        b.feed(bytes([byte]))
        got += lines(b)
    assert got == [PING, PING]


def test_trailing_data_waits_for_its_newline_and_a_last_line_without_one_still_counts() -> None:
    b = LineBuffer()
    b.feed(PING + b"\n" + PING[:10])
    assert lines(b) == [PING]
    b.feed(PING[10:])
    assert lines(b) == []
    assert b.end_of_stream() == PING


def test_an_over_long_line_is_reported_once_at_its_end_and_skipped() -> None:
    b = LineBuffer(max_line=32)
    b.feed(b"x" * 40)
    assert lines(b) == []  # reported when its newline comes: its id may be at the end
    b.feed(b"y" * 40)
    assert lines(b) == []
    b.feed(b"z\n" + PING[:20])
    assert lines(b) == [TooLong(81, None)]
    b.feed(b"\n")
    assert lines(b) == [PING[:20]]  # the stream is usable again


@pytest.mark.parametrize(
    ("line", "request_id"),
    [
        # The Python SDK's order (id before params) and the TypeScript SDK's (id last).
        (b'{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"arguments":{"stdin":"' + b"a" * 200, 7),
        (
            b'{"method":"tools/call","params":{"arguments":{"stdin":"'
            + b"a" * 200
            + b'"}},"jsonrpc":"2.0","id":"x-1"}',
            "x-1",
        ),
        # A nested "id" (a tool argument) is never taken for the call's.
        (b'{"jsonrpc":"2.0","method":"tools/call","params":{"id":3,"arguments":{"x":"' + b"a" * 200, None),
        (b'{"method":"tools/call","params":{"arguments":{"id":4}},"jsonrpc":"2.0"}', None),
        (b'{"params":{"a":"\\"id\\":5"},"id":6,"method":"x","b":"' + b"b" * 64 + b'"}', 6),
    ],
)
def test_an_over_long_line_keeps_the_id_of_its_call(line: bytes, request_id: object) -> None:
    b = LineBuffer(max_line=64)
    b.feed(line + b"\n" + PING + b"\n")
    got = lines(b)
    assert got == [TooLong(len(line), request_id), PING]  # type: ignore[arg-type]
    assert sniff_id(line[:64], line[-64:]) == request_id


def test_a_line_exactly_at_the_cap_is_fine() -> None:
    b = LineBuffer(max_line=len(PING))
    b.feed(PING + b"\n")
    assert lines(b) == [PING]


# --- decoding ---------------------------------------------------------------------


def test_requests_notifications_and_responses() -> None:
    assert decode(PING) == Request(1, "ping", {})
    assert decode(b'{"jsonrpc":"2.0","id":"a","method":"tools/list","params":{"cursor":null}}') == Request(
        "a", "tools/list", {"cursor": None}
    )
    assert decode(b'{"jsonrpc":"2.0","method":"notifications/initialized"}') == Notification(
        "notifications/initialized"
    )
    assert decode(b'{"jsonrpc":"2.0","id":5,"result":{}}') == Response(5, {}, None)


@pytest.mark.parametrize(
    ("line", "code", "request_id"),
    [
        (b"not json", ErrorCode.PARSE_ERROR, None),
        # A line that does not parse still names its call when its id can be read.
        (b'{"jsonrpc":"2.0","id":1,"method":"ping"', ErrorCode.PARSE_ERROR, 1),
        (b"\xff\xfe", ErrorCode.PARSE_ERROR, None),
        (b'{"jsonrpc":"2.0","id":1,"method":"ping","params":NaN}', ErrorCode.PARSE_ERROR, 1),
        (b"[" * 100_000, ErrorCode.PARSE_ERROR, None),
        (b'[{"jsonrpc":"2.0","id":1,"method":"ping"}]', ErrorCode.INVALID_REQUEST, None),
        (b"42", ErrorCode.INVALID_REQUEST, None),
        (b'"ping"', ErrorCode.INVALID_REQUEST, None),
        (b'{"id":1,"method":"ping"}', ErrorCode.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', ErrorCode.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1}', ErrorCode.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"method":7}', ErrorCode.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":1,"method":""}', ErrorCode.INVALID_REQUEST, 1),
        (b'{"jsonrpc":"2.0","id":null,"method":"ping"}', ErrorCode.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', ErrorCode.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":1.5,"method":"ping"}', ErrorCode.INVALID_REQUEST, None),
        (b'{"jsonrpc":"2.0","id":"x","method":"ping","params":[1]}', ErrorCode.INVALID_PARAMS, "x"),
        (b'{"jsonrpc":"2.0","id":"x","method":"ping","params":"p"}', ErrorCode.INVALID_PARAMS, "x"),
    ],
)
def test_malformed_messages_get_their_json_rpc_code(line: bytes, code: ErrorCode, request_id: object) -> None:
    with pytest.raises(RemoteProtocolError) as err:
        decode(line)
    assert err.value.code is code
    assert err.value.request_id == request_id


def test_encoded_messages_are_single_lines_of_utf8_json() -> None:
    data = jsonrpc.encode_result(1, {"text": "a\nb\u2028c\u00e9\ufffd"})
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    # UTF-8, not \\u escapes: a character costs its UTF-8 size (issue 31); only the
    # line separators some JavaScript readers split on stay escaped.
    assert "é\ufffd".encode() in data and b"\\u2028" in data and "\u2028".encode() not in data
    assert json.loads(data) == {"jsonrpc": "2.0", "id": 1, "result": {"text": "a\nb\u2028c\u00e9\ufffd"}}
    # Lone surrogates cannot be UTF-8: that line falls back to escapes.
    assert json.loads(jsonrpc.encode_result(2, {"text": "x\udc80"}))["result"]["text"] == "x\udc80"
    # Without a readable id the member is left out: the TypeScript SDK drops "id": null.
    assert json.loads(jsonrpc.encode_error(None, ErrorCode.PARSE_ERROR, "bad")) == {
        "jsonrpc": "2.0",
        "error": {"code": -32700, "message": "bad"},
    }


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_a_protocol_error(data: bytes) -> None:
    try:
        message = decode(data)
    except RemoteProtocolError as exc:
        assert exc.code in set(ErrorCode)
    else:
        assert isinstance(message, Request | Notification | Response)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(["jsonrpc", "id", "method", "params", "result", "error", "x"]), json_values))
def test_arbitrary_json_objects_decode_or_raise_a_protocol_error(obj: dict[str, object]) -> None:
    try:
        decode(json.dumps(obj).encode())
    except RemoteProtocolError:
        pass


def test_an_id_is_bounded_since_every_reply_echoes_it() -> None:
    assert decode(b'{"jsonrpc":"2.0","id":"' + b"i" * 1024 + b'","method":"ping"}') == Request("i" * 1024, "ping", {})
    with pytest.raises(RemoteProtocolError) as err:
        decode(b'{"jsonrpc":"2.0","id":"' + b"i" * 1025 + b'","method":"ping"}')
    assert err.value.code is ErrorCode.INVALID_REQUEST and err.value.request_id is None
    assert "at most 1024 characters" in err.value.message

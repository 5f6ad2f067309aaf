"""JSON-RPC 2.0 over newline-delimited stdio, with no I/O (the MCP stdio transport).

Bytes go in through `LineBuffer`, messages come out of `decode`; replies and
notifications are encoded to bytes for the shell to write.  Malformed input is
never an exception that escapes: `decode` raises only `RemoteProtocolError`,
which carries the JSON-RPC error code (-32700, -32600, -32602) and the request
ID when one could be recovered, so the shell can answer it and read on.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from airlock.common.codec import reject_constant

# A message is one line.  A tool call's arguments are bounded well below this
# (stdin at most 32 KiB, see tools.py), so 1 MiB is generous; it also bounds
# what a reply can echo back (an id), far under the clients' 10 MiB line limit.
MAX_LINE: Final = 1024 * 1024
# The longest string id taken (the SDKs send small integers).
MAX_ID_CHARS: Final = 1024
# How much of an over-long line is kept to find its id: the official Python
# SDK writes "id" before "params", the TypeScript SDK after it (at the end).
_SNIFF_BYTES: Final = 64 * 1024

RequestId = str | int


class ErrorCode(enum.IntEnum):
    PARSE_ERROR = -32700
    INVALID_REQUEST = -32600
    METHOD_NOT_FOUND = -32601
    INVALID_PARAMS = -32602
    INTERNAL_ERROR = -32603


class RemoteProtocolError(Exception):
    """The peer sent something that is not a valid JSON-RPC message."""

    def __init__(self, code: ErrorCode, message: str, request_id: RequestId | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Notification:
    method: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Response:
    """A reply from the peer (a result or an error); we send no requests, so it is only noted."""

    id: RequestId | None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


Message = Request | Notification | Response


@dataclass(frozen=True, slots=True)
class TooLong:
    """A line over the cap, skipped; ``request_id`` is its id when one could be read from its ends."""

    length: int
    request_id: RequestId | None


class LineBuffer:
    """stdin's lines, each at most ``max_line`` bytes (without its newline); an over-long line is skipped.

    ``next_line`` returns a line without its newline, a `TooLong` once the
    newline of a line that passed the cap arrives (its bytes are discarded as
    they come, except its first and last 64 KiB, where its id may be read, so
    the reply can name the call it answers), or None when more bytes are needed.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._buffer = bytearray()
        # While skipping an over-long line: its head, its last bytes so far, its length so far.
        self._head: bytes | None = None
        self._tail = b""
        self._skipped = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_line(self) -> bytes | TooLong | None:
        if self._head is not None:
            end = self._buffer.find(b"\n")
            if end < 0:
                self._skip(len(self._buffer))
                return None
            self._skip(end)
            del self._buffer[:1]
            head, tail, length = self._head, self._tail, self._skipped
            self._head, self._tail, self._skipped = None, b"", 0
            return TooLong(length, sniff_id(head, tail))
        end = self._buffer.find(b"\n", 0, self.max_line + 1)
        if end >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            return line
        if len(self._buffer) > self.max_line:
            self._head = bytes(self._buffer[: min(_SNIFF_BYTES, self.max_line + 1)])
            self._tail = b""
            self._skipped = 0
            return self.next_line()
        return None

    def _skip(self, count: int) -> None:
        self._tail = (self._tail + bytes(self._buffer[:count]))[-_SNIFF_BYTES:]
        self._skipped += count
        del self._buffer[:count]

    def end_of_stream(self) -> bytes | None:
        """The peer closed its side: a last line without a newline is still a message."""
        if self._head is not None:
            return None
        rest = bytes(self._buffer)
        return rest if rest.strip() else None


# An id value as JSON: an integer, or a string without control characters.
_ID_VALUE: Final = rb'(-?[0-9]{1,18}|"(?:[^"\\\x00-\x1f]|\\.){0,1024}")'
# The TypeScript SDK's order: {method, params, jsonrpc, id}: the id closes the line.
_TAIL_ID: Final = re.compile(rb'"id"\s*:\s*' + _ID_VALUE + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')
_COLON_ID: Final = re.compile(rb"\s*:\s*" + _ID_VALUE)


def sniff_id(head: bytes, tail: bytes = b"") -> RequestId | None:
    """The top-level id of a line that could not be decoded whole, from its first and last bytes.

    At the start, the "id" member at depth 1 (the Python SDK writes it before
    "params"); at the end, an "id" member that the line's last brace closes (the
    TypeScript SDK writes it last).  A nested "id" (a tool argument) is never taken.
    """
    found = _head_id(head)
    if found is None:
        match = _TAIL_ID.search(tail or head)
        if match is not None:
            found = _id_value(match.group(1))
    return found


def _id_value(raw: bytes) -> RequestId | None:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if _valid_id(value) else None


def _head_id(head: bytes) -> RequestId | None:
    """Scan the first bytes of an object for its own "id" member (depth 1, in key position)."""
    depth = 0
    i = 0
    expect_key = False
    n = len(head)
    while i < n:
        c = head[i]
        if c == 0x22:  # a string: skip it whole, noting a key "id" at depth 1
            j = i + 1
            while j < n and head[j] != 0x22:
                j += 2 if head[j] == 0x5C else 1
            if j >= n:
                return None
            if depth == 1 and expect_key and head[i : j + 1] == b'"id"':
                match = _COLON_ID.match(head, j + 1)
                return _id_value(match.group(1)) if match else None
            expect_key = False
            i = j + 1
            continue
        if c in b"{[":
            depth += 1
            expect_key = c == 0x7B
        elif c in b"}]":
            depth -= 1
            expect_key = False
        elif c == 0x2C:  # a comma: a key comes next inside an object
            expect_key = True
        elif c not in b" \t\r\n:":
            expect_key = False
        i += 1
    return None


def _valid_id(value: Any) -> bool:
    # MCP: a string or an integer, never null; a bool is not an integer here.
    # Every reply echoes the id: bounded, so no reply line can grow with it.
    if isinstance(value, str):
        return len(value) <= MAX_ID_CHARS
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2**63


def decode(line: bytes) -> Message:
    """One line (without its newline) into a message, or `RemoteProtocolError`."""
    # A line that does not parse still names its call when its id can be read:
    # a client matches an error to its request by id, and waits out its own
    # timeout for one it cannot match.
    try:
        untrusted = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(
            ErrorCode.PARSE_ERROR, f"parse error: not valid UTF-8 (byte {exc.start})", _sniff(line)
        ) from None
    except RecursionError:
        raise RemoteProtocolError(ErrorCode.PARSE_ERROR, "parse error: JSON nested too deeply", _sniff(line)) from None
    except ValueError as exc:
        raise RemoteProtocolError(
            ErrorCode.PARSE_ERROR, f"parse error: {str(exc).splitlines()[0][:200]}", _sniff(line)
        ) from None
    if isinstance(untrusted, list):
        raise RemoteProtocolError(ErrorCode.INVALID_REQUEST, "invalid request: JSON-RPC batches are not supported")
    if not isinstance(untrusted, dict):
        raise RemoteProtocolError(ErrorCode.INVALID_REQUEST, "invalid request: a message must be a JSON object")
    raw_id = untrusted.get("id")
    request_id = raw_id if _valid_id(raw_id) else None
    if untrusted.get("jsonrpc") != "2.0":
        raise RemoteProtocolError(ErrorCode.INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"', request_id)
    if "method" not in untrusted:
        if "result" in untrusted or "error" in untrusted:
            result, error = untrusted.get("result"), untrusted.get("error")
            return Response(
                request_id,
                result if isinstance(result, dict) else None,
                error if isinstance(error, dict) else None,
            )
        raise RemoteProtocolError(ErrorCode.INVALID_REQUEST, 'invalid request: missing "method"', request_id)
    method = untrusted["method"]
    if not isinstance(method, str) or not method:
        raise RemoteProtocolError(
            ErrorCode.INVALID_REQUEST, 'invalid request: "method" must be a non-empty string', request_id
        )
    if "id" in untrusted and request_id is None:
        raise RemoteProtocolError(
            ErrorCode.INVALID_REQUEST,
            f'invalid request: "id" must be a string of at most {MAX_ID_CHARS} characters or an integer',
        )
    params = untrusted.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        # JSON-RPC allows by-position params; MCP never uses them.
        raise RemoteProtocolError(ErrorCode.INVALID_PARAMS, 'invalid params: "params" must be an object', request_id)
    if request_id is None:
        return Notification(method, params)
    return Request(request_id, method, params)


def _sniff(line: bytes) -> RequestId | None:
    return sniff_id(line[:_SNIFF_BYTES], line[-_SNIFF_BYTES:])


def _line(obj: dict[str, Any]) -> bytes:
    """One message as a UTF-8 line: text costs its UTF-8 size, not six bytes a character.

    json escapes newlines and control characters inside strings, so a line
    never holds a raw newline (the MCP stdio transport forbids them); U+2028
    and U+2029, which some JavaScript line readers split on, are escaped too.
    Text with lone surrogates (not encodable as UTF-8) falls back to ASCII
    escapes for that line, which every JSON reader decodes.
    """
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def encode_result(request_id: RequestId, result: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "result": result})


def encode_error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    """An error reply; without a readable id the "id" member is left out.

    MCP 2025-11-25 makes an error's id optional, and the TypeScript SDK rejects
    (drops) an error with ``"id": null``; the Python SDK ignores one it cannot
    match either way.  Every error whose id could be read carries it.
    """
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    if request_id is None:
        return _line({"jsonrpc": "2.0", "error": error})
    return _line({"jsonrpc": "2.0", "id": request_id, "error": error})


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "method": method, "params": params})

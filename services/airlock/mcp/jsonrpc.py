"""JSON-RPC 2.0 over newline-delimited stdio, with no I/O (the MCP stdio transport).

Bytes go in through `LineBuffer`, messages come out of `decode`; replies and
notifications are encoded to bytes for the shell to write.  Malformed input is
never an exception that escapes: `decode` raises only `RemoteProtocolError`,
which carries the JSON-RPC error code (-32700, -32600, -32602) and the request
ID when one could be recovered, so the shell can answer it and read on.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Final

from airlock.common.codec import reject_constant
from airlock.common.errors import AirlockError
from airlock.common.framing import FrameDecoder

# A message is one line; stdin for a command travels inside one, so the cap is
# generous but bounded (the agent door's own cap is 1 MiB per request).
MAX_LINE: Final = 8 * 1024 * 1024

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


class TooLong(enum.Enum):
    TOO_LONG = "too_long"


TOO_LONG: Final = TooLong.TOO_LONG


class LineBuffer:
    """stdin's lines (`FrameDecoder`, skipping an overlong line); an over-long line is skipped, not fatal.

    ``next_line`` returns a line without its newline, `TOO_LONG` once for a line
    that passed the cap (the rest of it is discarded up to its newline, so the
    stream stays usable), or None when more bytes are needed.  The cap counts
    the line without its newline.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._decoder = FrameDecoder(max_line + 1, skip_overlong=True)

    def feed(self, data: bytes) -> None:
        self._decoder.feed(data)

    def next_line(self) -> bytes | TooLong | None:
        try:
            frame = self._decoder.next_frame()
        except AirlockError:
            return TOO_LONG
        return frame if isinstance(frame, bytes) else None

    def end_of_stream(self) -> bytes | None:
        """The peer closed its side: a last line without a newline is still a message."""
        rest = self._decoder.rest()
        return rest if rest.strip() else None


def _valid_id(value: Any) -> bool:
    # MCP: a string or an integer, never null; a bool is not an integer here.
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def decode(line: bytes) -> Message:
    """One line (without its newline) into a message, or `RemoteProtocolError`."""
    try:
        untrusted = json.loads(line.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(ErrorCode.PARSE_ERROR, f"parse error: not valid UTF-8 (byte {exc.start})") from None
    except RecursionError:
        raise RemoteProtocolError(ErrorCode.PARSE_ERROR, "parse error: JSON nested too deeply") from None
    except ValueError as exc:
        raise RemoteProtocolError(ErrorCode.PARSE_ERROR, f"parse error: {str(exc).splitlines()[0][:200]}") from None
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
        raise RemoteProtocolError(ErrorCode.INVALID_REQUEST, 'invalid request: "id" must be a string or an integer')
    params = untrusted.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        # JSON-RPC allows by-position params; MCP never uses them.
        raise RemoteProtocolError(ErrorCode.INVALID_PARAMS, 'invalid params: "params" must be an object', request_id)
    if request_id is None:
        return Notification(method, params)
    return Request(request_id, method, params)


def _line(obj: dict[str, Any]) -> bytes:
    # ensure_ascii keeps every line free of raw U+2028 and friends that some
    # line readers split on; the MCP stdio transport forbids embedded newlines.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=True).encode() + b"\n"


def encode_result(request_id: RequestId, result: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "id": request_id, "result": result})


def encode_error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": int(code), "message": message}
    if data is not None:
        error["data"] = data
    return _line({"jsonrpc": "2.0", "id": request_id, "error": error})


def encode_notification(method: str, params: dict[str, Any]) -> bytes:
    return _line({"jsonrpc": "2.0", "method": method, "params": params})

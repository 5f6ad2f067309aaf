"""The native v1 envelope, with no I/O (line framing is `common.framing`).

Bytes go in, messages come out; messages go in, bytes come out.  Services only
move bytes between this module and their sockets (h11's split).  A frame is one
UTF-8 JSON object ending in exactly ``\\n``; the length cap is checked before
anything is parsed, and each way a line can be wrong is its own error code.

Pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from airlock.common import validate
from airlock.common.errors import AirlockError, ErrorCode

PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = (1,)


def reject_constant(name: str) -> Any:
    """``json.loads(..., parse_constant=reject_constant)``: NaN and infinities are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


_DECODER: Final = json.JSONDecoder(parse_constant=reject_constant)  # built once (issue 50); stateless


def iso_utc(seconds: float | None = None, *, timespec: str = "milliseconds") -> str:
    """A moment as airlock writes it everywhere: ISO 8601 in UTC, ending in ``Z`` (now, without ``seconds``)."""
    moment = datetime.now(UTC) if seconds is None else datetime.fromtimestamp(seconds, UTC)
    return moment.isoformat(timespec=timespec).replace("+00:00", "Z")


def parse_iso(value: object) -> float | None:
    """An ISO 8601 time (as `iso_utc` writes it, or with an offset) as Unix seconds; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def parse_object(line: bytes) -> dict[str, Any]:
    """Decode one line (without its newline) into a JSON object."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise AirlockError(
            ErrorCode.INVALID_UTF8, f"request is not valid UTF-8 (byte {exc.start})", {"offset": exc.start}
        ) from None
    if text.endswith("\r"):
        # A CRLF line ending is not "exactly \n"; say so instead of a JSON error.
        raise AirlockError(ErrorCode.INVALID_REQUEST, "request line must end with \\n, not \\r\\n")
    try:
        # json.loads with a keyword builds a decoder per call; ours is built once (issue 50).  A line
        # starting with a BOM goes to json.loads, which refuses it in its own words before parsing.
        value = json.loads(text) if text.startswith("\ufeff") else _DECODER.decode(text)
    except RecursionError:
        raise AirlockError(ErrorCode.INVALID_JSON, "request JSON is nested too deeply") from None
    except ValueError as exc:
        raise AirlockError(ErrorCode.INVALID_JSON, f"invalid JSON: {_short(exc)}") from None
    if not isinstance(value, dict):
        raise AirlockError(ErrorCode.INVALID_REQUEST, f"request must be a JSON object, not {_json_type(value)}")
    return value


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:200]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def recover_id(obj: Any) -> str | None:
    """The request ID to echo in an error, when one can be recovered (and is a valid one: a refused ID
    is not echoed)."""
    if isinstance(obj, dict):
        value = obj.get("id")
        if validate.is_request_id(value):
            return str(value)
    return None


@dataclass(frozen=True, slots=True)
class Request:
    """One native v1 request envelope: ``{"v":1,"id":…,"verb":…,"args":{…},"token":…}``."""

    id: str | None
    verb: str
    args: dict[str, Any] = field(default_factory=dict)
    token: str | None = None
    v: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        if self.v not in SUPPORTED_VERSIONS:
            raise AirlockError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"protocol version {self.v!r} is not supported",
                {"supported": list(SUPPORTED_VERSIONS), "received": self.v},
            )
        if self.id is not None:
            # Issue 28: one rule for every door, so no ID can be live in a shell line, markup or terminal.
            validate.request_id("id", self.id, ErrorCode.INVALID_REQUEST)
        if not isinstance(self.verb, str) or not self.verb or len(self.verb) > 64:
            raise AirlockError(ErrorCode.INVALID_REQUEST, "verb must be a non-empty string")
        if not isinstance(self.args, dict):
            raise AirlockError(ErrorCode.INVALID_REQUEST, "args must be an object")
        if self.token is not None and not isinstance(self.token, str):
            raise AirlockError(ErrorCode.INVALID_REQUEST, "token must be a string or null")

    def to_dict(self) -> dict[str, Any]:
        return {"v": self.v, "id": self.id, "verb": self.verb, "args": self.args, "token": self.token}


_ENVELOPE_KEYS = frozenset({"v", "id", "verb", "args", "token"})


def request_from_object(untrusted: dict[str, Any]) -> Request:
    """Validate a decoded object as a native request envelope."""
    # A missing version is "any other version" (reference/004): the client
    # learns which versions exist instead of guessing what it did wrong.
    version = untrusted.get("v")
    if isinstance(version, bool) or not isinstance(version, int) or version not in SUPPORTED_VERSIONS:
        raise AirlockError(
            ErrorCode.UNSUPPORTED_VERSION,
            "missing field 'v' (protocol version)"
            if version is None
            else f"protocol version {version!r} is not supported",
            {"supported": list(SUPPORTED_VERSIONS), "received": version},
        )
    unknown = sorted(set(untrusted) - _ENVELOPE_KEYS)
    if unknown:
        raise AirlockError(ErrorCode.INVALID_REQUEST, f"unknown envelope field '{unknown[0]}'", {"fields": unknown})
    if "verb" not in untrusted:
        raise AirlockError(ErrorCode.INVALID_REQUEST, "missing field 'verb'")
    args = untrusted.get("args", {})
    if args is None:
        args = {}
    return Request(
        id=untrusted.get("id"),
        verb=untrusted["verb"],
        args=args,
        token=untrusted.get("token"),
        v=version,
    )


def decode_request(line: bytes) -> Request:
    """Decode one native line into a `Request`, or raise an `AirlockError`.

    To echo the request ID in an error, parse with `parse_object` first and
    call `recover_id` on the result.
    """
    return request_from_object(parse_object(line))


# Built once: json.dumps and json.loads with keywords build an encoder or decoder per call, several
# per request in every service (issue 50).  Both are stateless between calls.
_CANONICAL: Final = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_COMPACT: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    return _CANONICAL.encode(value).encode()


def _line(obj: dict[str, Any]) -> bytes:
    return _COMPACT.encode(obj).encode() + b"\n"


def encode_ok(request_id: str | None, data: dict[str, Any]) -> bytes:
    return _line({"id": request_id, "ok": True, "data": data})


def encode_error(request_id: str | None, error: AirlockError) -> bytes:
    return _line({"id": request_id, "ok": False, "error": error.to_dict()})


def encode_event(request_id: str | None, event: str, seq: int, fields: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {"id": request_id, "event": event, "seq": seq}
    for key, value in fields.items():
        if key not in body:
            body[key] = value
    return _line(body)


def encode_request(request: Request) -> bytes:
    return _line(request.to_dict())


@dataclass(frozen=True, slots=True)
class Response:
    """A decoded final response (what a client reads)."""

    id: str | None
    ok: bool
    data: dict[str, Any] | None = None
    error: AirlockError | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """A decoded event line that precedes a final response."""

    id: str | None
    event: str
    seq: int
    fields: dict[str, Any]


def decode_reply(line: bytes) -> Response | Event:
    """Decode one line a server wrote: an event line or the final response."""
    obj = parse_object(line)
    if "event" in obj:
        event, seq = obj.get("event"), obj.get("seq")
        if not isinstance(event, str) or isinstance(seq, bool) or not isinstance(seq, int):
            raise AirlockError(ErrorCode.INVALID_REQUEST, "malformed event line")
        rest = {k: v for k, v in obj.items() if k not in ("id", "event", "seq")}
        return Event(id=obj.get("id"), event=event, seq=seq, fields=rest)
    ok = obj.get("ok")
    if ok is True and isinstance(obj.get("data"), dict) and "error" not in obj:
        return Response(id=obj.get("id"), ok=True, data=obj["data"])
    if ok is False and isinstance(obj.get("error"), dict) and "data" not in obj:
        err = obj["error"]
        try:
            code = ErrorCode(err.get("code"))
        except ValueError:
            code = ErrorCode.INTERNAL
        message = err.get("message") if isinstance(err.get("message"), str) else "unknown error"
        details = err.get("details") if isinstance(err.get("details"), dict) else {}
        return Response(id=obj.get("id"), ok=False, error=AirlockError(code, message, details))
    raise AirlockError(ErrorCode.INVALID_REQUEST, "malformed response envelope")

"""The gateway dialect (reference/001) with no I/O.

Lines go in, requests (or a `GatewayError` carrying the recovered request ID)
come out; results, errors and events go in, frames come out.  The stdio shell
(`gateway/stdio.py`) only moves bytes between this module, stdin/stdout and
the agent door; each method's params are checked in `gateway/params`.

Shapes follow reference/001: a request is ``{"id","method","params"}``; a
response is ``{"type":"response","requestId",…,"ok",…,"result"|"error"}``;
events are ``{"type":"event","event":…,"requestId","operationId",…}``.  Every
outgoing frame is at most `MAX_FRAME_BYTES` encoded (envelope, escaping, UTF-8
and newline included): process text is shortened to fit and says so
(``truncated``/``transportTruncated``); anything else that cannot fit becomes an
explicit ``output_frame_too_large`` error rather than being cut.

Pure: no I/O.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from airlock import __version__
from airlock.common import validate
from airlock.common.codec import reject_constant
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.framing import NEED_DATA, FrameDecoder

PROTOCOL_VERSION: Final = "1.0"
TRANSPORT: Final = "stdio-jsonl"
MAX_FRAME_BYTES: Final = 2 * 1024 * 1024
MAX_REQUEST_BYTES: Final = 4 * 1024 * 1024
DEFAULT_TIMEOUT_MS: Final = 30_000
DEFAULT_MAX_OUTPUT_BYTES: Final = 1024 * 1024
METHODS: Final = ("hello", "health", "telemetry.configure", "process.exec", "filesystem.execute", "cancel", "shutdown")


RequestId = str | int | None


class Code(enum.StrEnum):
    """Error codes of the dialect: reference/001's own names, then airlock's."""

    INVALID_JSON = "invalid_json"
    INVALID_REQUEST = "invalid_request"
    UNKNOWN_METHOD = "unknown_method"
    INVALID_PARAMS = "invalid_params"
    REQUEST_TOO_LARGE = "request_too_large"
    OUTPUT_FRAME_TOO_LARGE = "output_frame_too_large"
    OPERATION_ID_CONFLICT = "operation_id_conflict"
    OPERATION_IN_PROGRESS = "operation_in_progress"
    PROTECTED_REDELIVERY_FORBIDDEN = "protected_redelivery_forbidden"
    SHUTTING_DOWN = "shutting_down"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal"


# Native codes that have a dialect name of their own; every other native code
# (denied, approval_timeout, spawn_failed, ...) passes through unchanged, so a
# controller sees why airlock refused.
_NATIVE_TO_DIALECT: Final[dict[ErrorCode, str]] = {
    ErrorCode.INVALID_ARGUMENTS: Code.INVALID_PARAMS,
    ErrorCode.INVALID_REQUEST: Code.INVALID_REQUEST,
    ErrorCode.INVALID_JSON: Code.INVALID_JSON,
    ErrorCode.UNKNOWN_VERB: Code.UNKNOWN_METHOD,
    ErrorCode.OPERATION_ID_CONFLICT: Code.OPERATION_ID_CONFLICT,
    ErrorCode.CONFLICT: Code.OPERATION_ID_CONFLICT,
    ErrorCode.OPERATION_IN_PROGRESS: Code.OPERATION_IN_PROGRESS,
    ErrorCode.PROTECTED_REDELIVERY_FORBIDDEN: Code.PROTECTED_REDELIVERY_FORBIDDEN,
    ErrorCode.REQUEST_TOO_LARGE: Code.REQUEST_TOO_LARGE,
    ErrorCode.INTERNAL: Code.INTERNAL,
}


class GatewayError(Exception):
    """A refusal reported to the controller as ``{"code","message","details"}``."""

    def __init__(
        self, code: str, message: str, details: dict[str, Any] | None = None, request_id: RequestId = None
    ) -> None:
        super().__init__(message)
        self.code = str(code)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"GatewayError({self.code!r}, {self.message!r})"

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


def from_native(exc: AirlockError) -> GatewayError:
    """A native (agent door) error in the dialect's names; message and details kept."""
    code = _NATIVE_TO_DIALECT.get(exc.code, exc.code.value)
    details = dict(exc.details)
    if code != exc.code.value:
        details.setdefault("nativeCode", exc.code.value)
    return GatewayError(code, exc.message, details)


def invalid(field_name: str, message: str) -> GatewayError:
    return GatewayError(Code.INVALID_PARAMS, f"{field_name}: {message}", {"field": field_name})


# --- requests ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    id: RequestId
    method: str
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.id is not None and (
            isinstance(self.id, bool) or not isinstance(self.id, (str, int)) or len(str(self.id)) > 1024
        ):
            raise GatewayError(Code.INVALID_REQUEST, "id must be a string (or integer) of at most 1024 characters")
        if not isinstance(self.method, str) or not self.method:
            raise GatewayError(Code.INVALID_REQUEST, "method must be a non-empty string", request_id=self.id)
        if not isinstance(self.params, dict):
            raise GatewayError(Code.INVALID_REQUEST, "params must be an object", request_id=self.id)


_ID_IN_BYTES = re.compile(rb'"id"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.){0,1024}"|-?\d{1,30})')


def recover_id(raw: bytes) -> RequestId:
    """The request ID in a line that is not valid JSON, when it can be read."""
    match = _ID_IN_BYTES.search(raw)
    if match is None:
        return None
    try:
        value = json.loads(match.group(1).decode("utf-8"))
    except (ValueError, UnicodeDecodeError):
        return None
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def parse_request(line: bytes) -> Request:
    """One line (without its newline) into a `Request`, or a `GatewayError` naming the request ID it could find."""
    try:
        text = line.decode("utf-8")
        untrusted = json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise GatewayError(
            Code.INVALID_JSON, "request JSON is nested too deeply", request_id=recover_id(line)
        ) from None
    except UnicodeDecodeError as exc:
        raise GatewayError(
            Code.INVALID_JSON, f"request is not valid UTF-8 (byte {exc.start})", request_id=recover_id(line)
        ) from None
    except ValueError as exc:
        reason = str(exc).splitlines()[0][:200] if str(exc) else "malformed"
        raise GatewayError(
            Code.INVALID_JSON, f"request is not valid JSON: {reason}", request_id=recover_id(line)
        ) from None
    if not isinstance(untrusted, dict):
        raise GatewayError(Code.INVALID_REQUEST, "request must be a JSON object")
    raw_id = untrusted.get("id")
    # Echoed as given (a string, or an integer some controllers use).
    request_id = raw_id if isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) else None
    if raw_id is not None and request_id is None:
        raise GatewayError(Code.INVALID_REQUEST, "id must be a string")
    params = untrusted.get("params")
    _displayed(untrusted, request_id)
    return Request(id=request_id, method=untrusted.get("method"), params={} if params is None else params)  # type: ignore[arg-type]


# The params whose strings are content (a file's, a search pattern), not text shown as it is (issue 45).
CONTENT_PARAMS: Final = frozenset({"content", "contentBase64", "oldText", "newText", "oldString", "newString", "query"})


def _displayed(untrusted: dict[str, Any], request_id: RequestId) -> None:
    """Issue 45: no control, bidi or zero-width character in any field a person may read (common/validate)."""
    try:
        validate.displayed({k: v for k, v in untrusted.items() if k != "params"}, exempt=frozenset())
        if isinstance(untrusted.get("params"), dict):
            validate.displayed(untrusted["params"], exempt=CONTENT_PARAMS, field="params")
    except AirlockError as exc:
        echoed = None if exc.details.get("field") == "id" else request_id  # an ID with one is not echoed
        raise GatewayError(Code.INVALID_PARAMS, exc.message, exc.details, request_id=echoed) from None


class LineReader:
    """stdin's request lines (`FrameDecoder`, skipping an overlong line), errors in the gateway's dialect."""

    def __init__(self, max_bytes: int = MAX_REQUEST_BYTES) -> None:
        self.max_bytes = max_bytes
        self._decoder = FrameDecoder(max_bytes, skip_overlong=True)

    def feed(self, data: bytes) -> None:
        self._decoder.feed(data)

    def next_line(self) -> bytes | GatewayError | None:
        """The next line, a `GatewayError` for an overlong one, or None when more bytes are needed."""
        try:
            frame = self._decoder.next_frame()
        except AirlockError:
            return GatewayError(
                Code.REQUEST_TOO_LARGE,
                f"request exceeds {self.max_bytes} bytes",
                {"limitBytes": self.max_bytes},
                request_id=recover_id(self._decoder.peek(4096)),
            )
        if frame is NEED_DATA:
            return None
        assert isinstance(frame, bytes)
        return frame.removesuffix(b"\r")

    def leftover(self) -> bytes:
        return self._decoder.rest()


# --- outgoing frames --------------------------------------------------------------


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n"


def _too_large(request_id: RequestId, size: int) -> bytes:
    error = GatewayError(
        Code.OUTPUT_FRAME_TOO_LARGE,
        f"the reply would be {size} bytes; frames are limited to {MAX_FRAME_BYTES} bytes",
        {"limitBytes": MAX_FRAME_BYTES, "frameBytes": size},
    )
    return _encode({"type": "response", "requestId": request_id, "ok": False, "error": error.to_dict()})


def encode_error(request_id: RequestId, error: GatewayError) -> bytes:
    frame = _encode({"type": "response", "requestId": request_id, "ok": False, "error": error.to_dict()})
    return frame if len(frame) <= MAX_FRAME_BYTES else _too_large(request_id, len(frame))


def encode_result(request_id: RequestId, result: dict[str, Any]) -> bytes:
    """A successful response; process text shortened to fit, else output_frame_too_large."""
    frame = _encode({"type": "response", "requestId": request_id, "ok": True, "result": result})
    if len(frame) <= MAX_FRAME_BYTES:
        return frame
    fitted = fit_text(result, lambda r: _encode({"type": "response", "requestId": request_id, "ok": True, "result": r}))
    return fitted if fitted is not None else _too_large(request_id, len(frame))


def encode_event(event: str, request_id: RequestId, fields: dict[str, Any]) -> bytes | None:
    """An event frame; None when it cannot fit (the caller reports it in the response)."""

    def build(f: dict[str, Any]) -> bytes:
        return _encode({"type": "event", "event": event, "requestId": request_id} | f)

    frame = build(fields)
    if len(frame) <= MAX_FRAME_BYTES:
        return frame
    return fit_text(fields, build)


def encode_accepted(request_id: RequestId, operation_id: str, extra: dict[str, Any] | None = None) -> bytes:
    return _encode(
        {"type": "accepted", "requestId": request_id, "operationId": operation_id, "protocolVersion": PROTOCOL_VERSION}
        | (extra or {})
    )


_TEXT_FIELDS: Final = (
    ("stdout", "stdoutSha256"),
    ("stderr", "stderrSha256"),
    ("data", None),
    ("content", "contentSha256"),
)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fit_text(obj: dict[str, Any], build: Any) -> bytes | None:
    """Shorten the text fields of ``obj`` until ``build(obj)`` fits a frame.

    Marks the result ``truncated``/``transportTruncated`` and recomputes the
    digests so they describe the delivered text (reference/001).  None when even
    empty text does not fit: the caller answers output_frame_too_large.
    """
    present = [(name, digest) for name, digest in _TEXT_FIELDS if isinstance(obj.get(name), str) and obj[name]]
    if not present:
        return None
    current = dict(obj)
    for _ in range(64):
        frame: bytes = build(current)
        excess = len(frame) - MAX_FRAME_BYTES
        if excess <= 0:
            return frame
        # Cut the longest text by its share of the excess (escaping makes a
        # character cost up to 6 bytes on the wire, so shrink generously).
        name, digest = max(present, key=lambda p: len(current.get(p[0], "")))
        text: str = current[name]
        if not text:
            return None
        encoded_len = len(json.dumps(text, ensure_ascii=False).encode("utf-8"))
        ratio = max(0.0, 1 - (excess + 64) / max(encoded_len, 1))
        current[name] = text[: int(len(text) * ratio)]
        if digest is not None:
            current[digest] = sha256_text(current[name])
        current["truncated"] = True
        current["transportTruncated"] = True
        if name in ("stdout", "stderr"):
            current[f"{name}Truncated"] = True
        if name == "content":
            current["incomplete"] = True
            current["nextOffsetBytes"] = None
            current.pop("fingerprint", None)
    return None


# --- results ----------------------------------------------------------------------


def hello(name: str = "airlock") -> dict[str, Any]:
    return {
        "name": name,
        "version": __version__,
        "protocolVersion": PROTOCOL_VERSION,
        "transport": TRANSPORT,
        "methods": list(METHODS),
    }


def health(active: list[str], *, shutting_down: bool) -> dict[str, Any]:
    return {
        "status": "stopping" if shutting_down else "ok",
        "activeOperations": sorted(active),
        "activeOperationIds": sorted(active),
    }

"""The gateway dialect (reference/001) with no I/O.

Lines go in, requests (or a `GatewayError` carrying the recovered request ID)
come out; results, errors and events go in, frames come out.  The stdio shell
(`gateway/stdio.py`) only moves bytes between this module, stdin/stdout and
the agent door.

Shapes follow reference/001: a request is ``{"id","method","params"}``; a
response is ``{"type":"response","requestId",…,"ok",…,"result"|"error"}``;
events are ``{"type":"event","event":…,"requestId","operationId",…}``.  Every
outgoing frame is at most `MAX_FRAME_BYTES` encoded (envelope, escaping, UTF-8
and newline included): process text is shortened to fit and says so
(``truncated``/``transportTruncated``); anything else that cannot fit becomes an
explicit ``output_frame_too_large`` error rather than being cut.
"""

from __future__ import annotations

import enum
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

from airlock import __version__
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
    return Request(id=request_id, method=untrusted.get("method"), params={} if params is None else params)  # type: ignore[arg-type]


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


# --- params --------------------------------------------------------------------


def _positive_int(name: str, value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid(name, "must be a positive integer")
    return value


def _string(name: str, value: Any, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise invalid(name, "must be a non-empty string")
    return value


def _coerce_env_value(name: str, value: Any) -> str:
    """Environment values are string-coerced, as reference/001's JavaScript host does (String(v))."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() and abs(value) < 1e21 else repr(value)
    raise invalid(f"env.{name}", "must be a string, number or boolean")


def _env(name: str, value: Any, *, coerce: bool) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid(name, "must be an object")
    out = {}
    for key, item in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise invalid(name, f"{key!r} is not a valid environment variable name")
        if coerce:
            out[key] = _coerce_env_value(key, item)
        elif not isinstance(item, str) or not item:
            raise invalid(f"{name}.{key}", "must be a non-empty string")
        else:
            out[key] = item
    return out


_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A validated W3C trace context (version 00): transport context only, never the child's."""

    traceparent: str
    tracestate: str | None = None

    def __post_init__(self) -> None:
        match = _TRACEPARENT.fullmatch(self.traceparent)
        if match is None:
            raise invalid(
                "traceContext.traceparent", "must be 00-<32 hex>-<16 hex>-<2 hex> (lowercase, W3C version 00)"
            )
        if set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
            raise invalid("traceContext.traceparent", "trace ID and parent ID must not be all zeros")
        if self.tracestate is not None and (
            len(self.tracestate) > 512 or not re.fullmatch(r"[\x20-\x7e]*", self.tracestate)
        ):
            raise invalid("traceContext.tracestate", "must be printable ASCII of at most 512 characters")

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        return self.traceparent[36:52]

    @property
    def sampled(self) -> bool:
        return bool(int(self.traceparent[53:55], 16) & 1)

    def log_fields(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"trace_id": self.trace_id, "span_id": self.span_id, "trace_sampled": self.sampled}
        if self.tracestate:
            fields["tracestate"] = self.tracestate
        return fields


def parse_trace_context(value: Any) -> TraceContext | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid("traceContext", "must be an object with traceparent and optional tracestate")
    unknown = sorted(set(value) - {"traceparent", "tracestate"})
    if unknown:
        raise invalid(f"traceContext.{unknown[0]}", "unknown field")
    traceparent = value.get("traceparent")
    tracestate = value.get("tracestate")
    if not isinstance(traceparent, str):
        raise invalid("traceContext.traceparent", "must be a string")
    if tracestate is not None and not isinstance(tracestate, str):
        raise invalid("traceContext.tracestate", "must be a string")
    return TraceContext(traceparent, tracestate or None)


@dataclass(frozen=True, slots=True)
class Telemetry:
    """Validated telemetry settings, held in memory; header values never leave this object."""

    enabled: bool = False
    endpoint: str | None = None
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    def status(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "endpoint": self.endpoint, "headersConfigured": bool(self.headers)}


def parse_telemetry(params: dict[str, Any]) -> Telemetry:
    enabled = params.get("enabled")
    if not isinstance(enabled, bool):
        raise invalid("enabled", "must be true or false")
    endpoint = params.get("endpoint")
    if endpoint is not None or enabled:
        if (
            not isinstance(endpoint, str)
            or not re.fullmatch(r"https?://[^\s/@]+(/[^\s]*)?", endpoint)
            or len(endpoint) > 2048
        ):
            raise invalid("endpoint", "must be an http(s) URL without credentials")
    headers = params.get("headers")
    if headers is None:
        headers = {}
    if not isinstance(headers, dict) or not all(
        isinstance(k, str)
        and re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+", k)
        and isinstance(v, str)
        and "\n" not in v
        and "\r" not in v
        for k, v in headers.items()
    ):
        raise invalid("headers", "must be an object of header names to string values")
    return Telemetry(enabled, endpoint, dict(headers))


@dataclass(frozen=True, slots=True)
class ExecParams:
    """A validated ``process.exec``; `to_native` makes the agent door's exec args."""

    executable: str | None
    args: tuple[str, ...]
    command: str | None
    cwd: str | None
    env: dict[str, str]
    timeout_ms: int
    deadline_ms: int | None
    max_output_bytes: int
    operation_id: str | None
    protected: dict[str, str] = field(repr=False, default_factory=dict)
    trace: TraceContext | None = None

    @property
    def form(self) -> str:
        return "command" if self.command is not None else "executable"

    def to_native(self, *, privileged: bool, default_cwd: str | None, time: str) -> dict[str, Any]:
        """Native exec args.  The trace context is left out on purpose: it is
        transport context, so it neither reaches the child nor changes the
        derived operation ID (reference/001)."""
        args: dict[str, Any] = {
            "privileged": privileged,
            "timeout_ms": self.timeout_ms,
            # One byte over the combined cap: the gateway must see the overflow
            # happen to terminate the job (a per-stream cap of exactly the
            # limit would truncate silently and let the job run on).
            "max_output_bytes": self.max_output_bytes + 1,
            "time": time,
            "stream": True,
        }
        if self.command is not None:
            args["command"] = self.command
        else:
            assert self.executable is not None
            args["argv"] = [self.executable, *self.args]
        cwd = self.cwd if self.cwd is not None else default_cwd
        if cwd is not None:
            args["cwd"] = cwd
        if self.env:
            args["env"] = dict(self.env)
        if self.protected:
            args["protected_env"] = dict(self.protected)
        if self.deadline_ms is not None:
            args["deadline_ms"] = self.deadline_ms
        if self.operation_id is not None:
            args["operation_id"] = self.operation_id
        return args


def parse_exec(params: dict[str, Any]) -> ExecParams:
    executable = params.get("executable")
    command = params.get("command")
    raw_args = params.get("args")
    if command is not None and (executable is not None or raw_args not in (None, [])):
        raise invalid("command", "cannot be combined with executable or a nonempty args array")
    if command is None and executable is None:
        raise invalid("executable", "give exactly one of executable (with args) or command")
    if command is not None:
        if not isinstance(command, str) or not command:
            raise invalid("command", "must be a non-empty string")
    else:
        if not isinstance(executable, str) or not executable:
            raise invalid("executable", "must be a non-empty string")
    args: tuple[str, ...] = ()
    if raw_args is not None:
        if not isinstance(raw_args, list) or not all(isinstance(a, str) for a in raw_args):
            raise invalid("args", "must be an array of strings")
        args = tuple(raw_args)
    cwd = _string("cwd", params.get("cwd"))
    if cwd is not None and not cwd.startswith("/"):
        raise invalid("cwd", "must be an absolute path")
    operation_id = _string("operationId", params.get("operationId"))
    if operation_id is not None and len(operation_id) > 128:
        raise invalid("operationId", "longer than 128 characters")
    deadline = params.get("deadlineMs")
    if deadline is not None and (isinstance(deadline, bool) or not isinstance(deadline, int) or deadline < 0):
        raise invalid("deadlineMs", "must be a non-negative integer (epoch milliseconds)")
    protected = _env("protectedValues", params.get("protectedValues"), coerce=False)
    timeout = _positive_int("timeoutMs", params.get("timeoutMs"), DEFAULT_TIMEOUT_MS)
    cap = _positive_int("maxOutputBytes", params.get("maxOutputBytes"), DEFAULT_MAX_OUTPUT_BYTES)
    assert timeout is not None
    assert cap is not None
    return ExecParams(
        executable=executable,
        args=args,
        command=command,
        cwd=cwd,
        env=_env("env", params.get("env"), coerce=True),
        timeout_ms=timeout,
        deadline_ms=deadline,
        max_output_bytes=cap,
        operation_id=operation_id,
        protected=protected,
        trace=parse_trace_context(params.get("traceContext")),
    )


def parse_operation_id(params: dict[str, Any]) -> str:
    value = _string("operationId", params.get("operationId"), optional=False)
    assert value is not None
    return value


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

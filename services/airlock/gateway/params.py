"""The gateway dialect's params (reference/001), checked with no I/O: `process.exec`'s, the trace context, telemetry.

Each ``parse_*`` takes a request's ``params`` object and returns a frozen
value or raises `GatewayError` (``invalid_params``, naming the field); the
shell (`gateway/stdio.py`) calls them once per request.  Split from
`gateway/protocol`, which keeps the lines, the codes and the frames.

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from airlock.gateway.protocol import DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_TIMEOUT_MS, invalid


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

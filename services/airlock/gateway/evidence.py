"""Process evidence and output streams of the gateway dialect, with no I/O.

`terminal` turns the agent door's exec evidence into reference/001's
``process.terminal`` fields; `OutputStream` turns its base64 output events
into ``process.stream`` fields under the combined ``maxOutputBytes`` budget.

Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import codecs
from dataclasses import dataclass, field
from typing import Any, Final

from airlock.gateway.params import ExecParams
from airlock.gateway.protocol import PROTOCOL_VERSION, sha256_text

_SIGNALS: Final = {
    1: "SIGHUP",
    2: "SIGINT",
    3: "SIGQUIT",
    4: "SIGILL",
    6: "SIGABRT",
    7: "SIGBUS",
    8: "SIGFPE",
    9: "SIGKILL",
    10: "SIGUSR1",
    11: "SIGSEGV",
    12: "SIGUSR2",
    13: "SIGPIPE",
    14: "SIGALRM",
    15: "SIGTERM",
    24: "SIGXCPU",
    25: "SIGXFSZ",
}


def signal_name(number: Any) -> str | None:
    if isinstance(number, bool) or not isinstance(number, int):
        return None
    return _SIGNALS.get(number, f"SIG{number}")


def _b64(value: Any) -> bytes:
    if not isinstance(value, str):
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return b""


def terminal(evidence: dict[str, Any], params: ExecParams, *, overflowed: bool = False) -> dict[str, Any]:
    """The process evidence in reference/001's names, from the agent door's evidence.

    Derived only from the stored native outcome and the request, so a replay
    (even after a gateway restart) yields the same terminal evidence.  Captured
    output is capped at ``maxOutputBytes`` combined: stdout first, then stderr.
    """
    stages = evidence.get("stages") or [{}]
    last = stages[-1] if isinstance(stages[-1], dict) else {}
    stdout_raw = _b64(evidence.get("stdout"))
    stderr_raw = b"".join(_b64(s.get("stderr")) for s in stages if isinstance(s, dict))
    cap = params.max_output_bytes
    native_truncated = bool(evidence.get("stdout_truncated")) or any(
        isinstance(s, dict) and s.get("stderr_truncated") for s in stages
    )
    overflow = overflowed or native_truncated or len(stdout_raw) + len(stderr_raw) > cap
    stdout_b = stdout_raw[:cap]
    stderr_b = stderr_raw[: max(0, cap - len(stdout_b))]
    stdout = stdout_b.decode("utf-8", errors="replace")
    stderr = stderr_b.decode("utf-8", errors="replace")
    # The gateway terminates an overflowing job through cancel; that is the
    # overflow's SIGTERM, not a cancellation the controller asked for.
    cancelled = bool(evidence.get("cancelled")) and not overflow
    result: dict[str, Any] = {
        "operationId": evidence.get("operation_id"),
        "protocolVersion": PROTOCOL_VERSION,
        "startedAt": evidence.get("started_at"),
        "endedAt": evidence.get("ended_at"),
        "durationMs": evidence.get("duration_ms"),
        "cwd": evidence.get("cwd"),
        "uid": evidence.get("uid"),
        "gid": evidence.get("gid"),
        "hostname": evidence.get("hostname"),
        "executionForm": params.form,
        "shell": params.command is not None,
        "exitCode": last.get("exit_code"),
        "signal": signal_name(last.get("signal")),
        "cancelled": cancelled,
        "timedOut": bool(evidence.get("timed_out")),
        "timeoutReason": evidence.get("timeout_reason"),
        "truncated": overflow,
        "transportTruncated": False,
        "stdout": stdout,
        "stderr": stderr,
        "stdoutTruncated": len(stdout_b) < len(stdout_raw) or bool(evidence.get("stdout_truncated")),
        "stderrTruncated": len(stderr_b) < len(stderr_raw)
        or any(isinstance(s, dict) and bool(s.get("stderr_truncated")) for s in stages),
        "stdoutSha256": sha256_text(stdout),
        "stderrSha256": sha256_text(stderr),
        "maxOutputBytes": cap,
        "replayed": bool(evidence.get("replay")),
        "containment": evidence.get("containment"),
        "decision": evidence.get("decision"),
    }
    if evidence.get("output_retained") is False:
        result["outputRetained"] = False
    return result


@dataclass(slots=True)
class OutputStream:
    """Turns the agent door's base64 output events into ``process.stream`` fields.

    Mutable per-operation state (one `sequence` across stdout and stderr, the
    combined byte budget, incremental UTF-8 decoders so a character split
    across chunks is not mangled).
    """

    cap: int
    sequence: int = 0
    delivered: int = 0
    overflowed: bool = False
    _decoders: dict[str, Any] = field(default_factory=dict)

    def feed(self, stream: str, data_b64: Any) -> list[dict[str, Any]]:
        if stream not in ("stdout", "stderr") or self.overflowed:
            return []
        raw = _b64(data_b64)
        room = self.cap - self.delivered
        truncated = len(raw) > room
        if truncated:
            raw = raw[:room]
            self.overflowed = True
        self.delivered += len(raw)
        decoder = self._decoders.setdefault(stream, codecs.getincrementaldecoder("utf-8")(errors="replace"))
        text = decoder.decode(raw, final=truncated)
        if not text and not truncated:
            return []
        self.sequence += 1
        return [{"stream": stream, "sequence": self.sequence, "data": text, "truncated": truncated}]

    def flush(self) -> list[dict[str, Any]]:
        out = []
        for stream, decoder in self._decoders.items():
            text = decoder.decode(b"", final=True)
            if text and not self.overflowed:
                self.sequence += 1
                out.append({"stream": stream, "sequence": self.sequence, "data": text, "truncated": False})
        return out

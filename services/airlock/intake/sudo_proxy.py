"""The sudo-proxy dialect of reference/000: shapes only.  Pure: no I/O.

A request object with neither ``v`` nor ``verb`` is a reference/000 request.
Its answers carry ``status`` (ok, denied, timeout, error), ``stages`` with
``exit_code`` and base64 ``stderr``, the last stage's stdout hoisted to a
base64 ``stdout``, truncation flags only when true, ``message`` on errors and
``version`` on every response.
"""

from __future__ import annotations

import json
import re
from typing import Any

from airlock import __version__
from airlock.common.errors import AirlockError, ErrorCode

# reference/000 clients read `version` to tell whether the daemon knows the
# control actions (added in its 1.1).  airlock speaks that dialect at 1.1, so
# it says so, with its own version as semver build metadata.
VERSION = f"1.1.0+airlock.{__version__}"

# Only an ID that passes the request-ID rule (common/validate.py) is echoed.
_ID = re.compile(rb'"id"\s*:\s*"([A-Za-z0-9._:-]{1,256})"')
_NATIVE_HINT = re.compile(rb'"(v|verb)"\s*:')


def is_legacy(obj: dict[str, Any]) -> bool:
    return "v" not in obj and "verb" not in obj


def sniff(raw: bytes) -> tuple[str, str | None]:
    """For a line that did not parse: (dialect, recovered id) from its bytes."""
    found = _ID.search(raw[: 64 * 1024])
    recovered = found.group(1).decode("utf-8", "replace") if found else None
    return ("native" if _NATIVE_HINT.search(raw[: 64 * 1024]) else "legacy"), recovered


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


STATUS_BY_CODE = {
    ErrorCode.DENIED: "denied",
    ErrorCode.APPROVAL_TIMEOUT: "timeout",
}


def encode_error(request_id: str | None, error: AirlockError) -> bytes:
    status = STATUS_BY_CODE.get(error.code, "error")
    body: dict[str, Any] = {"id": request_id or "", "status": status}
    if status == "error" or error.message:
        body["message"] = error.message
    body["code"] = error.code.value
    if isinstance(error.details.get("field"), str):  # which field was refused (a client ignores what it does not know)
        body["field"] = error.details["field"]
    body["version"] = VERSION
    return _line(body)


def encode_ok(request_id: str, message: str | None = None) -> bytes:
    body: dict[str, Any] = {"id": request_id, "status": "ok"}
    if message is not None:
        body["message"] = message
    body["version"] = VERSION
    return _line(body)


def encode_result(request_id: str, evidence: dict[str, Any]) -> bytes:
    """A request that ran: status ok whatever its exit codes (reference/000).

    A job stopped by its timeout (or deadline), or cancelled by an operator,
    is not a result the client asked for: sudo-proxy answers a timeout with
    ``status: error`` and "command timed out after Ns", and so does airlock
    (the stages and the output it captured stay in the answer, as fields a
    sudo-proxy client ignores).
    """
    stages = []
    for stage in evidence.get("stages", []):
        exit_code = stage.get("exit_code")
        if exit_code is None:
            signal = stage.get("signal")
            exit_code = 128 + signal if isinstance(signal, int) else -1
        entry: dict[str, Any] = {"exit_code": exit_code, "stderr": stage.get("stderr", "")}
        if stage.get("stderr_truncated"):
            entry["stderr_truncated"] = True
        stages.append(entry)
    body: dict[str, Any] = {"id": request_id, "status": "ok", "stages": stages, "stdout": evidence.get("stdout", "")}
    if evidence.get("stdout_truncated"):
        body["stdout_truncated"] = True
    stopped = _stopped(evidence)
    if stopped is not None:
        body["status"] = "error"
        body["message"] = stopped
    body["version"] = VERSION
    return _line(body)


def _stopped(evidence: dict[str, Any]) -> str | None:
    """The error message for a job airlock stopped before it ended by itself, or None."""
    seconds = evidence.get("duration_ms")
    after = f" after {seconds / 1000:.0f}s" if isinstance(seconds, int | float) else ""
    if evidence.get("timed_out"):
        why = "its deadline" if evidence.get("timeout_reason") == "deadline" else "its timeout"
        return f"command timed out{after} ({why}); the processes were stopped"
    if evidence.get("cancelled"):
        return f"command cancelled by an operator{after}; the processes were stopped"
    return None


def encode_undetermined(request_id: str | None, error: AirlockError) -> bytes:
    """An error before the dialect is known: both dialects' fields in one object.

    Used for refusals made before a byte is read (busy, unauthorized) and for
    lines that are not JSON at all.  A reference/000 client reads ``status``
    and ``message``; a native client reads ``ok`` and ``error``; each ignores
    the other's fields.
    """
    return _line(
        {
            "id": request_id if request_id is not None else "",
            "ok": False,
            "error": error.to_dict(),
            "status": "error",
            "message": error.message,
            "version": VERSION,
        }
    )

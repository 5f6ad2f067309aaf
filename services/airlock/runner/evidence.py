"""What a job leaves behind: per-stage and job results, JSON-ready evidence.

Frozen values only; spawn.py builds them.  Streams are base64 in the
evidence and every digest is of the delivered (redacted, truncated) bytes.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StageResult:
    argv: tuple[str, ...]  # as requested (and approved)
    resolved: str  # the canonical binary executed, also its argv[0]: what policy matched
    exit_code: int | None  # None: killed by a signal, or never started
    signal: int | None
    stderr: bytes
    stderr_truncated: bool
    stderr_sha256: str
    # Service containment: the unit's CPU time and cgroup memory peak (None elsewhere).
    cpu_usec: int | None = None
    memory_peak_bytes: int | None = None
    unit: str | None = None


@dataclass(frozen=True, slots=True)
class JobResult:
    operation_id: str
    mode: str
    stages: tuple[StageResult, ...]
    stdout: bytes
    stdout_truncated: bool
    stdout_sha256: str
    started_at: str
    ended_at: str
    duration_ms: int
    timed_out: bool
    timeout_reason: str | None  # "timeout" or "deadline"
    cancelled: bool
    containment: str
    scope_unit: str | None
    started: bool  # False: the deadline had passed or cancel came first; nothing ran
    cwd: str
    uid: int
    gid: int
    # limits.max_total_output_bytes was reached: some stream lost bytes to the job's shared cap.
    total_output_truncated: bool = False

    def to_evidence(self) -> dict[str, Any]:
        """The JSON-ready evidence (streams base64, digests of the delivered bytes)."""
        evidence: dict[str, Any] = {
            "operation_id": self.operation_id,
            "mode": self.mode,
            "containment": self.containment,
            "scope_unit": self.scope_unit,
            "cwd": self.cwd,
            "uid": self.uid,
            "gid": self.gid,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "duration_ms": self.duration_ms,
            "timed_out": self.timed_out,
            "timeout_reason": self.timeout_reason,
            "cancelled": self.cancelled,
            "started": self.started,
            "stages": [
                {
                    "argv": list(stage.argv),
                    "resolved": stage.resolved,
                    "exit_code": stage.exit_code,
                    "signal": stage.signal,
                    "stderr": base64.b64encode(stage.stderr).decode("ascii"),
                    "stderr_truncated": stage.stderr_truncated,
                    "stderr_sha256": stage.stderr_sha256,
                    "unit": stage.unit,
                    "cpu_usec": stage.cpu_usec,
                    "memory_peak_bytes": stage.memory_peak_bytes,
                }
                for stage in self.stages
            ],
            "stdout": base64.b64encode(self.stdout).decode("ascii"),
            "stdout_truncated": self.stdout_truncated,
            "stdout_sha256": self.stdout_sha256,
        }
        if self.total_output_truncated:
            evidence["total_output_truncated"] = True
        return evidence


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

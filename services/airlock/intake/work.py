"""One request as the intake drive needs it, whatever its kind (exec or a file operation)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airlock.common.codec import canonical_json


@dataclass(frozen=True, slots=True)
class Work:
    """One request as `Intake.drive` needs it, whatever its kind (exec or file operation)."""

    request_id: str
    operation_id: str
    session: str
    digest: str  # of the spec: binds the approval ticket and keys replay
    run_as: int
    privileged: bool
    describe: dict[str, Any]  # what the audit record and operators see
    decide_request: dict[str, Any]  # what approval decides on
    has_protected: bool
    runner_verb: str
    runner_args: dict[str, Any]  # without ticket and operation_id, which drive adds
    runner_timeout: float | None
    thin: Callable[[dict[str, Any]], dict[str, Any]]  # the outcome as kept for replay when it is large


def derived_operation_id(kind: str, spec: dict[str, Any], session: str) -> str:
    """Without an explicit ID, one derived from the canonical request, so an identical retry replays."""
    return "op-" + hashlib.sha256(canonical_json({kind: spec, "session": session})).hexdigest()[:32]


def thin_exec_outcome(evidence: dict[str, Any]) -> dict[str, Any]:
    # Large output is not kept for replay: the digests and sizes are.
    return evidence | {
        "stdout": "",
        "stages": [s | {"stderr": ""} for s in evidence.get("stages", [])],
        "output_retained": False,
    }

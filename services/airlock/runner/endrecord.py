"""What the runner's records and replies may weigh: exec.started's spec, exec.finished's summary, the reply.

A request's end record must fit the journal's payload cap before the job
starts (issue 29): `end_record_fits` builds the largest ``exec.finished`` this
job could produce with the same code (`audit_summary`) that builds the real
one.  `spec_record` names a large argv (and any stdin) by digest in ``exec.started``;
`fit_reply` drops output from a reply that would not fit what intake reads.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from airlock.common import shown
from airlock.common.codec import canonical_json
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import MAX_REPLY_BYTES
from airlock.common.kinds import MAX_PAYLOAD_BYTES
from airlock.runner import outputlog
from airlock.runner.evidence import JobResult, StageResult
from airlock.runner.jobspec import JobSpec

# What an exec reply may take of intake's reply limit; the rest is the envelope's.
REPLY_ROOM = MAX_REPLY_BYTES - 64 * 1024
# exec.finished's exec tree takes at most this much, and the room left after the rest of the record;
# KILLED_BYTES is kept for an operator's kill (who, signal, a reason of KILL_REASON_CHARS at most).
TREE_BYTES = 32 * 1024
KILLED_BYTES = 8 * 1024
MIN_TREE_BYTES = 1024


# A stage's argv past this many bytes is named by digest in exec.started:
# request.received holds it whole, and a record need not repeat it (issue 29, issue 39 item 7).
SPELLED_OUT_BYTES = 1024


def spec_record(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as ``exec.started`` journals it: a large argv by digest and size, stdin always so, the rest as it is.

    ``digest`` (of the whole spec) next to it binds it to ``request.received``'s.
    """
    out = dict(spec)
    out["stages"] = [
        list(argv)
        if len(canonical_json(list(argv))) <= SPELLED_OUT_BYTES
        else {"argv_sha256": argv_digest(argv), "argv_bytes": len(canonical_json(list(argv)))}
        for argv in spec["stages"]
    ]
    # stdin is content the agent chose (a password for chpasswd): by size and sha256 only (issue 45).
    return shown.journaled(out)


def argv_digest(argv: Any) -> str:
    """The SHA-256 of a stage's argv as canonical JSON: how records after ``request.received`` name it."""
    return hashlib.sha256(canonical_json(list(argv))).hexdigest()


def fit_reply(evidence: dict[str, Any], room: int = REPLY_ROOM) -> dict[str, Any]:
    """The evidence as it can be sent: without its output when the reply would not fit what intake reads.

    limits.max_total_output_bytes keeps a reply well inside ``room``; this is the
    last word, so that a job that ran always gets an answer intake can settle
    (a reply intake could not read would leave the operation unsettled, and a
    retry would run the job again).  Digests, sizes and exit codes stay.
    """
    output = len(evidence["stdout"]) + sum(len(stage["stderr"]) for stage in evidence["stages"])
    rest = {k: v for k, v in evidence.items() if k not in ("stdout", "stages")}
    rest["stages"] = [{k: v for k, v in stage.items() if k != "stderr"} for stage in evidence["stages"]]
    if output + len(canonical_json(rest)) <= room:
        return evidence
    return evidence | {
        "stdout": "",
        "stdout_truncated": evidence["stdout_truncated"] or bool(evidence["stdout"]),
        "stages": [
            stage | {"stderr": "", "stderr_truncated": stage["stderr_truncated"] or bool(stage["stderr"])}
            for stage in evidence["stages"]
        ],
        "output_retained": False,
    }


def audit_summary(evidence: dict[str, Any], head: int, result: JobResult) -> dict[str, Any]:
    """The evidence without output bytes: digests and sizes (and a configured head).

    argv is named by digest (``argv_sha256``, ``argv_bytes``), not repeated
    (issue 29): ``request.received`` holds it, so the end record's size does not
    grow with the request and always fits the journal's payload cap
    (`end_record_fits`); `airlock show` reads argv from the first record.
    """
    out = {k: v for k, v in evidence.items() if k not in ("stdout", "stages")}
    out["stdout_bytes"] = len(result.stdout)
    out["stages"] = [
        {k: v for k, v in stage.items() if k not in ("stderr", "argv")}
        | {
            "argv_sha256": argv_digest(r.argv),
            "argv_bytes": len(canonical_json(list(r.argv))),
            "stderr_bytes": len(r.stderr),
        }
        for stage, r in zip(evidence["stages"], result.stages, strict=True)
    ]
    out["exit_codes"] = [s.exit_code for s in result.stages]
    if head:
        out["stdout_head"] = base64.b64encode(result.stdout[:head]).decode()
    return out


# Stand-ins for what only the run tells: as long as any real value can be.
_WORST_INT = -(2**63)
_WORST_UNIT = "u" * 256  # systemd's longest unit name
_WORST_TIME = "2026-01-01T00:00:00.000000+00:00"
_MARGIN = 512


def end_record_fits(job: JobSpec, head: int) -> int:
    """The size of the largest ``exec.finished`` payload this job can produce; refused if it cannot fit.

    The end record is built by the same code (`audit_summary`) from a result
    whose every run-time value is as long as it can be: so a job starts only
    when its end record is known to fit the journal's `MAX_PAYLOAD_BYTES`.
    """
    stages = tuple(
        StageResult(
            argv=tuple(argv),
            resolved=str((job.binaries[i] if job.binaries and i < len(job.binaries) else {}).get("path") or "/" * 4096),
            exit_code=_WORST_INT,
            signal=_WORST_INT,
            stderr=b"",
            stderr_truncated=True,
            stderr_sha256="0" * 64,
            cpu_usec=_WORST_INT,
            memory_peak_bytes=_WORST_INT,
            unit=_WORST_UNIT,
        )
        for i, argv in enumerate(job.stages)
    )
    result = JobResult(
        operation_id=job.operation_id,
        mode=job.mode,
        stages=stages,
        stdout=b"\xff" * head,
        stdout_truncated=True,
        stdout_sha256="0" * 64,
        started_at=_WORST_TIME,
        ended_at=_WORST_TIME,
        duration_ms=_WORST_INT,
        timed_out=True,
        timeout_reason="deadline",
        cancelled=True,
        containment=job.containment,
        scope_unit=_WORST_UNIT,
        started=True,
        cwd=job.cwd,
        uid=_WORST_INT,
        gid=_WORST_INT,
        total_output_truncated=True,
    )
    evidence = result.to_evidence() | {
        "operation_id": job.operation_id,
        "cwd": job.cwd,
        "uid": _WORST_INT,
        "gid": _WORST_INT,
        "hostname": "h" * 64,  # HOST_NAME_MAX
    }
    # Room for a small field the evidence may gain before this stand-in learns of it.
    size = len(canonical_json(audit_summary(evidence, head, result))) + _MARGIN
    size += outputlog.worst_summary_bytes(len(job.stages))  # exec.finished's output_log (issue 35)
    if size > MAX_PAYLOAD_BYTES:
        raise AirlockError(
            ErrorCode.INVALID_ARGUMENTS,
            f"the request's end record (exec.finished) could be {size} bytes, over the audit journal's limit "
            f"of {MAX_PAYLOAD_BYTES}: nothing ran (fewer stages, a shorter working directory or a smaller "
            "journal.output_head_bytes)",
            {"field": "pipeline", "end_record_bytes": size, "limit_bytes": MAX_PAYLOAD_BYTES},
        )
    return size

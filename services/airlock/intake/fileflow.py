"""The life of a file request at the agent door: journal -> approval -> runner -> journal.

The same path an exec request takes (`Intake.run`), with the file spec in
place of the exec spec: ``op.begin`` (new, replay, conflict, in progress),
``decide`` (the policy's ``files:`` rules, or an operator who sees the diff),
the runner's ``files`` verb with the single-use ticket, ``op.complete``.  An
operation that ran is settled even when its outcome is an error (permission
denied, no match): like a non-zero exit, it is evidence, and it replays.
"""

from __future__ import annotations

from typing import Any

from airlock.common.audit import Ids
from airlock.common.codec import canonical_json
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer
from airlock.intake.files import FileRequest

# Outcomes larger than this are kept for replay without their content.
REPLAY_OUTPUT_LIMIT = 512 * 1024


async def run(intake: Any, req: FileRequest, peer: Peer) -> dict[str, Any]:
    """Drive one file request; ``intake`` is the `intake.service.Intake` (its clients and audit)."""
    spec = req.spec
    runner_uid = intake.runner_uid
    if runner_uid is not None and runner_uid != 0 and spec.run_as != runner_uid:
        what = "privileged requests" if spec.privileged else "file operations as another user"
        raise AirlockError(
            ErrorCode.PRIVILEGE_UNAVAILABLE,
            f"this airlock's runner does not run as root, so it cannot run {what}; use privileged: false or run airlock as root",
        )
    op = req.operation_id or req.derived_operation_id()
    digest = spec.digest()
    ids = Ids(req.request_id, op, peer.uid, req.session or None)
    await intake.audit.record(
        "request.received", ids, payload={"request": req.describe(), "peer": peer.to_dict(), "digest": digest}
    )
    began = await intake.journal.call("op.begin", {"operation_id": op, "digest": digest, "has_protected": False})
    if began["state"] == "replay":
        await intake.audit.record("operation.replayed", ids, payload={"digest": digest})
        return dict(began["outcome"]) | {"replay": True}
    settled = False
    try:
        decision = await intake.approval.call(
            "decide",
            {"request": req.describe() | {"file": spec.to_dict()}, "peer": peer.to_dict(), "operation_id": op},
            timeout=intake.config.approval.timeout_seconds + 30,
        )
        outcome: dict[str, Any] = await intake.runner.call(
            "files",
            {"ticket": decision["ticket"], "spec": spec.to_dict(), "request_id": req.request_id, "operation_id": op,
             "session": req.session},
        )
        outcome = outcome | {"replay": False, "decision": {"rule": decision.get("rule"), "decided_by": decision.get("decided_by")}}
        stored = outcome
        if len(canonical_json(stored)) > REPLAY_OUTPUT_LIMIT:
            stored = {k: v for k, v in outcome.items() if k not in ("content", "entries", "paths", "matches", "diff")}
            stored["output_retained"] = False
        try:
            await intake.journal.call("op.complete", {"operation_id": op, "digest": digest, "outcome": stored})
        except AirlockError as exc:
            intake.log.error("intake.outcome.unstored", request_id=req.request_id, operation_id=op, code=exc.code.value)
        settled = True
        await intake._replied(ids, "ok", None)
        return outcome
    except AirlockError as exc:
        await intake._replied(ids, "error", exc)
        raise
    finally:
        if not settled:
            try:
                await intake.journal.call("op.abandon", {"operation_id": op})
            except AirlockError:
                pass

"""The life of a file request at the agent door: journal -> approval -> runner -> journal.

The same path an exec request takes (`Intake.drive`), with the file spec in
place of the exec spec: ``op.begin`` (new, replay, conflict, in progress),
``decide`` (the policy's ``files:`` rules, or an operator who sees the diff),
the runner's ``files`` verb with the single-use ticket, ``op.complete``.  An
operation that ran is settled even when its outcome is an error (permission
denied, no match): like a non-zero exit, it is evidence, and it replays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airlock.common.peer import Peer
from airlock.intake.files import FileRequest
from airlock.intake.work import Work, derived_operation_id

if TYPE_CHECKING:
    from airlock.common.server import Connection
    from airlock.intake.service import Intake


def _thin(outcome: dict[str, Any]) -> dict[str, Any]:
    # Large results are not kept for replay: their hashes and sizes are.
    return {k: v for k, v in outcome.items() if k not in ("content", "entries", "paths", "matches", "diff")} | {
        "output_retained": False
    }


async def run(intake: Intake, req: FileRequest, peer: Peer, *, conn: Connection | None = None) -> dict[str, Any]:
    """Drive one file request along the same path as exec (`Intake.drive`)."""
    spec = req.spec
    work = Work(
        request_id=req.request_id,
        operation_id=req.operation_id or derived_operation_id("file", spec.to_dict(), req.session),
        session=req.session,
        digest=spec.digest(),
        run_as=spec.run_as,
        privileged=spec.privileged,
        describe=req.describe(),
        decide_request=req.describe() | {"file": spec.to_dict()},
        has_protected=False,
        runner_verb="files",
        runner_args={"spec": spec.to_dict(), "request_id": req.request_id, "session": req.session},
        # The job's timeout, the kill grace and a margin for the runner's journal and approval calls.
        runner_timeout=intake.config.limits.default_timeout_seconds + intake.config.limits.kill_grace_seconds + 30,
        thin=_thin,
    )
    return await intake.drive(work, peer, None, conn=conn)

"""What an operator sees of a pending file operation.

The request without the raw spec (write content appears only as its digest
and size, from `FileSpec.describe`) and, for writes and edits, the unified
diff the runner computes as the target identity.  Approval itself cannot
read the file (it is not root); the runner's ``files_preview`` writes
nothing.  A preview that fails never blocks the decision: the operator sees
why there is no diff.

The view carries ``before_sha256``: the sha256 of the file the operator is
shown, or "absent".  `bound_file` turns it into ``bound["file"]``, which
approval binds to the ticket and the runner enforces (it writes only if the
file still has that content, else ``file_changed``).  Without a preview
there is nothing reviewed to bind.
"""

from __future__ import annotations

from typing import Any

from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client

ABSENT = "absent"


async def operator_view(runner: Client, request: dict[str, Any], spec: FileSpec) -> dict[str, Any]:
    view = {k: v for k, v in request.items() if k != "file"}
    if not spec.writes:
        return view
    try:
        preview = await runner.call("files_preview", {"spec": spec.to_dict()}, timeout=40)
    except AirlockError as exc:
        return view | {"diff": None, "preview_error": {"code": exc.code.value, "message": exc.message}}
    if not preview.get("ok"):
        return view | {"diff": None, "preview_error": preview.get("error")}
    before = preview.get("before_sha256")
    return view | {
        "diff": preview.get("diff"),
        "before_sha256": before if before is not None else ABSENT,
        "after_sha256": preview.get("after_sha256"),
    }


def bound_file(view: dict[str, Any]) -> dict[str, Any] | None:
    """What the operator reviewed, to bind to the ticket: ``{"sha256": hex | "absent"}``, or None."""
    before = view.get("before_sha256")
    if view.get("diff") is None or not isinstance(before, str):
        return None
    return {"sha256": before}

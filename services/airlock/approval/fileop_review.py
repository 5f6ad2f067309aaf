"""What an operator sees of a pending file operation, and what everyone else sees of it.

The request without the raw spec (write content appears only as its digest
and size, from `FileSpec.describe`) and, for writes and edits, the diff the
runner computes (`runner.fileop_perform.unified_diff`: a unified diff, or a
binary change with hex excerpts).  Approval itself cannot read the file (it
is not root); the runner's ``files_preview`` writes nothing.  A preview that
fails never blocks the decision: the operator sees why there is no diff.

Whose eyes the preview reads with (issue 39): the target identity when a
policy rule names the path (the rule's author chose to have such files
reviewed); else, for a privileged write, the agent that asked
(``preview_as: "requester"``), so an unapproved request cannot copy
anything out of a file its agent could not read itself.

The diff is file content: it is served to operators only, on operator.sock
(`pending`, `show` of a pending request).  What is journaled, sent to
observers, the relay, ``notify_command`` and journald is `without_content`:
the diff's sha256 and size (``diff_sha256``, ``diff_bytes``), never the
diff.  A command's stdin is content of the same kind (issue 45,
common/shown.py): its excerpt (``stdin_excerpt``) is left out the same way.

The view carries ``before_sha256``: the sha256 of the file the operator is
shown, or "absent".  `bound_file` turns it into ``bound["file"]``, which
approval binds to the ticket and the runner enforces (it writes only if the
file still has that content, else ``file_changed``).  Without a preview
there is nothing reviewed to bind.
"""

from __future__ import annotations

import hashlib
from typing import Any

from airlock.approval.rules import DEFAULT_RULE, UNRESOLVED_RULE, Decision
from airlock.common.errors import AirlockError
from airlock.common.fileop_spec import FileSpec
from airlock.common.ipc import Client
from airlock.common.wire import runner as runner_wire

ABSENT = "absent"
CONTENT_FIELDS = ("diff", "stdin_excerpt")  # what only operators see of a view (a command's stdin: issue 45)


def names_path(decision: Decision) -> bool:
    """Whether a policy rule (not the default) matched this file operation's path."""
    return any(stage.rule not in (DEFAULT_RULE, UNRESOLVED_RULE) for stage in decision.stages)


async def operator_view(
    runner: Client, request: dict[str, Any], spec: FileSpec, *, named: bool = True
) -> dict[str, Any]:
    """The request as an operator reviews it; ``named``: a rule names the path (see the module)."""
    view = {k: v for k, v in request.items() if k != "file"}
    if not spec.writes:
        return view
    as_requester = spec.privileged and not named
    if as_requester:
        view["preview_as"] = "requester"
    try:
        asked = runner_wire.Preview(spec, as_requester=as_requester)
        preview = (await runner_wire.stub(runner).call(runner_wire.FILES_PREVIEW, asked, timeout=40)).outcome
    except AirlockError as exc:
        return view | {"diff": None, "preview_error": {"code": exc.code.value, "message": exc.message}}
    if not preview.get("ok"):
        return view | {"diff": None, "preview_error": preview.get("error")}
    before = preview.get("before_sha256")
    diff = preview.get("diff")
    digest = {}
    if isinstance(diff, str):
        raw = diff.encode("utf-8", "surrogateescape")
        digest = {"diff_sha256": hashlib.sha256(raw).hexdigest(), "diff_bytes": len(raw)}
    return (
        view
        | {
            "diff": diff,
            "before_sha256": before if before is not None else ABSENT,
            "after_sha256": preview.get("after_sha256"),
        }
        | digest
    )


def without_content(view: Any) -> Any:
    """A request view with the diff and stdin's excerpt left out (sha256 and size stay): for the journal and
    observers."""
    if not isinstance(view, dict):
        return view
    return {k: v for k, v in view.items() if k not in CONTENT_FIELDS}


def for_observer(shown: dict[str, Any]) -> dict[str, Any]:
    """A ``pending`` entry or a ``show`` answer as an observer gets it: every request view without content."""
    out = dict(shown)
    if "request" in out:
        out["request"] = without_content(out["request"])
    if isinstance(out.get("detail"), dict):
        out["detail"] = for_observer(out["detail"])
    return out


def bound_file(view: dict[str, Any]) -> dict[str, Any] | None:
    """What the operator reviewed, to bind to the ticket: ``{"sha256": hex | "absent"}``, or None."""
    before = view.get("before_sha256")
    if view.get("diff") is None or not isinstance(before, str):
        return None
    return {"sha256": before}

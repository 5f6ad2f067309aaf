"""What operators and everyone else see of a pending write (issue 39 item 5)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import Any

from airlock.approval import fileop_review
from airlock.approval.rules import DEFAULT_RULE, Decision, StageDecision
from airlock.common import render
from airlock.common.fileop_spec import FileSpec

DIFF = "--- /etc/app.conf\n+++ /etc/app.conf\n@@ -1 +1 @@\n-password = hunter2\n+password = changed\n"


class FakeRunner:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    async def call(self, verb: str, args: dict[str, Any], timeout: float = 0, **_: Any) -> dict[str, Any]:
        self.calls.append((verb, args))  # as the runner's door receives it (wire.runner.Preview)
        return {"outcome": {"ok": True, "before_sha256": "a" * 64, "after_sha256": "b" * 64, "diff": DIFF}}


def _spec(privileged: bool = True) -> FileSpec:
    return FileSpec(
        tool="files_write",
        path="/etc/app.conf",
        privileged=privileged,
        uid=1000,
        params={"content": base64.b64encode(b"password = changed\n").decode()},
    )


def _decision(rule: str) -> Decision:
    return Decision("ask", rule, (StageDecision(("files_write", "/etc/app.conf"), "/etc/app.conf", "ask", rule),))


def test_only_a_rule_names_a_path_never_the_default() -> None:
    assert fileop_review.names_path(_decision("configs-ask")) is True
    assert fileop_review.names_path(_decision(DEFAULT_RULE)) is False


def test_a_privileged_preview_of_an_unnamed_path_runs_as_the_requester() -> None:
    runner = FakeRunner()
    request = {"request_id": "r1", "tool": "files_write", "path": "/etc/app.conf", "file": _spec().to_dict()}
    view = asyncio.run(fileop_review.operator_view(runner, request, _spec(), named=False))  # type: ignore[arg-type]
    assert runner.calls == [("files_preview", {"spec": _spec().to_dict(), "as_requester": True})]
    assert view["preview_as"] == "requester" and "file" not in view
    # Control: a named path (or an unprivileged write) is previewed as the target identity.
    named = FakeRunner()
    asyncio.run(fileop_review.operator_view(named, request, _spec(), named=True))  # type: ignore[arg-type]
    unprivileged = FakeRunner()
    asyncio.run(fileop_review.operator_view(unprivileged, request, _spec(False), named=False))  # type: ignore[arg-type]
    assert [c[1] for c in named.calls + unprivileged.calls] == [
        {"spec": _spec().to_dict(), "as_requester": False},
        {"spec": _spec(False).to_dict(), "as_requester": False},
    ]


def test_the_diff_is_for_operators_its_hash_and_size_for_everyone() -> None:
    request = {"request_id": "r1", "tool": "files_write", "path": "/etc/app.conf"}
    view = asyncio.run(fileop_review.operator_view(FakeRunner(), request, _spec()))  # type: ignore[arg-type]
    assert view["diff"] == DIFF
    assert view["diff_sha256"] == hashlib.sha256(DIFF.encode()).hexdigest() and view["diff_bytes"] == len(DIFF)
    public = fileop_review.without_content(view)
    assert "diff" not in public and "hunter2" not in repr(public)
    assert public["diff_sha256"] == view["diff_sha256"] and public["before_sha256"] == "a" * 64
    assert fileop_review.bound_file(view) == {"sha256": "a" * 64}
    shown: dict[str, Any] = {"request_id": "r1", "request": view, "detail": {"request": view, "rule": "x"}}
    observed = fileop_review.for_observer(shown)
    assert "hunter2" not in repr(observed) and observed["detail"]["rule"] == "x"
    assert shown["request"]["diff"] == DIFF  # the operator's copy is untouched


def test_an_observer_is_told_the_diff_exists_and_whose_eyes_previewed() -> None:
    request = {"request_id": "r1", "tool": "files_write", "path": "/etc/app.conf"}
    view = asyncio.run(fileop_review.operator_view(FakeRunner(), request, _spec()))  # type: ignore[arg-type]
    lines = dict(render.file_review(fileop_review.without_content(view)))
    assert lines["diff"] == f"sha256 {view['diff_sha256']}, {len(DIFF)} bytes (shown to operators only)"
    assert "diff" not in dict(render.file_review(view))  # operators get the diff itself
    refused: dict[str, object] = request | {"preview_as": "requester", "preview_error": {"code": "permission_denied"}}
    assert (
        "as the requesting agent (no rule names this path): permission_denied"
        in dict(render.file_review(refused))["against"]
    )

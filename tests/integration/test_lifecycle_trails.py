"""Issue 20: `show`/`wait` fold a request's trail through the lifecycle table, file operations
included, and `airlock audit verify --lifecycle` checks every real trail against the table."""

from __future__ import annotations

import base64
import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Background, Stack, custom_stack, now_iso, wait_pending

CONFIG = """
approval:
  timeout_seconds: 4
limits:
  search_cpu_seconds: 3
policy:
  default: ask
  rules:
    - name: harmless
      decision: allow
      privileged: false
      commands: [[/usr/bin/true]]
    - name: never-false
      decision: deny
      commands: [[/usr/bin/false]]
    - name: data-files
      decision: allow
      privileged: false
      files:
        - tools: [files_read, files_write, files_search]
          paths: [{data}/...]
"""


@pytest.fixture(scope="module")
def lstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    runtime = Path(tmp_path_factory.mktemp("lc"))
    data = runtime / "data"
    data.mkdir()
    with custom_stack(runtime, CONFIG.replace("{data}", str(data))) as stack:
        yield stack


def data_dir(stack: Stack) -> Path:
    return stack.runtime_dir / "data"


def op(stack: Stack, verb: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return stack.native(verb, args, path=stack.operator)


def files(stack: Stack, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    return stack.native(verb, {"time": now_iso(), "privileged": False} | args)


def test_show_reports_a_running_file_operation_as_running(lstack: Stack) -> None:
    # A search that backtracks until its CPU limit stops it: it runs for seconds, then fails.
    (data_dir(lstack) / "slow.txt").write_text("a" * 40 + "!\n")
    operation = f"op-{uuid.uuid4().hex}"
    reply: dict[str, Any] = {}
    import threading

    thread = threading.Thread(
        target=lambda: reply.update(
            files(
                lstack,
                "files_search",
                {"path": str(data_dir(lstack)), "query": "^(a+)+$", "regex": True, "operation_id": operation},
            )
        )
    )
    thread.start()
    seen: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "running" not in seen:
        shown = op(lstack, "show", {"ref": operation})
        if shown["ok"]:
            seen.append(shown["data"]["state"])
            assert shown["data"]["lifecycle_error"] is None, shown["data"]
            if shown["data"]["state"] == "running":
                assert shown["data"]["settled"] is False
                human = lstack.cli("show", operation)
                assert "running" in human.stdout, human.stdout
        time.sleep(0.05)
    thread.join(60)
    assert "running" in seen, seen
    assert reply["ok"] is False and reply["error"]["code"] == "limit_exceeded", reply
    waited = lstack.cli("wait", operation, "--timeout", "30")
    assert waited.returncode == 1 and "failed" in waited.stdout, waited.stdout + waited.stderr


def test_wait_exits_0_after_a_successful_file_operation(lstack: Stack) -> None:
    target = data_dir(lstack) / "written.txt"
    operation = f"op-{uuid.uuid4().hex}"
    reply = files(
        lstack,
        "files_write",
        {"path": str(target), "operation_id": operation, "content": base64.b64encode(b"hello\n").decode()},
    )
    assert reply["ok"] is True and reply["data"]["ok"] is True, reply
    waited = lstack.cli("wait", operation, "--timeout", "30")
    assert waited.returncode == 0, waited.stdout + waited.stderr
    assert "finished" in waited.stdout
    shown = json.loads(lstack.cli("show", operation, "--json").stdout)["data"]
    assert shown["state"] == "finished" and shown["outcome"]["status"] == "ok"
    # Control: an operation that did not do what was asked (the file is missing) is not a success.
    missing = f"op-{uuid.uuid4().hex}"
    reply = files(lstack, "files_read", {"path": str(data_dir(lstack) / "absent"), "operation_id": missing})
    assert reply["ok"] is True and reply["data"]["ok"] is False, reply
    assert lstack.cli("wait", missing, "--timeout", "30").returncode == 1


def _every_story(stack: Stack) -> dict[str, str]:
    """One request for each way a story goes; their request IDs by name."""
    ids: dict[str, str] = {}

    def run(name: str, args: dict[str, Any], ok: bool | None = None) -> dict[str, Any]:
        ids[name] = f"lc-{name}-{uuid.uuid4().hex[:8]}"
        reply = stack.exec({"privileged": False} | args, id=ids[name])
        if ok is not None:
            assert reply["ok"] is ok, (name, reply)
        return reply

    run("allowed", {"argv": ["true"]}, ok=True)
    assert run("denied", {"argv": ["false"]})["error"]["code"] == "denied"
    replayed = f"op-{uuid.uuid4().hex}"
    run("first", {"argv": ["true"], "operation_id": replayed}, ok=True)
    assert run("replayed", {"argv": ["true"], "operation_id": replayed})["data"]["replay"] is True
    for name, verdict in (("approved", "approve"), ("operator-denied", "deny")):
        bg = Background(stack, {"argv": ["echo", name]})
        ids[name] = bg.request_id
        wait_pending(stack, bg.request_id)
        assert op(stack, verdict, {"id": bg.request_id})["ok"] is True
        bg.result()
    expired = Background(stack, {"argv": ["echo", "expired"]})
    ids["expired"] = expired.request_id
    assert expired.result(60)["error"]["code"] == "approval_timeout"
    withdrawn = Background(stack, {"argv": ["echo", "withdrawn"]})
    ids["withdrawn"] = withdrawn.request_id
    wait_pending(stack, withdrawn.request_id)
    assert stack.native("cancel", {"operation_id": withdrawn.operation_id})["ok"] is True
    assert withdrawn.result()["error"]["code"] == "withdrawn"
    running = Background(stack, {"argv": ["sleep", "30"]})
    ids["cancelled"] = running.request_id
    wait_pending(stack, running.request_id)
    op(stack, "approve", {"id": running.request_id})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not op(stack, "cancel", {"operation_id": running.operation_id})["ok"]:
        time.sleep(0.1)
    assert running.result(60)["data"]["cancelled"] is True
    return ids


def test_verify_lifecycle_passes_every_real_story_and_names_a_forbidden_one(lstack: Stack) -> None:
    ids = _every_story(lstack)
    rows = lstack.journal_rows()
    states = {name: op(lstack, "show", {"ref": rid})["data"]["state"] for name, rid in ids.items()}
    assert states == {
        "allowed": "finished",
        "denied": "failed",
        "first": "finished",
        "replayed": "replayed",
        "approved": "finished",
        "operator-denied": "failed",
        "expired": "failed",
        "withdrawn": "failed",
        "cancelled": "finished",
    }, states
    kinds = {r["kind"] for r in rows if r["request_id"] == ids["cancelled"]}
    assert "exec.cancelled" in kinds

    text = lstack.cli("audit", "verify", "--lifecycle", "--anchors", "none")
    assert text.returncode == 0, text.stdout + text.stderr
    assert text.stdout.startswith("ok:") and "lifecycle: ok;" in text.stdout, text.stdout
    reply = json.loads(lstack.cli("audit", "verify", "--lifecycle", "--anchors", "none", "--json").stdout)
    checked = reply["data"]["lifecycle"]
    assert reply["ok"] is True and reply["data"]["ok"] is True and reply["data"]["chain_ok"] is True
    assert checked["ok"] is True and checked["violations"] == [] and checked["violation_count"] == 0
    assert checked["requests"] >= len(ids) and checked["events"] >= len(rows)
    assert {"finished", "failed", "replayed"} <= set(checked["states"])

    # The check can fail: a start journaled for the denied request (as a runner that
    # ignored the denial would write it) is named with its request, seq and state.
    journal = str(lstack.runtime_dir / "internal" / "journal.sock")
    forged = lstack.native(
        "append",
        {
            "writer": "runner",
            "kind": "exec.started",
            "request_id": ids["denied"],
            "operation_id": "op-forged",
            "peer_uid": os.getuid(),
            "payload": {},
        },
        path=journal,
    )
    assert forged["ok"] is True, forged
    seq = forged["data"]["seq"]
    bad = lstack.cli("audit", "verify", "--lifecycle", "--anchors", "none")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert bad.stdout.startswith("ok:"), bad.stdout  # the chain itself is intact
    assert f"request {ids['denied']}" in bad.stdout and f"at seq {seq}: exec.started in state failed" in bad.stdout
    reply = json.loads(lstack.cli("audit", "verify", "--lifecycle", "--anchors", "none", "--json").stdout)
    assert reply["data"]["ok"] is False and reply["data"]["chain_ok"] is True
    assert reply["data"]["lifecycle"]["violations"] == [
        {
            "request_id": ids["denied"],
            "peer_uid": os.getuid(),
            "operation_id": reply["data"]["lifecycle"]["violations"][0]["operation_id"],
            "seq": seq,
            "kind": "exec.started",
            "state": "failed",
            "reason": "after the terminal state failed",
        }
    ]
    # show names the forbidden step too, and wait does not call that story a success.
    shown = lstack.cli("show", ids["denied"])
    assert f"FORBIDDEN at seq {seq}: exec.started in state failed" in shown.stdout, shown.stdout
    # Without --lifecycle, verify is what it was: the chain only.
    assert lstack.cli("audit", "verify", "--anchors", "none").returncode == 0

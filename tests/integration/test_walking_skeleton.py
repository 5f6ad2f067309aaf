"""Issue 2: one exec path end to end, through all four processes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import Stack, custom_stack


def test_two_stage_pipeline_runs_through_all_four_services_and_is_journaled(stack: Stack) -> None:
    reply = stack.exec(
        {"pipeline": [["printf", "alpha\\nbeta\\n"], ["tr", "a-z", "A-Z"]], "privileged": False, "reason": "skeleton"}
    )
    assert reply["ok"] is True, reply
    data = reply["data"]
    assert base64.b64decode(data["stdout"]) == b"ALPHA\nBETA\n"
    assert [s["exit_code"] for s in data["stages"]] == [0, 0]
    request_id = reply["id"]

    rows = [r for r in stack.journal_rows() if r["request_id"] == request_id]
    kinds = [r["kind"] for r in rows]
    for kind in ("request.received", "approval.decided", "exec.started", "exec.finished", "request.replied"):
        assert kind in kinds, kinds
    # Each service wrote its own events: the four processes really took part.
    writers = {r["kind"]: r["writer"] for r in rows}
    assert writers["request.received"] == "intake"
    assert writers["approval.decided"] == "approval"
    assert writers["exec.started"] == "runner"
    assert kinds.index("exec.started") < kinds.index("exec.finished")
    finished = json.loads(next(r["payload"] for r in rows if r["kind"] == "exec.finished"))
    assert finished["exit_codes"] == [0, 0]


def test_the_spec_is_journaled_once_and_exec_started_names_it_by_digest(stack: Stack) -> None:
    """Issue 50: exec.started carries the spec's digest, not the spec; request.received holds it whole."""
    word = "spelled-once-" + "q" * 40
    reply = stack.exec({"argv": ["printf", "%s", word], "privileged": False})
    assert reply["ok"] is True, reply
    rows = [r for r in stack.journal_rows() if r["request_id"] == reply["id"]]
    payloads = {r["kind"]: json.loads(r["payload"]) for r in rows}
    received, started = payloads["request.received"], payloads["exec.started"]
    assert received["request"]["stages"] == [["printf", "%s", word]]
    assert "spec" not in started and started["digest"] == received["digest"]
    assert word not in json.dumps(started)  # the argv is request.received's (and the decision's), not repeated
    assert started["binaries"][0]["path"].endswith("/printf")  # what ran, still in exec.started
    # What people read still spells the command: `airlock show` and `airlock events`.
    shown = stack.cli("show", reply["id"])
    line = next(x for x in shown.stdout.splitlines() if " exec.started " in x)
    assert f"COMMAND=/usr/bin/printf %s {word}" in line, shown.stdout


def test_airlock_run_prints_output_and_exits_with_the_command_code(stack: Stack) -> None:
    result = stack.cli("run", "--no-privilege", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3")
    assert result.returncode == 3, result.stderr
    assert result.stdout == "hi\n"
    assert "oops" in result.stderr


def test_airlock_run_reports_a_signal_as_128_plus_n(stack: Stack) -> None:
    result = stack.cli("run", "--no-privilege", "--", "sh", "-c", "kill -TERM $$")
    assert result.returncode == 128 + 15, result.stderr


def test_airlock_run_of_a_missing_program_exits_127_even_where_a_rule_allows_everything(stack: Stack) -> None:
    """Issue 44: under dev's allow-all-unprivileged rule it exited 125 `spawn_failed … command not found`."""
    result = stack.cli("run", "--no-privilege", "--", "no-such-program-here", "x")
    assert result.returncode == 127, (result.returncode, result.stderr)
    assert "command_not_found: no-such-program-here: command not found" in result.stderr
    can = stack.cli("can", "--no-privilege", "--", "no-such-program-here")
    assert can.returncode == 127 and "command not found" in can.stdout, (can.returncode, can.stdout, can.stderr)


def test_airlock_run_json_prints_the_envelope(stack: Stack) -> None:
    result = stack.cli("run", "--no-privilege", "--json", "--", "true")
    assert result.returncode == 0
    envelope = json.loads(result.stdout)
    assert envelope["ok"] is True and envelope["data"]["stages"][0]["exit_code"] == 0


def test_airlock_run_unreachable_socket_exits_125(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airlock", "run", "--socket", str(tmp_path / "none.sock"), "--", "true"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 125
    assert "no airlock socket" in result.stderr


def test_bad_lines_each_get_one_structured_error_and_the_stack_keeps_serving(stack: Stack) -> None:
    garbage = stack.send_raw(b"this is not json\n")
    assert len(garbage) == 1 and garbage[0]["ok"] is False and garbage[0]["status"] == "error"
    assert garbage[0]["error"]["code"] == "invalid_json"

    too_long = stack.send_raw(b'{"v":1,"verb":"ping","x":"' + b"a" * (1024 * 1024 + 10) + b'"}\n')
    assert len(too_long) == 1 and too_long[0]["error"]["code"] == "request_too_large"

    no_newline = stack.send_raw(b'{"v":1,"id":"n1","verb":"ping","args":{}}')
    assert no_newline == [no_newline[0]] and no_newline[0]["error"]["code"] == "missing_newline"
    assert no_newline[0]["id"] == "n1"

    legacy_no_newline = stack.send_raw(b'{"id":"l1","pipeline":[["true"]]}')
    assert legacy_no_newline[0]["status"] == "error"
    assert "missing trailing newline" in legacy_no_newline[0]["message"]

    assert stack.native("ping")["ok"] is True
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True


def test_the_same_airlock_run_twice_runs_twice_but_an_operation_id_replays(stack: Stack, tmp_path: Path) -> None:
    counter = tmp_path / "count"
    command = ["run", "--no-privilege", "--", "sh", "-c", f"echo x >> {counter}; wc -l < {counter}"]
    assert stack.cli(*command).stdout.strip() == "1"
    assert stack.cli(*command).stdout.strip() == "2"
    fixed = [
        "run",
        "--no-privilege",
        "--operation-id",
        f"op-{tmp_path.name}",
        "--",
        "sh",
        "-c",
        f"echo x >> {counter}; wc -l < {counter}",
    ]
    assert stack.cli(*fixed).stdout.strip() == "3"
    assert stack.cli(*fixed).stdout.strip() == "3"  # replayed, not run
    assert counter.read_text().count("x") == 3


def test_a_refusal_before_the_request_is_read_reaches_airlock_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    with custom_stack(Path(tmp_path_factory.mktemp("refuse")), "agents:\n  users: [nobody]\n") as refusing:
        result = refusing.cli("run", "--no-privilege", "--", "true")
    assert result.returncode == 125
    assert "unauthorized" in result.stderr


def test_a_story_journaled_before_issue_50_with_the_spec_in_exec_started_still_verifies_and_shows(
    stack: Stack,
) -> None:
    """Records written before issue 50 carry the spec in exec.started; they verify and read as before."""
    journal = str(stack.runtime_dir / "internal" / "journal.sock")
    rid, op, uid = "old-shape-1", "op-old-shape-1", os.getuid()
    spec = {"stages": [["df", "-h", "/old-shape"]], "privileged": False, "uid": uid, "cwd": None, "stdin": None}
    story = [
        ("intake", "request.received", {"request": spec, "digest": "d" * 64}),
        ("approval", "approval.decided", {"decision": "allow", "by": "policy", "rule": "dev"}),
        ("runner", "exec.started", {"digest": "d" * 64, "spec": spec, "uid": uid, "cwd": "/", "binaries": []}),
        ("runner", "exec.finished", {"exit_codes": [0], "stages": [], "duration_ms": 1}),
        ("intake", "request.replied", {"status": "ok", "code": None, "message": None}),
    ]
    for writer, kind, payload in story:
        ids = {"request_id": rid, "operation_id": op, "peer_uid": uid}
        appended = stack.native("append", {"writer": writer, "kind": kind, "payload": payload} | ids, path=journal)
        assert appended["ok"] is True, appended
    verified = json.loads(stack.cli("audit", "verify", "--lifecycle", "--anchors", "none", "--json").stdout)
    assert verified["data"]["chain_ok"] is True and verified["data"]["lifecycle"]["ok"] is True, verified
    shown = stack.cli("show", rid)
    line = next(x for x in shown.stdout.splitlines() if " exec.started " in x)
    assert "COMMAND=df -h /old-shape" in line, shown.stdout

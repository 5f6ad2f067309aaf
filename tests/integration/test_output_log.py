"""Issue 35 on a dev stack: each job's output is kept (redacted, bounded, digests in the chain), an operator
reads it with `show --output`, follows a running job with `logs --follow`, and old logs are pruned."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Stack, custom_stack
from waits import until

POLICY = """
policy:
  default: ask
  rules:
    - name: allow-sh
      decision: allow
      privileged: false
      commands:
        - [/usr/bin/dash, "..."]
        - [/usr/bin/true]
env:
  allow: [API_TOKEN]
runner:
  output_log_max_bytes: 4096
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(tmp_path_factory.mktemp("i35out") / "rt", POLICY) as s:
        yield s


def run(stack: Stack, script: str, **extra: Any) -> dict[str, Any]:
    reply = stack.exec({"argv": ["sh", "-c", script], "privileged": False} | extra)
    assert reply["ok"], reply
    data: dict[str, Any] = reply["data"]
    return data


def finished(stack: Stack, request_id: str) -> dict[str, Any]:
    for row in stack.journal_rows():
        if row["kind"] == "exec.finished" and row["request_id"] == request_id:
            payload: dict[str, Any] = json.loads(row["payload"])
            return payload
    raise AssertionError(f"no exec.finished for {request_id}")


def request_id_of(stack: Stack, operation_id: str) -> str:
    for row in stack.journal_rows():
        if row["kind"] == "exec.started" and row["operation_id"] == operation_id:
            return str(row["request_id"])
    raise AssertionError(operation_id)


def test_a_jobs_output_is_kept_with_its_digest_in_the_chain_and_shown_to_an_operator(stack: Stack) -> None:
    data = run(stack, "echo hello; echo oops >&2; printf '\\033[31mred\\n'", operation_id="op-out-1")
    rid = request_id_of(stack, "op-out-1")
    kept = finished(stack, rid)["output_log"]
    assert kept["file"] and not kept["cut"]
    evidence = data["result"] if "result" in data else data
    by_stream = {(s["stream"], s["stage"]): s for s in kept["streams"]}
    # What the chain holds for the log is what the agent got (nothing was cut).
    assert by_stream[("stdout", 0)]["sha256"] == evidence["stdout_sha256"]
    assert by_stream[("stderr", 0)]["sha256"] == evidence["stages"][0]["stderr_sha256"]
    # The file is root's alone, compressed.
    path = stack.runtime_dir / "state" / "output" / kept["file"]
    assert (os.stat(path).st_mode & 0o077) == 0 and (os.stat(path.parent).st_mode & 0o077) == 0
    assert gzip.decompress(path.read_bytes()).startswith(b"AIRLOCK-OUTPUT 1\n")

    shown = stack.cli("show", rid, "--output")
    assert shown.returncode == 0, shown.stderr
    assert "hello" in shown.stdout and "oops" in shown.stdout
    assert "matches exec.finished" in shown.stdout
    assert "\033" not in shown.stdout and "\\x1b[31mred" in shown.stdout  # neutralised on the terminal


def test_a_prefix_naming_one_request_reads_its_output_and_an_ambiguous_one_lists_them(stack: Stack) -> None:
    """Issue 44: `show PREFIX --output` said "names no job that started" for a job that ran (the docs' example)."""
    import uuid

    tag = uuid.uuid4().hex[:12]
    for name in ("first", "second"):  # the envelope's id is the request ID
        body = {"argv": ["sh", "-c", f"echo from-the-{name}"], "privileged": False}
        assert stack.exec(body, id=f"{tag}-{name}")["ok"]
    one = stack.cli("show", f"{tag}-f", "--output")
    assert one.returncode == 0, one.stderr
    assert "from-the-first" in one.stdout and "matches exec.finished" in one.stdout
    story = stack.cli("show", f"{tag}-s")  # `show` itself takes it too
    assert story.returncode == 0 and f"{tag}-second" in story.stdout, story.stderr
    both = stack.cli("show", tag, "--output")
    assert both.returncode != 0 and "from-the" not in both.stdout
    assert f"{tag}-first" in both.stderr and f"{tag}-second" in both.stderr and "give more of the ID" in both.stderr
    assert stack.cli("show", f"{tag}-x", "--output").returncode != 0  # a prefix of nothing is still not found


def test_a_log_past_its_bound_is_cut_and_the_chain_says_so(stack: Stack) -> None:
    run(stack, "i=0; while [ $i -lt 600 ]; do echo line-$i; i=$((i+1)); done", operation_id="op-out-2")
    rid = request_id_of(stack, "op-out-2")
    kept = finished(stack, rid)["output_log"]
    assert kept["cut"] is True and kept["stored_bytes"] == 4096
    shown = stack.cli("show", rid, "--output")
    assert shown.returncode == 0, shown.stderr
    assert "output log cut at 4096 bytes" in shown.stdout and "line-0" in shown.stdout
    assert "line-599" not in shown.stdout


def test_a_changed_log_no_longer_matches_the_chain(stack: Stack) -> None:
    run(stack, "echo original", operation_id="op-out-3")
    rid = request_id_of(stack, "op-out-3")
    kept = finished(stack, rid)["output_log"]
    path = stack.runtime_dir / "state" / "output" / kept["file"]
    raw = gzip.decompress(path.read_bytes()).replace(b"original", b"tampered")
    path.write_bytes(gzip.compress(raw))
    shown = stack.cli("show", rid, "--output")
    assert shown.returncode == 1 and "DOES NOT MATCH THE CHAIN" in shown.stdout


def test_a_job_without_output_keeps_no_file(stack: Stack) -> None:
    stack.exec({"argv": ["true"], "privileged": False, "operation_id": "op-out-4"})
    rid = request_id_of(stack, "op-out-4")
    kept = finished(stack, rid)["output_log"]
    assert kept["file"] is None and kept["stored_bytes"] == 0
    shown = stack.cli("show", rid, "--output")
    assert shown.returncode == 0 and "no output" in shown.stdout


def test_logs_follow_streams_a_running_job_and_ends_with_it(stack: Stack) -> None:
    import threading

    replies: list[dict[str, Any]] = []
    body = {"argv": ["sh", "-c", "echo first; sleep 1.5; echo second; sleep 1; echo third"], "privileged": False}
    worker = threading.Thread(target=lambda: replies.append(stack.exec(body | {"operation_id": "op-follow"})))
    worker.start()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if any(r["kind"] == "exec.started" and r["operation_id"] == "op-follow" for r in stack.journal_rows()):
            break
        time.sleep(0.05)
    env = dict(os.environ) | {"AIRLOCK_OPERATOR_SOCKET": stack.operator}
    follow = subprocess.Popen(
        [sys.executable, "-m", "airlock", "logs", "op-follow", "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert follow.stdout is not None
    seen: list[tuple[float, str]] = []
    for line in follow.stdout:
        seen.append((time.monotonic(), line))
    follow.wait(30)
    worker.join(30)
    text = "".join(line for _, line in seen)
    assert follow.returncode == 0, follow.stderr.read() if follow.stderr else ""
    assert "first" in text and "second" in text and "third" in text and "the job ended" in text
    # Streamed as it came, not all at the end: "first" arrived well before "third".
    first = next(t for t, line in seen if "first" in line)
    third = next(t for t, line in seen if "third" in line)
    assert third - first > 1.0


def test_redaction_holds_when_a_value_is_split_across_reads(stack: Stack) -> None:
    secret = "s3cr3t-VALUE-0123456789"
    script = f"printf '%s' '{secret[:7]}'; sleep 0.3; printf '%s\\n' '{secret[7:]}'"
    data = stack.exec(
        {
            "argv": ["sh", "-c", script],
            "privileged": False,
            "operation_id": "op-redact",
            "protected_env": {"API_TOKEN": secret},
        }
    )
    assert data["ok"], data
    out = base64.b64decode(data["data"]["stdout"])
    assert secret.encode() not in out and b"[redacted]" in out
    rid = request_id_of(stack, "op-redact")
    shown = stack.cli("show", rid, "--output")
    assert secret not in shown.stdout and "[redacted]" in shown.stdout
    kept = finished(stack, rid)["output_log"]
    raw = gzip.decompress((stack.runtime_dir / "state" / "output" / kept["file"]).read_bytes())
    assert secret.encode() not in raw and secret[:7].encode() not in raw


def test_the_runner_prunes_by_itself(tmp_path: Path) -> None:
    config = POLICY + "  output_log_max_age_seconds: 1\n"
    with custom_stack(tmp_path / "rt", config) as s:
        directory = s.runtime_dir / "state" / "output"
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        from airlock.runner import outputlog

        old = directory / outputlog.new_name()
        old.write_bytes(b"")
        os.utime(old, (time.time() - 60, time.time() - 60))
        run(s, "echo x")  # a job's end lets the runner prune (at most once a minute)
        until("the old log pruned", lambda: not old.exists(), timeout=10)
        # Journaled before it went (issue 51): the file, its group ("" for a name from before groups), why.
        deleted = [json.loads(r["payload"]) for r in s.journal_rows() if r["kind"] == "output_log.deleted"]
        assert deleted and deleted[0]["files"][0]["file"] == old.name, deleted
        assert deleted[0]["files"][0]["reason"] == "age" and deleted[0]["files"][0]["group"] == ""


def test_pending_and_the_statement_name_the_credentials_a_request_would_receive(tmp_path: Path) -> None:
    from support import Background, wait_pending

    secret = tmp_path / "db.pass"
    secret.write_text("credential-value-not-shown\n")
    os.chmod(secret, 0o600)
    config = f"""
policy:
  default: deny
  rules:
    - name: ask-with-credential
      decision: ask
      privileged: true
      commands: [[/usr/bin/cat, "..."]]
      credentials: {{db: {secret}, api: {secret}}}
"""
    with custom_stack(tmp_path / "rt", config) as s:
        bg = Background(s, {"argv": ["cat", "/etc/hostname"], "privileged": True})
        item = wait_pending(s, bg.request_id)
        assert item["credentials"] == [["api", "db"]]
        pending = s.cli("pending")
        assert f"{bg.request_id} credentials: stage 1: api, db" in pending.stdout, pending.stdout
        statement = s.native("statement", {"id": bg.request_id}, path=s.operator)["data"]["statement"]
        assert 'credentials: "stage 1: api, db"' in statement
        for text in (pending.stdout, statement, json.dumps(item)):
            assert "credential-value-not-shown" not in text
        s.cli("deny", bg.request_id, "--reason", "test over")
        bg.result()

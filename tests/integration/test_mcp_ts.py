"""`airlock mcp` driven by the official MCP TypeScript SDK client (issue 31).

The client most agent hosts are built on (Claude Code among them):
`@modelcontextprotocol/sdk`, pinned in tests/mcp_ts/package-lock.json and
installed by `make test` (`npm ci`) on Debian's nodejs.  tests/mcp_ts/client.mjs
starts `airlock mcp` over stdio exactly as such a host does, runs the steps it
is given and prints what the SDK returned.  Its ReadBuffer rejects a line over
10 MiB and closes the session: the large-output cases check that the session
survives and that the result says what was cut.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Stack, custom_stack
from waits import wait_record

TS_DIR = Path(__file__).resolve().parents[1] / "mcp_ts"
MiB = 1024 * 1024

if shutil.which("node") is None:
    pytest.skip("node is not installed (make deps installs Debian's nodejs)", allow_module_level=True)
if not (TS_DIR / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir():
    pytest.skip(
        "the MCP TypeScript SDK is not installed (make test runs npm ci in tests/mcp_ts)", allow_module_level=True
    )

# 3 MiB of 0xff bytes: not UTF-8 (no file argument, which policy would ask an operator about).
BINARY = [["yes", ""], ["tr", "\\n", "\\377"], ["head", "-c", str(3 * MiB)]]

CONFIG = """
approval:
  timeout_seconds: 30
policy:
  default: ask
  rules:
    - name: harmless
      decision: allow
      commands:
        - [/usr/bin/echo, "..."]
        - [/usr/bin/cat]
        - [/usr/bin/tr, "..."]
        - [/usr/bin/head, "..."]
        - [/usr/bin/yes, "..."]
        - [/usr/bin/sleep, "..."]
    - name: never-dd
      decision: deny
      commands: [[/usr/bin/dd, "..."]]
"""


@pytest.fixture(scope="module")
def tstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("mcpts")), CONFIG) as s:
        yield s


def drive(stack: Stack, steps: list[dict[str, Any]], timeout: float = 120) -> dict[str, Any]:
    """Run client.mjs with these steps; what the TypeScript SDK saw."""
    spec = {
        "command": sys.executable,
        "args": ["-m", "airlock", "mcp", "--socket", stack.agent, "--progress-interval", "0.3"],
        "steps": steps,
        # Only what the test process itself was given (say PYTHONPATH): the SDK passes no other variables.
        "env": {name: os.environ[name] for name in ("PYTHONPATH",) if name in os.environ},
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as file:
        json.dump(spec, file)
        file.flush()
        done = subprocess.run(
            ["node", str(TS_DIR / "client.mjs"), file.name],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=TS_DIR,
        )
    assert done.returncode == 0, done.stderr[-4000:]
    out: dict[str, Any] = json.loads(done.stdout)
    return out


def text(step: dict[str, Any]) -> str:
    assert "result" in step, step
    content = step["result"]["content"]
    assert len(content) == 1 and content[0]["type"] == "text"
    return str(content[0]["text"])


def survived(out: dict[str, Any]) -> None:
    # The session lived through every step: nothing closed it, the SDK reported no error.
    assert not out["closed"] and not out["transportErrors"], out["transportErrors"]
    assert "result" in out["steps"][-1], out["steps"][-1]


def test_list_run_pipeline_denial_and_bad_arguments(tstack: Stack) -> None:
    out = drive(
        tstack,
        [
            {"tool": "execute", "arguments": {"argv": ["echo", "héllo"]}},
            {"tool": "execute", "arguments": {"pipeline": [["echo", "a b"], ["tr", "a-z", "A-Z"]]}},
            {"tool": "execute", "arguments": {"argv": ["dd", "if=/dev/zero"]}},
            {"tool": "execute", "arguments": {"argv": "echo"}},
            {"tool": "execute", "arguments": {"argv": ["cat"], "stdin": "x" * 20_000}},
            {"tool": "status", "arguments": {"verbose": True}},
            {"tool": "status"},
        ],
    )
    survived(out)
    tools = {t["name"]: t for t in out["tools"]}
    assert set(tools) == {"execute", "status"}
    props = tools["execute"]["inputSchema"]["properties"]
    assert props["stdin"]["maxLength"] == 8192 and props["max_output_bytes"]["maximum"] == MiB
    run, pipeline, denied, bad, big_stdin, bad_status, status = out["steps"]
    assert text(run).startswith("The command ran: exit code 0.") and "héllo" in text(run)
    assert "--- stdout ---\nA B" in text(pipeline)
    assert denied["result"]["isError"] and text(denied).startswith("DENIED by policy rule 'never-dd'")
    assert bad["result"]["isError"] and "argv: must be a non-empty list of strings" in text(bad)
    # The refusal names the argument the model sent, and the limit the schema states.
    assert big_stdin["result"]["isError"]
    assert "stdin: is 20000 bytes; the limit is 8192 bytes" in text(big_stdin) and "payload" not in text(big_stdin)
    assert bad_status["result"]["isError"] and "unknown argument 'verbose'" in text(bad_status)
    assert "airlock is reachable" in text(status)


def test_an_approval_reports_progress_then_the_result(tstack: Stack) -> None:
    def approve() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for p in tstack.native("pending", path=tstack.operator)["data"]["pending"]:
                if "ts-approval" in json.dumps(p["request"]):
                    time.sleep(1.0)  # a few progress ticks while it waits
                    tstack.native("approve", {"id": p["request_id"]}, path=tstack.operator)
                    return
            time.sleep(0.1)

    operator = threading.Thread(target=approve)
    operator.start()
    out = drive(
        tstack,
        [{"tool": "execute", "arguments": {"argv": ["/usr/bin/printf", "ts-approval"]}, "progress": True}],
    )
    operator.join()
    survived(out)
    step = out["steps"][0]
    assert "approved by operator" in text(step) and "ts-approval" in text(step)
    messages = [p.get("message", "") for p in step["progress"]]
    assert any("waiting for an operator to approve" in m for m in messages), messages
    values = [p["progress"] for p in step["progress"]]
    assert values == sorted(values) and len(set(values)) == len(values)


def test_a_cancelled_call_stops_the_command_and_the_session_goes_on(tstack: Stack) -> None:
    out = drive(
        tstack,
        [
            {"tool": "execute", "arguments": {"argv": ["sleep", "31"]}, "abortAfterMs": 1500},
            {"tool": "execute", "arguments": {"argv": ["echo", "after"]}},
        ],
    )
    cancelled, after = out["steps"]
    # The SDK rejects the aborted call at once and tells the server (notifications/cancelled).
    assert "error" in cancelled and cancelled["elapsedMs"] < 10_000, cancelled
    survived(out)
    assert "after" in text(after)
    received = [r for r in tstack.journal_rows() if r["kind"] == "request.received" and '"31"' in r["payload"]]
    assert len(received) == 1
    rid = received[0]["request_id"]
    wait_record(tstack, "exec.finished", request_id=rid)
    kinds = [r["kind"] for r in tstack.journal_rows() if r["request_id"] == rid]
    assert "exec.cancelled" in kinds, kinds


@pytest.mark.parametrize(
    ("name", "arguments", "shown"),
    [
        # 11 MiB of text: one JSON-RPC line over 10 MiB used to close the session.
        ("text", {"pipeline": [["yes", "airlock line of text é"], ["head", "-c", str(11 * MiB)]]}, 64 * 1024),
        # Control characters cost six bytes each in JSON: the result still fits one line.
        (
            "control",
            {
                "pipeline": [["yes", ""], ["tr", "\\n", "\\001"], ["head", "-c", str(11 * MiB)]],
                "max_output_bytes": MiB,
            },
            None,
        ),
    ],
)
def test_large_text_output_is_cut_and_the_session_survives(
    tstack: Stack, name: str, arguments: dict[str, Any], shown: int | None
) -> None:
    out = drive(tstack, [{"tool": "execute", "arguments": arguments}, {"tool": "status"}])
    survived(out)
    result = text(out["steps"][0])
    assert result.startswith("The command ran")
    assert "--- stdout (CUT: showing the first " in result
    assert "airlock captured the first 4194304" in result  # more than the runner captures
    assert "airlock keeps no copy of the output" in result and "sha256 " in result
    if shown is not None:
        assert f"showing the first {shown} of" in result
    assert len(result.encode()) < 5 * MiB


def test_binary_output_is_not_shown_and_the_session_survives(tstack: Stack) -> None:
    out = drive(
        tstack,
        [{"tool": "execute", "arguments": {"pipeline": BINARY}}, {"tool": "ping"}],
    )
    assert not out["closed"] and not out["transportErrors"]
    result = text(out["steps"][0])
    assert f"--- stdout (binary, {3 * MiB} bytes, sha256 " in result
    assert len(result) < 4096
    assert "result" in out["steps"][1]


def test_an_over_long_request_gets_an_error_matched_to_its_call(tstack: Stack) -> None:
    # Over the server's 1 MiB line limit: the SDK writes "id" last, and the
    # error must carry it, or the call waits for the client's own timeout.
    out = drive(
        tstack,
        [
            {"tool": "execute", "arguments": {"argv": ["cat"], "stdin": "x" * (2 * MiB)}, "timeoutMs": 30_000},
            {"tool": "execute", "arguments": {"argv": ["echo", "still here"]}},
        ],
    )
    too_long, after = out["steps"]
    assert too_long["error"]["code"] == -32600, too_long
    assert "longer than the limit of 1048576 bytes" in too_long["error"]["message"]
    assert too_long["elapsedMs"] < 10_000
    survived(out)
    assert "still here" in text(after)

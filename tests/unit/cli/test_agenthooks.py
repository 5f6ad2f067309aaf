"""`airlock agent-hook` fed the payloads agents document (issue 48): airlock's sudo allowed, any other blocked.

The payloads are in the shapes the agents' documentation gives: Claude Code's
PreToolUse and PermissionRequest on its Bash tool, Codex CLI's
PermissionRequest, Gemini CLI's BeforeTool on run_shell_command.  The hook
runs as the agents run it: a process with the JSON on stdin, its PATH as the
shell's, its answer on stdout and its exit status read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airlock.cli.agenthooks import sudo_in

CLAUDE_PRE = {
    "session_id": "abc123",
    "transcript_path": "/home/agent/.claude/projects/x/abc123.jsonl",
    "cwd": "/home/agent/project",
    "permission_mode": "default",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "sudo apt-get install -y nginx", "description": "Install nginx", "timeout": 120000},
    "tool_use_id": "toolu_01ABC123",
}
CLAUDE_PERMISSION = {
    "session_id": "abc123",
    "transcript_path": "/home/agent/.claude/projects/x/abc123.jsonl",
    "cwd": "/home/agent/project",
    "permission_mode": "default",
    "hook_event_name": "PermissionRequest",
    "tool_name": "Bash",
    "tool_input": {"command": "echo 'x' | sudo tee -a /etc/hosts", "description": "Add a host"},
}
CODEX_PERMISSION = {
    "session_id": "0199a213-81c0-7800-8aa1-bbab2a035a53",
    "transcript_path": "/home/agent/.codex/sessions/rollout.jsonl",
    "cwd": "/home/agent/project",
    "hook_event_name": "PermissionRequest",
    "model": "gpt-5-codex",
    "tool_name": "Bash",
    "tool_input": {"command": "sudo systemctl restart nginx", "description": "restart the web server"},
}
GEMINI_BEFORE = {
    "session_id": "s-1",
    "transcript_path": "/home/agent/.gemini/tmp/chats/session.json",
    "cwd": "/home/agent/project",
    "hook_event_name": "BeforeTool",
    "timestamp": "2026-12-06T01:20:00.000Z",
    "tool_name": "run_shell_command",
    "tool_input": {"command": "sudo -u postgres psql -c 'select 1'", "description": "query", "dir_path": "."},
}


@pytest.fixture
def bins(tmp_path: Path) -> dict[str, Path]:
    """airlock's agent-bin (a sudo in it) and another folder with a sudo of its own (the real one's stand-in)."""
    made = {}
    for name in ("agent-bin", "usr-bin"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "sudo").write_text("#!/bin/sh\nexit 1\n")
        (folder / "sudo").chmod(0o755)
        made[name] = folder
    return made


def hook(agent: str, payload: Any, agent_bin: Path, path: str) -> tuple[int, Any, str]:
    raw = payload if isinstance(payload, str) else json.dumps(payload)
    done = subprocess.run(
        [sys.executable, "-m", "airlock", "agent-hook", agent, "--agent-bin", str(agent_bin)],
        input=raw,
        capture_output=True,
        text=True,
        env=dict(os.environ) | {"PATH": path},
        timeout=60,
    )
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else None), done.stderr


def test_claude_code_pre_tool_use_allows_airlocks_sudo_and_raises_the_timeout(bins: dict[str, Path]) -> None:
    status, out, _ = hook("claude-code", CLAUDE_PRE, bins["agent-bin"], f"{bins['agent-bin']}:{bins['usr-bin']}")
    specific = out["hookSpecificOutput"]
    assert status == 0 and specific["hookEventName"] == "PreToolUse"
    assert specific["permissionDecision"] == "allow" and "a person is asked" in specific["permissionDecisionReason"]
    assert specific["updatedInput"] == CLAUDE_PRE["tool_input"] | {"timeout": 600000}  # type: ignore[operator]


def test_claude_code_blocks_a_sudo_that_is_not_airlocks(bins: dict[str, Path]) -> None:
    status, out, _ = hook("claude-code", CLAUDE_PRE, bins["agent-bin"], f"{bins['usr-bin']}:{bins['agent-bin']}")
    specific = out["hookSpecificOutput"]
    assert status == 0 and specific["permissionDecision"] == "deny"
    assert f"the sudo on this PATH is {bins['usr-bin']}/sudo" in specific["permissionDecisionReason"]
    # No sudo at all is blocked too: the command would fail, and the agent is told where airlock's is.
    _, out, _ = hook("claude-code", CLAUDE_PRE, bins["agent-bin"], "/nonexistent")
    assert "no sudo is on this PATH" in out["hookSpecificOutput"]["permissionDecisionReason"]


def test_an_absolute_sudo_is_blocked_even_with_airlocks_first(bins: dict[str, Path]) -> None:
    payload = CLAUDE_PRE | {"tool_input": {"command": f"{bins['usr-bin']}/sudo id"}}
    _, out, _ = hook("claude-code", payload, bins["agent-bin"], str(bins["agent-bin"]))
    assert out["hookSpecificOutput"]["permissionDecision"] == "deny"


def test_claude_code_permission_request(bins: dict[str, Path]) -> None:
    _, out, _ = hook("claude-code", CLAUDE_PERMISSION, bins["agent-bin"], str(bins["agent-bin"]))
    assert out == {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": {"behavior": "allow"}}}


def test_codex_permission_request(bins: dict[str, Path]) -> None:
    status, out, _ = hook("codex", CODEX_PERMISSION, bins["agent-bin"], str(bins["agent-bin"]))
    assert status == 0 and out["hookSpecificOutput"]["decision"] == {"behavior": "allow"}
    _, out, _ = hook("codex", CODEX_PERMISSION, bins["agent-bin"], str(bins["usr-bin"]))
    decision = out["hookSpecificOutput"]["decision"]
    assert decision["behavior"] == "deny" and "not airlock's" in decision["message"]


def test_gemini_before_tool(bins: dict[str, Path]) -> None:
    status, out, _ = hook("gemini", GEMINI_BEFORE, bins["agent-bin"], str(bins["agent-bin"]))
    assert status == 0 and out["decision"] == "allow"
    _, out, _ = hook("gemini", GEMINI_BEFORE, bins["agent-bin"], str(bins["usr-bin"]))
    assert out["decision"] == "deny" and out["reason"].startswith("blocked: ")


@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_other_commands_get_no_opinion(agent: str, bins: dict[str, Path]) -> None:
    payload = {"claude-code": CLAUDE_PRE, "codex": CODEX_PERMISSION, "gemini": GEMINI_BEFORE}[agent]
    plain = payload | {"tool_input": {"command": "ls -la && echo sudo is a word here"}}
    status, out, _ = hook(agent, plain, bins["agent-bin"], str(bins["usr-bin"]))
    assert status == 0 and out in (None, {})


@pytest.mark.parametrize("raw", ["", "not json", "[1, 2]", '{"tool_name": "Bash", "tool_input": "sudo id"}'])
@pytest.mark.parametrize("agent", ["claude-code", "codex", "gemini"])
def test_unreadable_input_fails_closed(agent: str, raw: str, bins: dict[str, Path]) -> None:
    status, out, err = hook(agent, raw, bins["agent-bin"], str(bins["agent-bin"]))
    assert status == 2 and out is None and "blocked" in err


@pytest.mark.parametrize(
    ("command", "runs"),
    [
        ("sudo id", True),
        ("cd /srv && sudo make install", True),
        ("DEBIAN_FRONTEND=noninteractive sudo -E apt-get upgrade", True),
        ("echo x | sudo tee /etc/x", True),
        ("(sudo true)", True),
        ("out=$(sudo cat /etc/shadow)", True),
        ("sudoedit /etc/hosts", True),
        ("env sudo id", True),
        ("echo sudo", False),
        ("grep sudo /var/log/auth.log", False),
        ("pseudo id", False),
    ],
)
def test_what_counts_as_typing_sudo(command: str, runs: bool) -> None:
    assert sudo_in(command)[0] is runs

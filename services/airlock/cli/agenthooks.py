"""`airlock agent-hook AGENT`: the hook an agent's tool runs before a shell command (issue 48): fails closed.

Claude Code (``PreToolUse`` and ``PermissionRequest`` on its Bash tool), Codex
CLI (``PermissionRequest``) and Gemini CLI (``BeforeTool`` on
``run_shell_command``) each hand a hook their documented JSON on stdin and read
its answer.  For a command that types ``sudo``:

- airlock's `sudo` is the one the shell will find (first on PATH): allow it,
  so the agent's own prompt does not ask the person a second time, and tell
  the agent a person may be asked and that waiting is expected (Claude Code's
  Bash timeout is raised to its most, 10 minutes);
- another `sudo` (the real one would ask for a password nobody types, or use
  a cached one), or an absolute ``/usr/bin/sudo``: deny, saying how to reach
  airlock's;
- input the hook cannot read: block (exit 2), never a silent allow.

Any other command gets no opinion: the tool's own rules decide.  `answer` is
pure; `main` reads stdin and the PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Any

AGENT_BIN = "/usr/lib/airlock/agent-bin"
AGENTS = ("claude-code", "codex", "gemini")
CLAUDE_MAX_TIMEOUT_MS = 600_000  # the Bash tool's own ceiling

# `sudo` or `sudoedit` where a shell starts a command: at the start, after ; & | ( newline, $( or `,
# after VAR=value words and the prefixes that run what follows (env, command, exec, nohup, time).
_SUDO = re.compile(
    r"(?:^|[;&|(\n`]|\$\()\s*(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:(?:env|command|exec|nohup|time)\s+)*"
    r"(?P<path>\S*/)?(?P<name>sudo|sudoedit)(?=[\s;&|)]|$)"
)
_WAIT = (
    "airlock decides this sudo: its policy runs it at once, or a person is asked and may take minutes to "
    "answer; wait for it (typing the same command again joins the same request, it does not ask twice)"
)


@dataclass(frozen=True, slots=True)
class HookAnswer:
    """What the hook prints on stdout and stderr, and its exit status."""

    status: int
    stdout: str = ""
    stderr: str = ""


def sudo_in(command: str) -> tuple[bool, str | None]:
    """(whether ``command`` runs sudo, the absolute path it names for it, if any)."""
    found = [m for m in _SUDO.finditer(command)]
    if not found:
        return False, None
    paths = [m.group("path") + m.group("name") for m in found if m.group("path")]
    return True, (paths[0] if paths else None)


def _problem(command: str, found_sudo: str | None, agent_bin: str) -> str | None:
    """Why this command's sudo would not reach airlock, or None when it would."""
    _, named = sudo_in(command)
    ours = os.path.join(agent_bin, "sudo")
    if named is not None and os.path.realpath(os.path.dirname(named)) != agent_bin:
        return (
            f"{named} is not airlock's sudo (it would ask for a password nobody types): write plain `sudo`, "
            f"which finds airlock's ({ours}) first on PATH"
        )
    if found_sudo is None or os.path.dirname(found_sudo) != agent_bin:
        where = f"the sudo on this PATH is {found_sudo}, not airlock's" if found_sudo else "no sudo is on this PATH"
        return (
            f"{where}: put {agent_bin} first on PATH (docs/agents.md), then type sudo as usual; "
            "a person approves through airlock"
        )
    return None


def answer(agent: str, raw: str, found_sudo: str | None, agent_bin: str = AGENT_BIN) -> HookAnswer:
    """The hook's answer to one payload (``raw``, the JSON its tool wrote on stdin)."""
    try:
        payload = json.loads(raw)
        if not isinstance(payload, dict):
            raise ValueError("not an object")
        tool_input = payload.get("tool_input") or {}
        if not isinstance(tool_input, dict):
            raise ValueError("tool_input is not an object")
        command = tool_input.get("command")
        if command is not None and not isinstance(command, str):
            raise ValueError("tool_input.command is not a string")
    except ValueError as exc:
        return HookAnswer(2, stderr=f"airlock agent-hook: unreadable hook input ({exc}); blocked\n")
    event = str(payload.get("hook_event_name") or "")
    shell_tool = {"claude-code": "Bash", "codex": "Bash", "gemini": "run_shell_command"}[agent]
    if payload.get("tool_name") != shell_tool or not command or not sudo_in(command)[0]:
        return HookAnswer(0, "{}\n" if agent == "gemini" else "")  # no opinion
    problem = _problem(command, found_sudo, agent_bin)
    if agent == "gemini":
        body: dict[str, Any] = (
            {"decision": "deny", "reason": f"blocked: {problem}"}
            if problem
            else {"decision": "allow", "systemMessage": _WAIT}
        )
    elif event == "PermissionRequest":  # Claude Code's and Codex's permission dialog
        decision: dict[str, Any] = (
            {"behavior": "deny", "message": f"blocked: {problem}"} if problem else {"behavior": "allow"}
        )
        body = {"hookSpecificOutput": {"hookEventName": "PermissionRequest", "decision": decision}}
    elif agent == "codex":
        return HookAnswer(0)  # Codex's other events: no opinion
    else:
        specific: dict[str, Any] = {"hookEventName": "PreToolUse"}
        if problem:
            specific |= {"permissionDecision": "deny", "permissionDecisionReason": f"blocked: {problem}"}
        else:
            specific |= {"permissionDecision": "allow", "permissionDecisionReason": _WAIT}
            timeout = tool_input.get("timeout")
            if not isinstance(timeout, int) or timeout < CLAUDE_MAX_TIMEOUT_MS:
                specific["updatedInput"] = dict(tool_input) | {"timeout": CLAUDE_MAX_TIMEOUT_MS}
        body = {"hookSpecificOutput": specific}
    return HookAnswer(0, json.dumps(body) + "\n")


def main(agent: str, agent_bin: str = AGENT_BIN) -> int:
    """Read the payload on stdin, answer it; any failure blocks (exit 2)."""
    try:
        raw = sys.stdin.read(4 * 1024 * 1024)
        found = shutil.which("sudo", path=os.environ.get("PATH") or "")
        done = answer(agent, raw, os.path.realpath(found) if found else None, os.path.realpath(agent_bin))
    except Exception as exc:  # the hook must never let a command through by crashing
        print(f"airlock agent-hook: {exc!r}; blocked", file=sys.stderr)
        return 2
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.status

"""The execute and status tools: argument checks and the texts a model reads."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from airlock.mcp import tools
from airlock.mcp.tools import ArgumentError, exec_args, render_evidence, render_refusal, render_status


def args(**given: Any) -> dict[str, Any]:
    return exec_args(given, now="2026-01-01T00:00:00Z", operation_id="mcp-1")


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def test_argv_becomes_a_streamed_native_exec_with_its_own_operation() -> None:
    assert args(argv=["id", "-u"]) == {
        "argv": ["id", "-u"],
        "privileged": True,
        "time": "2026-01-01T00:00:00Z",
        "operation_id": "mcp-1",
        "stream": True,
    }


def test_every_field_maps_to_the_agent_door() -> None:
    got = exec_args(
        {
            "pipeline": [["cat"], ["wc", "-l"]],
            "privileged": False,
            "reason": "r",
            "env": {"LANG": "C"},
            "cwd": "/tmp",
            "stdin": "héllo\n",
            "timeout": 1500,
        },
        now="t",
        operation_id="op",
        session="s1",
    )
    assert got["pipeline"] == [["cat"], ["wc", "-l"]] and got["privileged"] is False
    assert got["reason"] == "r" and got["env"] == {"LANG": "C"} and got["cwd"] == "/tmp"
    assert base64.b64decode(got["stdin"]).decode() == "héllo\n"
    assert got["timeout_ms"] == 1500 and got["session"] == "s1"
    assert args(command="df -h | sort")["command"] == "df -h | sort"
    assert args(argv=["true"], timeout=2.0)["timeout_ms"] == 2


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "give exactly one of argv, pipeline or command"),
        ({"argv": ["a"], "command": "b"}, "(got argv and command)"),
        ({"argv": []}, "argv: must be a non-empty list"),
        ({"argv": "ls -l"}, "argv: must be a non-empty list"),
        ({"argv": ["ls", 3]}, "argv[1]: must be a string"),
        ({"argv": [""]}, "argv[0]: the program name must not be empty"),
        ({"pipeline": []}, "pipeline: must be a non-empty list"),
        ({"pipeline": [["a"], "b"]}, "pipeline[1]: must be a non-empty list"),
        ({"command": "  "}, "command: must be a non-empty string"),
        ({"argv": ["a"], "privileged": "yes"}, "privileged: must be true or false"),
        ({"argv": ["a"], "env": {"A": 1}}, "env: must be an object of string values"),
        ({"argv": ["a"], "env": ["A=1"]}, "env: must be an object"),
        ({"argv": ["a"], "cwd": 5}, "cwd: must be a string"),
        ({"argv": ["a"], "stdin": 5}, "stdin: must be a string"),
        ({"argv": ["a"], "timeout": 0}, "timeout: must be a whole number"),
        ({"argv": ["a"], "timeout": 1.5}, "timeout: must be a whole number"),
        ({"argv": ["a"], "timeout": True}, "timeout: must be a whole number"),
        ({"argv": ["a"], "timeout": float("inf")}, "timeout: must be a whole number"),
        ({"argv": ["a"], "shell": True}, "unknown argument 'shell'"),
    ],
)
def test_bad_arguments_name_what_is_wrong(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError) as err:
        exec_args(given, now="t", operation_id="op")
    assert message in str(err.value)
    result = tools.argument_error(err.value)
    assert result.is_error and message in result.text


def test_the_schema_is_flat_and_closed() -> None:
    schema = tools.EXECUTE.input_schema
    # Some model APIs refuse a top-level oneOf/anyOf: "exactly one of" is checked here instead.
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert not {"oneOf", "anyOf", "allOf"} & set(schema)
    with pytest.raises(ArgumentError, match="unknown argument"):
        args(argv=["a"], protected_env={})  # the agent door knows it; this tool does not offer it


EVIDENCE = {
    "operation_id": "mcp-1",
    "replay": False,
    "duration_ms": 4,
    "cwd": "/",
    "uid": 0,
    "timed_out": False,
    "timeout_reason": None,
    "cancelled": False,
    "stages": [
        {
            "argv": ["sh", "-c", "echo hi; exit 3"],
            "exit_code": 3,
            "signal": None,
            "stderr": b64("oops\n"),
            "stderr_truncated": False,
        }
    ],
    "stdout": b64("hi\n"),
    "stdout_truncated": False,
    "decision": {"rule": "harmless", "decided_by": "policy"},
}


def test_a_run_shows_exit_code_output_and_where_it_came_from() -> None:
    result = render_evidence(EVIDENCE)
    assert not result.is_error
    assert result.text == (
        "The command ran: exit code 3.\n"
        "operation mcp-1; ran as uid 0 in /; 4 ms; allowed by policy rule 'harmless'.\n"
        "\n"
        "--- stdout ---\nhi\n--- stderr ---\noops"
    )


def test_a_pipeline_shows_every_stage() -> None:
    evidence = EVIDENCE | {
        "stages": [
            {"argv": ["cat", "/etc/hosts"], "exit_code": 0, "stderr": ""},
            {"argv": ["grep", "x"], "exit_code": None, "signal": 13, "stderr": b64("broken"), "stderr_truncated": True},
        ],
        "stdout": "",
        "stdout_truncated": True,
        "decision": {"rule": "ask-all", "decided_by": "alice"},
    }
    text = render_evidence(evidence).text
    assert text.startswith("The command ran: killed by signal 13.\n")
    assert "Pipeline: stage 1 (cat /etc/hosts): exit code 0; stage 2 (grep x): killed by signal 13." in text
    assert "approved by operator alice (rule 'ask-all')" in text
    assert "--- stdout (TRUNCATED by airlock's output cap) ---\n(empty)" in text
    assert "--- stderr of stage 1 (cat /etc/hosts) ---\n(empty)" in text
    assert "--- stderr of stage 2 (grep x) (TRUNCATED by airlock's output cap) ---\nbroken" in text


def test_timeouts_cancellations_replays_and_binary_output_are_said_plainly() -> None:
    assert (
        "TIMED OUT (timeout_ms) and was killed (killed by signal 15)"
        in render_evidence(
            EVIDENCE
            | {
                "timed_out": True,
                "timeout_reason": "timeout_ms",
                "stages": [{"argv": ["sleep"], "exit_code": None, "signal": 15, "stderr": ""}],
            }
        ).text
    )
    assert render_evidence(EVIDENCE | {"cancelled": True}).text.startswith("The command was CANCELLED")
    assert "did not run again" in render_evidence(EVIDENCE | {"replay": True}).text
    binary = render_evidence(EVIDENCE | {"stdout": b64(b"\xff\xfeok")}).text
    assert "--- stdout (not valid UTF-8; undecodable bytes shown as U+FFFD) ---\n\ufffd\ufffdok" in binary


def test_a_denial_names_the_rule_and_says_not_to_retry() -> None:
    result = render_refusal("denied", "denied by policy rule 'never-dd'", {"rule": "never-dd", "decided_by": "policy"})
    assert result.is_error
    assert result.text.startswith("DENIED by policy rule 'never-dd'. The command did not run.")
    assert "Do not retry" in result.text
    by_operator = render_refusal(
        "denied", "denied by operator bob: not today", {"rule": "default", "decided_by": "bob"}
    )
    assert by_operator.text.startswith("DENIED by operator bob (rule 'default'): not today. The command did not run.")


def test_a_program_that_cannot_be_found_is_not_called_a_denial() -> None:
    result = render_refusal(
        "denied", "denied by policy rule 'unresolved'", {"rule": "unresolved", "decided_by": "policy"}
    )
    assert result.is_error and result.text.startswith("NOT RUN: airlock could not find the program")
    assert "DENIED" not in result.text
    missing = render_refusal("command_not_found", "sytemctl: command not found", {"program": "sytemctl"})
    assert missing.is_error and missing.text == result.text


def test_an_approval_timeout_is_not_a_denial() -> None:
    result = render_refusal("approval_timeout", "no operator decided within 60s", {"rule": "default"})
    assert result.is_error and result.text.startswith("NOT RUN: no operator approved it in time")
    assert "Nobody denied it" in result.text and "airlock approve" in result.text


def test_other_refusals_name_the_code_and_field() -> None:
    result = render_refusal("invalid_arguments", "env.X: is not allowed", {"field": "env.X"})
    assert result.is_error
    assert result.text == (
        "NOT RUN: airlock refused the request: invalid_arguments (field env.X): env.X: is not allowed. "
        "Fix the named field and call again."
    )
    assert "privileged: false" in render_refusal("privilege_unavailable", "no root", {}).text


def test_status_texts() -> None:
    up = render_status(
        "/run/airlock/agent.sock",
        {"version": "1.2"},
        None,
        "/run/airlock/operator.sock",
        {"hold": True, "hold_reason": "incident", "pending": 2, "policy": {"default": "ask", "rules": 4}},
        None,
    )
    assert up.text == (
        "airlock is reachable at /run/airlock/agent.sock (airlock 1.2, native protocol v1).\n"
        "Hold: ON (incident): every command waits for an operator.\n"
        "Pending approvals: 2.\n"
        "Policy: default ask, 4 rule(s)."
    )
    unknown = render_status("a.sock", {"version": "1"}, None, "o.sock", None, "permission denied")
    assert "unknown (operator socket at o.sock not usable: permission denied)" in unknown.text
    down = render_status("a.sock", None, "no such socket", None, None, None)
    assert down.text.startswith("airlock is NOT reachable at a.sock: no such socket")

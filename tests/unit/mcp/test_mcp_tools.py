"""The execute and status tools: argument checks and the texts a model reads."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from airlock.mcp import tools
from airlock.mcp.render import render_evidence, render_refusal
from airlock.mcp.tools import ArgumentError, exec_args, render_status


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
        # The runner captures 4 MiB a stream, not airlock's 16 MiB default (issue 31).
        "max_output_bytes": 4 * 1024 * 1024,
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
        "stdout": b64("x" * 10),
        "stdout_truncated": True,
        "decision": {"rule": "ask-all", "decided_by": "alice"},
    }
    text = render_evidence(evidence).text
    assert text.startswith("The command ran: killed by signal 13.\n")
    assert "Pipeline: stage 1 (cat /etc/hosts): exit code 0; stage 2 (grep x): killed by signal 13." in text
    assert "approved by operator alice (rule 'ask-all')" in text
    assert "--- stdout (CUT: showing the first 10 of more than 10 bytes (airlock captured the first 10);" in text
    assert "--- stderr of stage 1 (cat /etc/hosts) ---\n(empty)" in text
    assert "--- stderr of stage 2 (grep x) (CUT: showing the first 6 of more than 6 bytes" in text
    assert "airlock stopped capturing stdout at 10 bytes, stderr of stage 2 (grep x) at 6 bytes;" in text


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


# --- sizes (issue 31) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"argv": ["cat"], "stdin": "é" * 4097}, "stdin: is 8194 bytes; the limit is 8192 bytes"),
        ({"argv": ["echo", "y" * 8190]}, "argv: is 8196 bytes; the limit is 8192 bytes"),
        ({"pipeline": [["echo", "y" * 4096], ["grep", "z" * 4096]]}, "pipeline: is 8204 bytes; the limit is 8192"),
        ({"command": "x" * 8193}, "command: is 8193 bytes; the limit is 8192 bytes"),
        ({"argv": ["id"], "env": {"LANG": "e" * 4096}}, "env: is 4102 bytes; the limit is 4096 bytes"),
        ({"argv": ["id"], "reason": "r" * 1025}, "reason: is 1025 characters; the limit is 1024 characters"),
        ({"argv": ["id"], "cwd": "/" * 1025}, "cwd: is 1025 characters; the limit is 1024 characters"),
        ({"argv": ["id"], "max_output_bytes": 0}, "max_output_bytes: must be 1 to 1048576 (got 0)"),
        ({"argv": ["id"], "max_output_bytes": "64k"}, "max_output_bytes: must be a whole number of bytes"),
    ],
)
def test_sizes_over_the_schema_s_limits_are_refused_by_the_argument_s_name(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        args(**given)


def test_the_schema_states_every_limit_the_checks_apply() -> None:
    props = tools.EXECUTE.input_schema["properties"]
    assert props["stdin"]["maxLength"] == tools.STDIN_MAX == 8192
    assert props["command"]["maxLength"] == props["argv"]["items"]["maxLength"] == tools.COMMAND_MAX
    assert props["reason"]["maxLength"] == props["cwd"]["maxLength"] == 1024
    assert props["pipeline"]["maxItems"] == 64
    assert props["max_output_bytes"] == props["max_output_bytes"] | {"maximum": 1048576, "default": 65536}
    # (That all of them at their limits at once fit airlock's audit record when an
    # operator is asked, the largest record, test_mcp.py checks against a live stack.)


def test_status_takes_no_arguments() -> None:
    tools.status_args({})
    with pytest.raises(ArgumentError, match="unknown argument 'verbose'"):
        tools.status_args({"verbose": True})


def test_a_too_large_record_is_explained_in_the_tool_s_terms() -> None:
    result = render_refusal(
        "invalid_arguments", "payload is 70000 bytes of canonical JSON; the limit is 65536", {"field": "payload"}
    )
    assert result.is_error and "too large for airlock's audit record" in result.text
    assert "stdin, argv/pipeline/command, env or reason shorter" in result.text


def test_long_output_is_cut_with_its_size_and_digest() -> None:
    out = ("line of text é\n" * 10_000).encode()
    evidence = EVIDENCE | {"stdout": b64(out), "stdout_sha256": "ab" * 32}
    text = render_evidence(evidence, limit=1006).text
    assert f"--- stdout (CUT: showing the first 1005 of {len(out)} bytes; sha256 {'ab' * 32} of the {len(out)}" in text
    # The cut never splits a character: 1005, not 1006 (byte 1006 is the second of an é).
    shown = text.split("of the 160000 bytes airlock captured) ---\n", 1)[1].split("\n--- stderr", 1)[0]
    assert len(shown.encode()) == 1005 and shown.endswith("line of text ")
    assert "\ufffd" not in text
    assert "Output was cut (stdout): each stream shows at most 1006 bytes." in text
    assert "airlock keeps no copy of the output" in text and "max_output_bytes" in text
    assert "airlock stopped capturing" not in text  # it was captured whole: its size is known
    beyond = render_evidence(evidence | {"stdout_truncated": True}, limit=1006).text
    assert f"showing the first 1005 of more than {len(out)} bytes" in beyond
    assert f"airlock stopped capturing stdout at {len(out)} bytes; the rest was discarded unread" in beyond
    assert "Output was cut" not in render_evidence(evidence, limit=len(out)).text


def test_binary_output_is_described_not_shown() -> None:
    raw = bytes(range(256)) * 100
    text = render_evidence(EVIDENCE | {"stdout": b64(raw)}).text
    assert f"--- stdout (binary, {len(raw)} bytes, sha256 " in text and "not shown" in text
    assert "\x00" not in text and "\ufffd" not in text


def test_a_result_fits_one_message_however_many_stages_print() -> None:
    # 64 stages, each with 1 MiB of control characters (six bytes each in JSON): the
    # per-stream cap shrinks until the encoded text fits the result budget.
    noise = b64(b"\x01" * (1024 * 1024))
    stages = [{"argv": ["s", str(i)], "exit_code": 0, "stderr": noise} for i in range(64)]
    result = render_evidence(EVIDENCE | {"stdout": noise, "stages": stages}, limit=tools.OUTPUT_MAX)
    assert len(json.dumps(result.to_dict(), ensure_ascii=False).encode()) <= tools.RESULT_BUDGET + 4096
    assert "each stream shows at most" in result.text

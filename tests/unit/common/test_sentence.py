"""An audit record's journald MESSAGE reads like sudo's log line, and nothing in it is live (issue 32)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from airlock.common.sentence import COMMAND_CHARS, command_text, sentence

USERS = {1000: "deploy", 0: "root", 1001: "alice"}


def user_of(uid: int) -> str:
    return USERS.get(uid, str(uid))


def test_exec_started_says_who_as_whom_where_and_what() -> None:
    payload = {"spec": {"stages": [["/usr/bin/df", "-h"]], "privileged": True}, "uid": 0, "cwd": "/"}
    assert sentence("exec.started", payload, "r-1", 1000, user_of) == (
        "deploy : USER=root ; CWD=/ ; COMMAND=/usr/bin/df -h ; REQUEST=r-1"
    )


def test_a_decision_names_the_rule_or_the_operator() -> None:
    policy = {"stages": [{"argv": ["/usr/bin/systemctl", "restart", "nginx"], "rule": "web"}]}
    by_rule = sentence(
        "approval.decided", {"decision": "allow", "rule": "web", "by": "policy", "policy": policy}, "r-2", 1000, user_of
    )
    assert by_rule == "deploy : allow by rule web ; COMMAND=/usr/bin/systemctl restart nginx ; REQUEST=r-2"
    as_root = sentence(
        "approval.decided",
        {"decision": "allow", "rule": "web", "by": "policy", "policy": policy, "privileged": True, "run_as": 0},
        "r-2",
        1000,
        user_of,
    )
    assert as_root == "deploy : allow by rule web ; USER=root ; COMMAND=/usr/bin/systemctl restart nginx ; REQUEST=r-2"
    by_operator = sentence(
        "approval.decided",
        {"decision": "deny", "rule": "default", "by": "alice", "operator": "alice"},
        "r-3",
        1000,
        user_of,
    )
    assert by_operator is not None and by_operator.startswith("deploy : deny by operator alice ; ")


def test_the_end_says_how_it_ended() -> None:
    ended = sentence("exec.finished", {"exit_codes": [0, 3], "duration_ms": 12}, "r-4", 1000, user_of)
    assert ended == "deploy : finished ; EXIT=3 ; TOOK=12 ms ; REQUEST=r-4"
    stopped = sentence("exec.finished", {"exit_codes": [143], "timed_out": True}, "r-5", 1000, user_of)
    assert stopped is not None and "STOPPED=timed out" in stopped
    killed = sentence(
        "exec.finished",
        {"exit_codes": [None], "killed": {"by": "op1", "signal": "SIGTERM", "reason": "runaway\x1b[2J"}},
        "r-6",
        1000,
        user_of,
    )
    assert killed is not None and "STOPPED=killed (SIGTERM) by op1" in killed and "\x1b" not in killed
    signalled = {"exit_codes": [None], "stages": [{"exit_code": None, "signal": 15}]}
    by_signal = sentence("exec.finished", signalled, "r-7", 1000, user_of)
    assert by_signal is not None and "EXIT=143 (SIGTERM)" in by_signal  # issue 44: as a shell says it


def test_other_kinds_keep_their_summary() -> None:
    assert sentence("service.started", {"pid": 1}, None, None, user_of) is None  # an older record: no name


def test_a_service_record_names_the_service() -> None:
    """Issue 44: service.started/stopping did not say which service."""
    started = sentence("service.started", {"service": "intake", "pid": 42, "version": "1.2"}, None, None, user_of)
    assert started == "airlock : airlock-intake started ; PID=42 ; VERSION=1.2"
    stopping = sentence("service.stopping", {"service": "journal", "pid": 7}, None, None, user_of)
    assert stopping == "airlock : airlock-journal stopping ; PID=7"


def test_a_long_command_is_shortened_and_a_digest_named() -> None:
    long = command_text([["echo", "x" * 1000]])
    assert len(long) == COMMAND_CHARS and long.endswith("…")
    assert command_text([{"argv_sha256": "ab" * 32, "argv_bytes": 70000}]).startswith("<argv sha256 abababababab")


@given(st.lists(st.lists(st.text(min_size=1), min_size=1, max_size=4), min_size=1, max_size=3))
def test_no_request_text_can_break_the_line_or_fake_a_field(stages: list[list[str]]) -> None:
    said = sentence("exec.started", {"spec": {"stages": stages}, "uid": 0, "cwd": "/"}, "r-1", 1000, user_of)
    assert said is not None
    assert "\n" not in said and "\r" not in said and "\x1b" not in said
    # The command is one shell-quoted field: a `;` or `=` inside a word cannot end it early.
    head, _, rest = said.partition(" ; COMMAND=")
    assert head == "deploy : USER=root ; CWD=/" and rest.endswith(" ; REQUEST=r-1")


def test_exec_started_names_the_binary_that_runs() -> None:
    payload = {"spec": {"stages": [["df", "-h"]]}, "uid": 0, "cwd": "/", "binaries": [{"path": "/usr/bin/df"}]}
    assert "COMMAND=/usr/bin/df -h ;" in (sentence("exec.started", payload, "r-1", 1000, user_of) or "")


def test_approvals_own_record_of_an_operator_decision_names_the_operator_and_the_command() -> None:
    # The payload airlock-approval journals when an operator decides (decide.py), as the walk saw it.
    policy = {"stages": [{"argv": ["/usr/bin/apt-get", "install", "-y", "htop"], "rule": None}]}
    payload = {"decision": "deny", "rule": "default", "by": "alice", "operator_uid": 1001, "reason": ""}
    said = sentence(
        "approval.decided", payload | {"policy": policy, "privileged": True, "run_as": 0}, "r-18", 1000, user_of
    )
    assert (
        said == "deploy : deny by operator alice ; USER=root ; COMMAND=/usr/bin/apt-get install -y htop ; REQUEST=r-18"
    )
    timeout = payload | {"decision": "timeout", "by": "timeout", "operator_uid": None, "policy": policy}
    assert sentence("approval.decided", timeout, "r-19", 1000, user_of) == (
        "deploy : timeout (no operator decided) ; COMMAND=/usr/bin/apt-get install -y htop ; REQUEST=r-19"
    )
    released = payload | {"decision": "allow", "rule": "hold", "by": "release by alice", "policy": policy}
    assert sentence("approval.decided", released, "r-20", 1000, user_of) == (
        "deploy : allow at the release by alice ; COMMAND=/usr/bin/apt-get install -y htop ; REQUEST=r-20"
    )


def test_a_missing_program_is_not_said_as_a_policy_decision() -> None:
    policy = {"stages": [{"argv": ["sytemctl", "restart", "nginx"], "rule": None}]}
    payload = {"decision": "deny", "rule": "unresolved", "by": "policy", "policy": policy}
    assert sentence("approval.decided", payload, "r-21", 1000, user_of) == (
        "deploy : deny (command not found) ; COMMAND=sytemctl restart nginx ; REQUEST=r-21"
    )

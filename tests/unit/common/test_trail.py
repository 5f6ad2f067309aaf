"""`show` summarises a request's journal events."""

from __future__ import annotations

from typing import Any

from airlock.common.trail import outcome_words, ran_and_succeeded, summarise


def ev(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {
        "seq": seq,
        "kind": kind,
        "request_id": "r1",
        "operation_id": "op-1",
        "peer_uid": 1000,
        "session": "s",
        "writer": "x",
        "payload": payload,
    }


RECEIVED = ev(
    1,
    "request.received",
    request={"reason": "why", "stages": [["true"]], "privileged": False},
    peer={"uid": 1000, "pid": 5, "user": "dev"},
)


def test_a_finished_request() -> None:
    events = [
        RECEIVED,
        ev(2, "approval.decided", decision="allow", rule="r", by="policy"),
        ev(3, "exec.started"),
        ev(4, "exec.finished", exit_codes=[0], timed_out=False, cancelled=False),
        ev(5, "request.replied", status="ok", code=None, message=None),
    ]
    shown = summarise(events)
    assert shown["state"] == "finished" and shown["settled"] is True
    assert shown["reason"] == "why" and shown["peer"]["user"] == "dev" and shown["operation_id"] == "op-1"
    assert shown["decision"]["by"] == "policy"
    assert shown["outcome"]["exit_codes"] == [0]
    assert ran_and_succeeded(shown)


def test_states_along_the_way() -> None:
    assert summarise([RECEIVED])["state"] == "received"
    assert summarise([RECEIVED, ev(2, "approval.pending", rule="default")])["state"] == "pending"
    running = summarise([RECEIVED, ev(2, "approval.decided", decision="allow"), ev(3, "exec.started")])
    assert running["state"] == "running" and running["settled"] is False


def test_denied_and_failed_requests_are_settled_but_not_successful() -> None:
    denied = summarise(
        [
            RECEIVED,
            ev(2, "approval.decided", decision="deny", by="alice", reason="no"),
            ev(3, "request.replied", status="error", code="denied", message="denied"),
        ]
    )
    assert denied["state"] == "failed" and denied["settled"] and not ran_and_succeeded(denied)
    assert denied["outcome"]["code"] == "denied"
    assert denied["decision"]["decision"] == "deny"
    ran = [RECEIVED, ev(2, "approval.decided", decision="allow"), ev(3, "exec.started")]
    nonzero = summarise([*ran, ev(4, "exec.finished", exit_codes=[0, 3]), ev(5, "request.replied", status="ok")])
    assert nonzero["state"] == "finished" and not ran_and_succeeded(nonzero)
    cancelled = summarise(
        [
            *ran,
            ev(4, "exec.cancelled"),
            ev(5, "exec.finished", exit_codes=[0], cancelled=True),
            ev(6, "request.replied", status="ok"),
        ]
    )
    assert cancelled["state"] == "finished" and not ran_and_succeeded(cancelled)


def test_a_denial_is_settled_before_intake_replies() -> None:
    shown = summarise([RECEIVED, ev(2, "approval.pending"), ev(3, "approval.decided", decision="timeout")])
    assert shown["state"] == "expired" and shown["settled"] and not ran_and_succeeded(shown)


FILE_RAN = [RECEIVED, ev(2, "approval.decided", decision="allow"), ev(3, "files.started", digest="d")]


def test_a_running_file_operation_is_running() -> None:
    shown = summarise(FILE_RAN)
    assert shown["state"] == "running" and shown["settled"] is False and shown["outcome"] is None


def test_a_successful_file_operation_succeeded() -> None:
    ended = [*FILE_RAN, ev(4, "files.finished", tool="write", path="/x", ok=True, duration_ms=3)]
    assert summarise(ended)["settled"] and ran_and_succeeded(summarise(ended))
    shown = summarise([*ended, ev(5, "request.replied", status="ok", code=None, message=None)])
    assert shown["state"] == "finished" and ran_and_succeeded(shown)
    assert shown["outcome"]["status"] == "ok" and shown["outcome"]["duration_ms"] == 3


def test_a_failed_file_operation_did_not_succeed() -> None:
    changed = [*FILE_RAN, ev(4, "files.finished", ok=False, error={"code": "file_changed", "message": "m"})]
    shown = summarise([*changed, ev(5, "request.replied", status="error", code="file_changed", message="m")])
    assert shown["state"] == "failed" and not ran_and_succeeded(shown) and shown["outcome"]["code"] == "file_changed"
    # an error the operation itself answered (not a refusal): replied ok, but the operation did not do it
    missing = summarise(
        [
            *FILE_RAN,
            ev(4, "files.finished", ok=False, error={"code": "not_found"}),
            ev(5, "request.replied", status="ok"),
        ]
    )
    assert missing["state"] == "finished" and not ran_and_succeeded(missing)


def test_a_forbidden_story_is_settled_named_and_never_a_success() -> None:
    shown = summarise(
        [RECEIVED, ev(2, "exec.started"), ev(3, "exec.finished", exit_codes=[0]), ev(4, "request.replied", status="ok")]
    )
    assert shown["lifecycle_error"] == {
        "seq": 2,
        "kind": "exec.started",
        "state": "received",
        "reason": "allowed only in approved",
    }
    assert shown["state"] == "received" and shown["settled"] and not ran_and_succeeded(shown)


def test_a_killed_job_says_killed_and_its_exit_as_a_shell_would() -> None:
    """Issue 44: it said "ok, exit codes [None], killed (SIGTERM)"."""
    stage = {"exit_code": None, "signal": 15}
    killed = {"signal": "SIGTERM", "by": "root", "reason": "runaway"}
    events = [
        RECEIVED,
        ev(2, "approval.decided", decision="allow", rule="r", by="policy"),
        ev(3, "exec.started"),
        ev(4, "exec.finished", exit_codes=[None], stages=[stage], timed_out=False, cancelled=False, killed=killed),
        ev(5, "request.replied", status="ok", code=None, message=None),
    ]
    shown = summarise(events)
    assert outcome_words(shown["outcome"]) == "killed (SIGTERM) by root: runaway, exit status 143 (SIGTERM)"
    assert not ran_and_succeeded(shown)


def test_outcome_words_for_pipelines_timeouts_and_plain_exits() -> None:
    ran = {"status": "ok", "exit_codes": [0, 3], "signals": [None, None]}
    assert outcome_words(ran) == "ok, exit statuses 0, 3"
    timed = {"status": "ok", "exit_codes": [None], "signals": [9], "timed_out": True}
    assert outcome_words(timed) == "timed out, exit status 137 (SIGKILL)"
    refused = {"status": "error", "code": "spawn_failed", "message": "gone"}
    assert outcome_words(refused) == "error, spawn_failed: gone"
    never = {"status": "ok", "exit_codes": [None], "signals": [None], "cancelled": True}
    assert outcome_words(never) == "cancelled, exit status -"


def test_a_passkey_touch_carried_by_a_fleet_console_is_in_the_decision() -> None:
    """Issue 49: `show` names the person, the method and the group one touch decided."""
    group = {"key": "k" * 64, "hosts": 2, "digest": "d" * 64, "member": "m" * 64}
    events = [
        RECEIVED,
        ev(2, "approval.pending", rule="default"),
        ev(3, "operator.action", action="approve", operator="alice", method="passkey", credential_id="c1", group=group),
        ev(4, "approval.decided", decision="allow", rule="default", by="alice"),
    ]
    (touch,) = summarise(events)["decision"]["passkeys"]
    assert touch == {
        "operator": "alice",
        "action": "approve",
        "method": "passkey",
        "credential_id": "c1",
        "group": group,
    }
    # control: an operator's plain approval names no passkey
    plain = [
        RECEIVED,
        ev(3, "operator.action", action="approve", operator="bob"),
        ev(4, "approval.decided", decision="allow"),
    ]
    assert "passkeys" not in summarise(plain)["decision"]

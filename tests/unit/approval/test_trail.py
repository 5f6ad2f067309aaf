"""`show` summarises a request's journal events."""

from __future__ import annotations

from typing import Any

from airlock.approval.trail import ran_and_succeeded, summarise


def ev(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "request_id": "r1", "operation_id": "op-1", "peer_uid": 1000,
            "session": "s", "writer": "x", "payload": payload}


RECEIVED = ev(1, "request.received", request={"reason": "why", "stages": [["true"]], "privileged": False},
              peer={"uid": 1000, "pid": 5, "user": "dev"})


def test_a_finished_request() -> None:
    events = [RECEIVED, ev(2, "approval.decided", decision="allow", rule="r", by="policy"),
              ev(3, "exec.started"), ev(4, "exec.finished", exit_codes=[0], timed_out=False, cancelled=False),
              ev(5, "request.replied", status="ok", code=None, message=None)]
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
    denied = summarise([RECEIVED, ev(2, "approval.decided", decision="deny", by="alice", reason="no"),
                        ev(3, "request.replied", status="error", code="denied", message="denied")])
    assert denied["state"] == "failed" and denied["settled"] and not ran_and_succeeded(denied)
    assert denied["outcome"]["code"] == "denied"
    nonzero = summarise([RECEIVED, ev(2, "exec.finished", exit_codes=[0, 3]),
                         ev(3, "request.replied", status="ok")])
    assert not ran_and_succeeded(nonzero)
    cancelled = summarise([RECEIVED, ev(2, "exec.finished", exit_codes=[0], cancelled=True),
                           ev(3, "request.replied", status="ok")])
    assert not ran_and_succeeded(cancelled)

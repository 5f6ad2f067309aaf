"""`show`: one request's story, read back from its journal events.

Pure: the events of one request (as the journal's feed returns them) go in;
who asked, what, why, the decision, the outcome and the whole trail come out.
No I/O here.
"""

from __future__ import annotations

from typing import Any

# The journal kinds that end a request's story, in the order they are written.
_SETTLING = ("request.replied", "exec.finished")


def _last(events: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    for event in reversed(events):
        if event.get("kind") == kind:
            found: dict[str, Any] = event
            return found
    return None


def _payload(event: dict[str, Any] | None) -> dict[str, Any]:
    payload = event.get("payload") if event else None
    return payload if isinstance(payload, dict) else {}


def summarise(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Summarise the events of one request (oldest first)."""
    received = _payload(_last(events, "request.received"))
    pending = _last(events, "approval.pending")
    decided = _payload(_last(events, "approval.decided"))
    finished_event = _last(events, "exec.finished")
    finished = _payload(finished_event)
    replied_event = _last(events, "request.replied")
    replied = _payload(replied_event)
    refused = _payload(_last(events, "exec.refused"))
    first = events[0] if events else {}
    request = received.get("request") if isinstance(received.get("request"), dict) else None
    if request is None and pending is not None:
        request = _payload(pending).get("request")

    decision: dict[str, Any] | None = None
    if decided:
        decision = {
            "decision": decided.get("decision"),
            "rule": decided.get("rule"),
            "by": decided.get("by"),
            "operator_uid": decided.get("operator_uid"),
            "reason": decided.get("reason") or "",
        }

    outcome: dict[str, Any] | None = None
    if finished_event is not None or replied_event is not None:
        outcome = {
            "status": replied.get("status") or ("ok" if finished_event is not None else None),
            "code": replied.get("code"),
            "message": replied.get("message"),
        }
        if finished_event is not None:
            outcome |= {
                "exit_codes": finished.get("exit_codes"),
                "timed_out": bool(finished.get("timed_out")),
                "cancelled": bool(finished.get("cancelled")),
                "duration_ms": finished.get("duration_ms"),
            }
        elif refused:
            outcome |= {"code": outcome["code"] or refused.get("code")}

    if replied_event is not None:
        state = "finished" if replied.get("status") == "ok" else "failed"
    elif finished_event is not None:
        state = "finished"
    elif _last(events, "exec.started") is not None:
        state = "running"
    elif decision is not None:
        state = "approved" if decision["decision"] == "allow" else "failed"
    elif pending is not None:
        state = "pending"
    else:
        state = "received"
    if _last(events, "operation.replayed") is not None and finished_event is None:
        state = "replayed"

    return {
        "request_id": first.get("request_id"),
        "operation_id": next((e.get("operation_id") for e in events if e.get("operation_id")), None),
        "state": state,
        "settled": any(_last(events, kind) is not None for kind in _SETTLING) or state in ("failed", "replayed"),
        "pending": False,
        "peer": received.get("peer"),
        "peer_uid": first.get("peer_uid"),
        "session": first.get("session"),
        "reason": (request or {}).get("reason", ""),
        "request": request,
        "decision": decision,
        "outcome": outcome,
        "events": events,
    }


def ran_and_succeeded(shown: dict[str, Any]) -> bool:
    """`airlock wait`'s test: the operation ran and its last stage exited 0."""
    outcome = shown.get("outcome") or {}
    codes = outcome.get("exit_codes") or []
    return (
        outcome.get("status") == "ok"
        and bool(codes)
        and codes[-1] == 0
        and not outcome.get("timed_out")
        and not outcome.get("cancelled")
    )

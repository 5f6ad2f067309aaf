"""`show`: one request's story, read back from its journal events.

Pure: no I/O.  The events of one request (as the journal's feed returns them) go in;
who asked, what, why, the decision, the outcome and the whole trail come out.
The state is the request's lifecycle state (`airlock.common.lifecycle`'s fold);
a story the lifecycle table forbids keeps the state it had before that step
and says so under ``lifecycle_error``.
"""

from __future__ import annotations

import signal
from typing import Any

from airlock.common import lifecycle


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
    story, error = lifecycle.trace(events)
    received = _payload(_last(events, "request.received"))
    pending = _last(events, "approval.pending")
    decided = _payload(_last(events, "approval.decided"))
    # The work's end record: a command's or a file operation's.
    ended_event = _last(events, "exec.finished") or _last(events, "files.finished")
    ended = _payload(ended_event)
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
        if decided.get("approvers"):  # issue 18: who approved (uid, or principal and key fingerprint)
            decision |= {"approvers": decided["approvers"], "quorum": decided.get("quorum")}
        if decided.get("grant_id"):  # issue 18: let through by an operator's time-boxed grant
            decision |= {"grant_id": decided["grant_id"], "granted_by": decided.get("granted_by")}
            if decided.get("grant_uses") is not None:  # issue 34: which use of how many
                decision |= {"grant_use": decided.get("grant_use"), "grant_uses": decided["grant_uses"]}
        if decided.get("decided_with"):  # issue 34: decided with an identical request pending before it
            decision["decided_with"] = decided["decided_with"]
        # Issue 49: a passkey touch's vote (the person, the credential, and the group when a fleet console
        # carried one touch to many hosts): on the collector and in `show`, one touch's reach is plain.
        touches = [
            {k: p.get(k) for k in ("operator", "action", "method", "credential_id", "group")}
            for e in events
            if e.get("kind") == "operator.action"
            for p in [_payload(e)]
            if p.get("method") == "passkey" and p.get("action") in ("approve", "deny")
        ]
        if touches:
            decision["passkeys"] = touches

    outcome: dict[str, Any] | None = None
    if ended_event is not None or replied_event is not None:
        outcome = {"status": replied.get("status"), "code": replied.get("code"), "message": replied.get("message")}
        if ended_event is not None and ended_event.get("kind") == "exec.finished":
            outcome |= {
                "status": outcome["status"] or "ok",
                "exit_codes": ended.get("exit_codes"),
                # Each stage's killing signal (None: it exited): exit_codes holds None for those.
                "signals": [st.get("signal") if isinstance(st, dict) else None for st in ended.get("stages") or []],
                "timed_out": bool(ended.get("timed_out")),
                "cancelled": bool(ended.get("cancelled")),
                "duration_ms": ended.get("duration_ms"),
            }
            if isinstance(ended.get("killed"), dict):  # an operator's kill (issue 35): who, signal, why
                outcome["killed"] = ended["killed"]
        elif ended_event is not None:
            # A file operation: its own outcome (ok, or an error such as file_changed).
            failure: dict[str, Any] = ended["error"] if isinstance(ended.get("error"), dict) else {}
            outcome |= {
                "status": outcome["status"] or ("ok" if ended.get("ok") is True else "error"),
                "code": outcome["code"] or failure.get("code"),
                "message": outcome["message"] or failure.get("message"),
                "file_ok": ended.get("ok") is True,
                "duration_ms": ended.get("duration_ms"),
            }
        elif refused:
            outcome |= {"code": outcome["code"] or refused.get("code")}

    return {
        "request_id": first.get("request_id"),
        "operation_id": next((e.get("operation_id") for e in events if e.get("operation_id")), None),
        "state": story.state,
        # A story the table forbids is settled too: `airlock wait` must not wait for it for ever.
        "settled": story.settled or error is not None,
        "pending": False,
        "lifecycle_error": error.to_dict() if error is not None else None,
        "peer": received.get("peer"),
        "peer_uid": first.get("peer_uid"),
        "session": first.get("session"),
        "reason": (request or {}).get("reason", ""),
        "request": request,
        "decision": decision,
        "outcome": outcome,
        # What the job executed (exec.finished's exec tree, issue 35), or None.
        "tree": ended.get("tree") if isinstance(ended.get("tree"), dict) else None,
        "events": events,
    }


def ran_and_succeeded(shown: dict[str, Any]) -> bool:
    """`airlock wait`'s test: the operation ran and its last stage exited 0 (a command),
    or it did what was asked (a file operation)."""
    outcome = shown.get("outcome") or {}
    if shown.get("lifecycle_error"):
        return False
    if "file_ok" in outcome:
        return outcome.get("status") == "ok" and bool(outcome.get("file_ok"))
    codes = outcome.get("exit_codes") or []
    return (
        outcome.get("status") == "ok"
        and bool(codes)
        and codes[-1] == 0
        and not outcome.get("timed_out")
        and not outcome.get("cancelled")
    )


def exit_words(code: object, signum: object) -> str:
    """One stage's end as a shell reports it: ``0``, ``143 (SIGTERM)``; ``-`` if it never ended."""
    if isinstance(signum, int) and signum > 0:
        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        return f"{128 + signum} ({name})"
    return str(code) if isinstance(code, int) else "-"


def outcome_words(outcome: dict[str, Any]) -> str:
    """The outcome in a line (`airlock show`, the web page): how it ended first, then each stage's exit.

    A job that was killed, timed out or cancelled ran (the reply's status is
    ``ok``), but did not end by itself: that is what the line leads with
    (issue 44: "outcome ok, exit codes [None], killed (SIGTERM)").
    """
    killed = outcome.get("killed") if isinstance(outcome.get("killed"), dict) else None
    if killed is not None:
        text = f"killed ({killed.get('signal')}) by {killed.get('by')}"
        text += f": {killed.get('reason')}" if killed.get("reason") else ""
    elif outcome.get("timed_out"):
        text = "timed out"
    elif outcome.get("cancelled"):
        text = "cancelled"
    else:
        text = str(outcome.get("status"))
    codes = outcome.get("exit_codes")
    if isinstance(codes, list):
        signals = outcome.get("signals") or []
        words = [exit_words(code, signals[i] if i < len(signals) else None) for i, code in enumerate(codes)]
        text += f", exit status {', '.join(words)}" if len(words) == 1 else f", exit statuses {', '.join(words)}"
    if outcome.get("code"):
        text += f", {outcome.get('code')}: {outcome.get('message')}"
    return text

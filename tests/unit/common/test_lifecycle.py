"""The request lifecycle table: every legal story folds, every forbidden step is named."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.common import kinds, lifecycle
from airlock.common.lifecycle import LifecycleError, Story, fold, step, trace


def ev(seq: int, kind: str, **payload: Any) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "request_id": "r1", "payload": payload}


def story(*steps: str | tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Events from kind names; ``approval.decided:allow`` / ``request.replied:ok`` give the selector."""
    out = []
    for seq, item in enumerate(steps, 1):
        kind, _, when = str(item).partition(":")
        field = lifecycle.SELECTORS.get(kind)
        out.append(ev(seq, kind, **({field: when} if field else {})))
    return out


# Every way a request's story really goes (the services' orders: intake/drive.py run_work,
# approval/decide.py decide, runner/service.py exec, runner/fileop_verbs.py files).
LEGAL = {
    "policy allow, command ran": (
        ["request.received", "approval.decided:allow", "exec.started", "exec.finished", "request.replied:ok"],
        "finished",
    ),
    "operator allow, file operation ran": (
        [
            "request.received",
            "approval.pending",
            "approval.decided:allow",
            "files.started",
            "files.finished",
            "request.replied:ok",
        ],
        "finished",
    ),
    "file operation refused after it ran (file_changed)": (
        ["request.received", "approval.decided:allow", "files.started", "files.finished", "request.replied:error"],
        "failed",
    ),
    "cancelled while running": (
        [
            "request.received",
            "approval.decided:allow",
            "exec.started",
            "exec.cancelled",
            "exec.finished",
            "request.replied:ok",
        ],
        "finished",
    ),
    "denied by policy": (["request.received", "approval.decided:deny", "request.replied:error"], "failed"),
    "denied by an operator": (
        ["request.received", "approval.pending", "approval.decided:deny", "request.replied:error"],
        "failed",
    ),
    "expired": (
        ["request.received", "approval.pending", "approval.decided:timeout", "request.replied:error"],
        "failed",
    ),
    "withdrawn": (
        ["request.received", "approval.pending", "approval.decided:withdrawn", "request.replied:error"],
        "failed",
    ),
    "approved as the agent left": (["request.received", "approval.decided:allow", "request.replied:error"], "failed"),
    "ticket refused (invalid_ticket, hold)": (
        ["request.received", "approval.decided:allow", "exec.refused", "request.replied:error"],
        "failed",
    ),
    "binary changed after the start": (
        ["request.received", "approval.decided:allow", "exec.started", "exec.refused", "request.replied:error"],
        "failed",
    ),
    "approval interrupted while pending": (["request.received", "approval.pending", "request.replied:error"], "failed"),
    "runner lost while running": (
        ["request.received", "approval.decided:allow", "exec.started", "request.replied:error"],
        "failed",
    ),
    "the end record lost to a journal crash": (
        ["request.received", "approval.decided:allow", "files.started", "request.replied:ok"],
        "finished",
    ),
    "replayed": (["request.received", "operation.replayed"], "replayed"),
    "rejected": (["request.received", "request.rejected"], "failed"),
    "intake killed after the job ended": (
        ["request.received", "approval.decided:allow", "exec.started", "exec.finished"],
        "ended",
    ),
    "operator and service records in between": (
        [
            "request.received",
            "operator.action",
            "approval.pending",
            "service.started",
            "connection.dropped",
            "approval.decided:allow",
            "policy.reloaded",
            "exec.started",
            "exec.finished",
            "request.replied:ok",
            "service.stopping",
            "chain.acknowledged",
        ],
        "finished",
    ),
}


@pytest.mark.parametrize("name", sorted(LEGAL))
def test_every_legal_story_folds_to_its_state(name: str) -> None:
    steps, final = LEGAL[name]
    events = story(*steps)
    assert fold(events).state == final
    assert trace(events) == (fold(events), None)
    # every prefix is a legal (incomplete) story too
    for n in range(len(events)):
        fold(events[:n])


def test_every_transition_in_the_table_is_exercised_by_a_legal_story() -> None:
    used: set[tuple[str, str | None]] = set()
    for steps, _ in LEGAL.values():
        current = Story()
        for event in story(*steps):
            before = current.state
            current = step(current, event)
            if event["kind"] in lifecycle.LIFECYCLE_KINDS:
                used.add((event["kind"], before))
    table = {(row.kind, source) for row in lifecycle.TRANSITIONS for source in row.sources}
    # Not every (kind, from) pair, but every kind and every terminal path.
    assert {kind for kind, _ in table} == {kind for kind, _ in used}
    assert {row.target for row in lifecycle.TRANSITIONS} <= {s for s in lifecycle.STATES}


FORBIDDEN = {
    # name: (steps, index of the forbidden step, its label, the state it met)
    "a start without approval": (["request.received", "exec.started"], 1, "exec.started", "received"),
    "a start while pending": (["request.received", "approval.pending", "files.started"], 2, "files.started", "pending"),
    "a start after a denial": (
        ["request.received", "approval.decided:deny", "exec.started"],
        2,
        "exec.started",
        "denied",
    ),
    "a start after expiry": (
        ["request.received", "approval.pending", "approval.decided:timeout", "exec.started"],
        3,
        "exec.started",
        "expired",
    ),
    "a start after withdrawal": (
        ["request.received", "approval.pending", "approval.decided:withdrawn", "files.started"],
        3,
        "files.started",
        "withdrawn",
    ),
    "two starts": (
        ["request.received", "approval.decided:allow", "exec.started", "exec.started"],
        3,
        "exec.started",
        "running",
    ),
    "a start after a refusal": (
        ["request.received", "approval.decided:allow", "exec.refused", "exec.started"],
        3,
        "exec.started",
        "refused",
    ),
    "a second decision": (
        ["request.received", "approval.decided:allow", "approval.decided:deny"],
        2,
        "approval.decided[deny]",
        "approved",
    ),
    "a policy timeout without pending": (
        ["request.received", "approval.decided:timeout"],
        1,
        "approval.decided[timeout]",
        "received",
    ),
    "an event before request.received": (["approval.decided:allow"], 0, "approval.decided[allow]", "new"),
    "events after the reply": (
        ["request.received", "approval.decided:deny", "request.replied:error", "approval.pending"],
        3,
        "approval.pending",
        "failed",
    ),
    "a start after a replay": (
        ["request.received", "operation.replayed", "exec.started"],
        2,
        "exec.started",
        "replayed",
    ),
    "a second reply": (
        ["request.received", "approval.decided:deny", "request.replied:error", "request.replied:error"],
        3,
        "request.replied[error]",
        "failed",
    ),
    "ok with nothing run": (
        ["request.received", "approval.decided:allow", "request.replied:ok"],
        2,
        "request.replied[ok]",
        "approved",
    ),
    "a file operation ended as a command": (
        ["request.received", "approval.decided:allow", "files.started", "exec.finished"],
        3,
        "exec.finished",
        "running",
    ),
    "a command cancelled as a file operation": (
        ["request.received", "approval.decided:allow", "files.started", "exec.cancelled"],
        3,
        "exec.cancelled",
        "running",
    ),
    "finished twice": (
        ["request.received", "approval.decided:allow", "exec.started", "exec.finished", "exec.finished"],
        4,
        "exec.finished",
        "ended",
    ),
    "a second request.received": (["request.received", "request.received"], 1, "request.received", "received"),
}


@pytest.mark.parametrize("name", sorted(FORBIDDEN))
def test_every_forbidden_step_is_named(name: str) -> None:
    steps, index, label, state = FORBIDDEN[name]
    events = story(*steps)
    with pytest.raises(LifecycleError) as caught:
        fold(events)
    assert (caught.value.kind, caught.value.seq, caught.value.state) == (label, events[index]["seq"], state)
    assert f"seq {events[index]['seq']}" in str(caught.value) and label in str(caught.value)
    before, error = trace(events)
    assert error is not None and error.to_dict()["seq"] == events[index]["seq"]
    assert before == fold(events[:index])


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (ev(2, "approval.decided"), "no decision"),
        (ev(2, "approval.decided", decision="ask"), "'ask' is not in the table"),
        (ev(2, "request.replied", status=7), "no status"),
        (ev(2, "no.such_kind"), "does not know"),
        ({"seq": 2, "payload": {}}, "without a kind"),
        ({"seq": 2, "kind": "approval.decided", "payload": "junk"}, "no decision"),
    ],
)
def test_malformed_events_are_forbidden_steps(event: dict[str, Any], reason: str) -> None:
    with pytest.raises(LifecycleError, match=reason):
        step(fold(story("request.received")), event)


def test_every_journal_kind_is_in_the_lifecycle_or_marked_outside_it() -> None:
    for name, info in kinds.KINDS.items():
        assert bool(info.transitions) == (name not in lifecycle.OUTSIDE), name
    assert lifecycle.LIFECYCLE_KINDS | set(lifecycle.OUTSIDE) == set(kinds.KINDS)


def test_terminal_states_have_no_way_out_and_every_state_is_reachable() -> None:
    for row in lifecycle.TRANSITIONS:
        assert not row.sources & lifecycle.TERMINAL
    reachable = {lifecycle.NEW}
    for _ in lifecycle.STATES:
        reachable |= {row.target for row in lifecycle.TRANSITIONS if row.sources & reachable}
    assert reachable == set(lifecycle.STATES)


_KINDS = sorted(set(kinds.KINDS) | {"bogus.kind"})
_PAYLOADS = st.one_of(
    st.none(),
    st.integers(),
    st.text(max_size=4),
    st.fixed_dictionaries(
        {},
        optional={
            "decision": st.sampled_from(["allow", "deny", "timeout", "withdrawn", "ask", 3]),
            "status": st.sampled_from(["ok", "error", "", None]),
        },
    ),
)
_EVENTS = st.builds(
    lambda kind, payload, seq: {"kind": kind, "payload": payload, "seq": seq},
    st.one_of(st.sampled_from(_KINDS), st.none(), st.integers()),
    _PAYLOADS,
    st.integers(0, 10**6),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_EVENTS, max_size=12))
def test_random_stories_never_raise_anything_but_the_lifecycle_error(events: list[dict[str, Any]]) -> None:
    try:
        final = fold(events)
    except LifecycleError as exc:
        assert exc.state in lifecycle.STATES and exc.reason
        before, error = trace(events)
        assert error is not None and before.state in lifecycle.STATES
    else:
        assert final.state in lifecycle.STATES
        assert trace(events) == (final, None)


# --- issue 29: an ok reply with no end record -------------------------------------------


def _request(rid: str, first: int, *, ended: bool, restart_between: bool = False) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"kind": "request.received", "payload": {}},
        {"kind": "approval.decided", "payload": {"decision": "allow"}},
        {"kind": "exec.started", "payload": {}},
    ]
    if restart_between:
        events.append({"kind": "service.started", "writer": "journal", "payload": {}, "request_id": None})
    if ended:
        events.append({"kind": "exec.finished", "payload": {}})
    events.append({"kind": "request.replied", "payload": {"status": "ok"}})
    out = []
    for n, e in enumerate(events):
        out.append({"seq": first + n, "request_id": rid, "peer_uid": 1000, "writer": "intake"} | e)
    return out


def test_an_ok_reply_without_the_end_record_is_a_violation() -> None:
    checked = lifecycle.check_journal([*_request("good", 1, ended=True), *_request("lost", 10, ended=False)])
    assert checked["ok"] is False and checked["violation_count"] == 1
    (v,) = checked["violations"]
    assert v["request_id"] == "lost" and v["seq"] == 13 and v["state"] == "running"
    assert "no end record" in v["reason"]


def test_an_ok_reply_without_the_end_record_across_a_journal_restart_is_said_not_held() -> None:
    checked = lifecycle.check_journal(_request("lost", 1, ended=False, restart_between=True))
    assert checked["ok"] is True, checked
    assert checked["unrecorded_ends"] == [{"request_id": "lost", "peer_uid": 1000, "seq": 5, "restart": 4}]


def test_another_services_start_is_not_a_journal_restart() -> None:
    events = _request("lost", 1, ended=False, restart_between=True)
    events[3]["writer"] = "runner"
    assert lifecycle.check_journal(events)["ok"] is False

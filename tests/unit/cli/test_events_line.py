"""`airlock events`/`show` lines: exec.started's command comes from request.received (issue 50)."""

from __future__ import annotations

from typing import Any

from airlock.cli.events import ASKED_KEPT, _event_line


def _event(seq: int, kind: str, payload: dict[str, Any], request_id: str = "r-1") -> dict[str, Any]:
    return {"seq": seq, "time": "t", "kind": kind, "request_id": request_id, "peer_uid": 0, "payload": payload}


RECEIVED = {"request": {"stages": [["df", "-h"]], "privileged": True}, "digest": "d"}
STARTED = {"digest": "d", "uid": 0, "cwd": "/", "binaries": [{"path": "/usr/bin/df"}]}


def test_exec_started_spells_the_command_of_its_request_received() -> None:
    asked: dict[tuple[Any, Any], Any] = {}
    _event_line(_event(1, "request.received", RECEIVED), asked)
    line = _event_line(_event(2, "exec.started", STARTED), asked)
    assert "COMMAND=/usr/bin/df -h" in line and "CWD=/" in line


def test_another_requests_command_is_never_borrowed() -> None:
    asked: dict[tuple[Any, Any], Any] = {}
    _event_line(_event(1, "request.received", RECEIVED, "r-other"), asked)
    line = _event_line(_event(2, "exec.started", STARTED), asked)
    assert "df" not in line and "COMMAND=?" in line  # not in the listing: said so, not guessed


def test_an_old_exec_started_with_its_spec_reads_as_before() -> None:
    old = STARTED | {"spec": {"stages": [["df", "-h"]], "privileged": True}}
    assert "COMMAND=/usr/bin/df -h" in _event_line(_event(2, "exec.started", old), {})
    assert "COMMAND=/usr/bin/df -h" in _event_line(_event(2, "exec.started", old))


def test_what_is_remembered_is_bounded() -> None:
    asked: dict[tuple[Any, Any], Any] = {}
    for i in range(ASKED_KEPT + 10):
        _event_line(_event(i, "request.received", RECEIVED, f"r-{i}"), asked)
    assert len(asked) == ASKED_KEPT and (0, "r-0") not in asked

"""Request-ID replay protection lives in the journal, so it survives intake restarts."""

from __future__ import annotations

import json
import uuid

from support import Stack, now_iso


def _request(request_id: str) -> bytes:
    request = {
        "v": 1,
        "id": request_id,
        "verb": "exec",
        "token": None,
        "args": {"argv": ["true"], "privileged": False, "time": now_iso()},
    }
    return json.dumps(request).encode() + b"\n"


def test_a_request_id_is_refused_the_second_time(stack: Stack) -> None:
    line = _request(f"rg-{uuid.uuid4()}")
    assert stack.send_raw(line)[-1]["ok"] is True
    again = stack.send_raw(line)[-1]
    assert again["ok"] is False and again["error"]["code"] == "replayed_request", again


def test_a_replay_after_intake_was_killed_is_still_refused(stack: Stack) -> None:
    line = _request(f"rg-kill-{uuid.uuid4()}")
    first = stack.send_raw(line)[-1]
    assert first["ok"] is True, first
    stack.kill_service("intake")
    # The same bytes, well inside the freshness window, to a brand-new intake
    # process that has never seen them: the journal remembers.
    again = stack.send_raw(line)[-1]
    assert again["ok"] is False and again["error"]["code"] == "replayed_request", again
    assert stack.native("ping")["ok"] is True

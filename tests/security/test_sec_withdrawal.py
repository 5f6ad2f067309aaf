"""An abandoned request can never run (issue 16).

A request waiting for an operator belongs to the agent's live connection.
When the agent closes it, or cancels the operation, the request is withdrawn:
it leaves `pending`, `approval.decided` records decision `withdrawn`, a later
approve answers `not_found`, and nothing runs.  The command would leave a
marker file, so "nothing ran" is checked on the disk as well as in the journal.

The control: the same request, with its client still waiting (a client that
only shut down its writing side, as `Stack.exec` does), is approved and runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Background, Stack, custom_stack, now_iso
from waits import wait_not_pending, wait_pending, wait_record

CONFIG = """
approval:
  timeout_seconds: 60
policy:
  default: ask
"""


@pytest.fixture(scope="module")
def wstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("wd")), CONFIG) as s:
        yield s


def ask(stack: Stack, marker: Path) -> tuple[socket.socket, str, str]:
    """Send an exec that waits for an operator, on a connection the test keeps open."""
    request_id, op = f"wd-{uuid.uuid4()}", f"op-{uuid.uuid4()}"
    body = {"time": now_iso(), "argv": ["touch", str(marker)], "privileged": False, "operation_id": op}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(stack.agent)
    sock.sendall(json.dumps({"v": 1, "id": request_id, "verb": "exec", "args": body}).encode() + b"\n")
    wait_pending(stack, request_id)
    return sock, request_id, op


def approve(stack: Stack, request_id: str) -> dict[str, Any]:
    reply: dict[str, Any] = stack.native("approve", {"id": request_id}, path=stack.operator)
    return reply


def rows_of(stack: Stack, request_id: str) -> list[dict[str, Any]]:
    return [r for r in stack.journal_rows() if r["request_id"] == request_id]


def assert_never_ran(stack: Stack, request_id: str, marker: Path) -> None:
    # Settled: intake has replied, and only intake takes a ticket to the runner.
    wait_record(stack, "request.replied", request_id=request_id)
    assert not marker.exists()
    kinds = [r["kind"] for r in rows_of(stack, request_id)]
    assert "exec.started" not in kinds, kinds


def test_control_a_waiting_client_is_approved_and_runs(wstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "control"
    job = Background(wstack, {"argv": ["touch", str(marker)], "privileged": False})
    wait_pending(wstack, job.request_id)
    assert approve(wstack, job.request_id)["ok"] is True
    assert job.result()["ok"] is True and marker.exists()


def test_a_closed_connection_withdraws_its_pending_request(wstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "closed"
    sock, request_id, _op = ask(wstack, marker)
    sock.close()
    wait_not_pending(wstack, request_id)
    late = approve(wstack, request_id)
    assert late["ok"] is False and late["error"]["code"] == "not_found", late
    assert_never_ran(wstack, request_id, marker)
    decided = [json.loads(r["payload"]) for r in rows_of(wstack, request_id) if r["kind"] == "approval.decided"]
    assert [d["decision"] for d in decided] == ["withdrawn"], decided
    replied = [json.loads(r["payload"]) for r in rows_of(wstack, request_id) if r["kind"] == "request.replied"]
    assert replied and replied[-1]["code"] == "withdrawn", replied


def test_an_approval_racing_the_close_never_runs(wstack: Stack, tmp_path: Path) -> None:
    for i, delay in enumerate((0, 0, 0.1, 0.2, 0.3, 0.5)):
        marker = tmp_path / f"race-{i}"
        sock, request_id, _op = ask(wstack, marker)
        sock.close()
        time.sleep(delay)  # approve before or after approval notices: both must end the same
        reply = approve(wstack, request_id)
        assert reply["ok"] is True or reply["error"]["code"] in ("not_found", "conflict"), reply
        wait_not_pending(wstack, request_id)
        assert_never_ran(wstack, request_id, marker)


def test_an_approval_that_wins_the_race_still_never_runs(wstack: Stack, tmp_path: Path) -> None:
    # Make the approve win for certain: intake is stopped, so neither it nor
    # approval can notice the close before the operator approves.
    marker = tmp_path / "won"
    sock, request_id, _op = ask(wstack, marker)
    intake = wstack.service_pid("intake")
    os.kill(intake, signal.SIGSTOP)
    try:
        sock.close()
        reply = approve(wstack, request_id)
        assert reply["ok"] is True, reply  # approval issued a ticket ...
    finally:
        os.kill(intake, signal.SIGCONT)
    assert_never_ran(wstack, request_id, marker)  # ... that intake never took to the runner
    rows = rows_of(wstack, request_id)
    decided = [json.loads(r["payload"])["decision"] for r in rows if r["kind"] == "approval.decided"]
    replied = [json.loads(r["payload"]) for r in rows if r["kind"] == "request.replied"]
    assert decided == ["allow"] and replied[-1]["code"] == "withdrawn", (decided, replied)


def test_the_agent_cancels_its_pending_request(wstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    op = f"op-{uuid.uuid4()}"
    job = Background(wstack, {"argv": ["touch", str(marker)], "privileged": False, "operation_id": op})
    wait_pending(wstack, job.request_id)
    cancel = wstack.native("cancel", {"operation_id": op})
    assert cancel["ok"] is True and cancel["data"]["was"] == "pending", cancel
    # Once the cancel is answered the request is gone: an approve right away finds nothing.
    assert approve(wstack, job.request_id)["error"]["code"] == "not_found"
    reply = job.result()
    assert reply["ok"] is False and reply["error"]["code"] == "withdrawn", reply
    assert_never_ran(wstack, job.request_id, marker)
    # The operation ID is free again: the agent may ask anew.
    again = Background(wstack, {"argv": ["touch", str(marker)], "privileged": False, "operation_id": op})
    wait_pending(wstack, again.request_id)
    assert approve(wstack, again.request_id)["ok"] is True
    assert again.result()["ok"] is True and marker.exists()

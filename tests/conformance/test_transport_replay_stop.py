"""Ported from tarides/sudo-proxy tests/transport.rs, tests/replay.rs and tests/stop.rs.

transport.rs's socket-file tests concern how the peer binds its own socket;
airlock's sockets are systemd socket units (dev up binds them the same way),
so those are listed as not applicable in docs/protocol.md, and the one that
is wire-visible (a client that closes without data) is ported.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from peer import iso_offset, make_req, send
from support import Stack


def test_client_close_without_data_keeps_daemon_responsive(peer_stack: Stack) -> None:
    """transport.rs::client_close_without_data_keeps_daemon_responsive"""
    for _ in range(6):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(peer_stack.agent))
    resp = send(peer_stack, make_req("after-drive-bys", [["true"]]))
    assert resp["status"] == "ok", resp


def test_duplicate_id_rejected(peer_stack: Stack) -> None:
    """replay.rs::duplicate_id_rejected"""
    first = send(peer_stack, make_req("dup-1", [["true"]]))
    assert first["status"] == "ok", first
    resp = send(peer_stack, make_req("dup-1", [["true"]]))  # a fresh `time`: only the id matters
    assert resp["status"] == "error" and "duplicate" in resp["message"], resp


def test_distinct_ids_both_accepted(peer_stack: Stack) -> None:
    """replay.rs::distinct_ids_both_accepted"""
    assert send(peer_stack, make_req("uniq-a", [["true"]]))["status"] == "ok"
    assert send(peer_stack, make_req("uniq-b", [["true"]]))["status"] == "ok"


def test_rejected_request_does_not_consume_id(peer_stack: Stack) -> None:
    """replay.rs::rejected_request_does_not_consume_id"""
    bad = send(peer_stack, make_req("retry-1", [["echo", "hi\u202e"]]))
    assert bad["status"] == "error", bad
    good = send(peer_stack, make_req("retry-1", [["true"]]))
    assert good["status"] == "ok", good


def test_ping_answers_without_prompt_and_daemon_survives(peer_stack: Stack) -> None:
    """stop.rs::ping_answers_without_prompt_and_daemon_survives"""
    resp = send(peer_stack, make_req("ping-1", [], action="ping"))
    assert resp["status"] == "ok" and resp["message"] == "pong" and resp["version"], resp
    assert peer_stack.native("pending", path=peer_stack.operator)["data"]["pending"] == []  # no prompt
    assert send(peer_stack, make_req("ping-then-exec", [["true"]]))["status"] == "ok"


def test_stale_stop_is_rejected_and_daemon_survives(peer_stack: Stack) -> None:
    """stop.rs::stale_stop_is_rejected_and_daemon_survives"""
    pid = peer_stack.service_pid("intake")
    resp = send(peer_stack, make_req("stale-stop", [], action="stop", time=iso_offset(-300)))
    assert resp["status"] == "error" and "too old" in resp["message"], resp
    assert send(peer_stack, make_req("still-alive", [["true"]]))["status"] == "ok"
    assert peer_stack.service_pid("intake") == pid


def test_stop_request_shuts_down_without_prompt(peer_stack: Stack) -> None:
    """stop.rs::stop_request_shuts_down_run_without_prompt

    Sent by the stack's invoking user, who is an operator here: an agent's
    ``stop`` is refused (docs/protocol.md, "stop is an operator's").  Under
    dev up (as under systemd's socket unit) the next connection starts intake
    again.
    """
    pid = peer_stack.service_pid("intake")
    resp = send(peer_stack, make_req("stop-1", [], action="stop"))
    assert resp["status"] == "ok", resp
    deadline = time.monotonic() + 2
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists(), "intake did not stop within 2 s"
    assert peer_stack.native("pending", path=peer_stack.operator)["data"]["pending"] == []  # no prompt
    deadline = time.monotonic() + 20
    while True:  # served again: the socket stayed, the next connection starts intake
        try:
            if send(peer_stack, make_req(f"after-stop-{time.time()}", [["true"]]))["status"] == "ok":
                break
        except (OSError, ValueError):
            pass
        assert time.monotonic() < deadline
        time.sleep(0.2)

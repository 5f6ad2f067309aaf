"""Ported from tarides/sudo-proxy tests/concurrency.rs and tests/slow.rs.

The peer's scripted prompter is airlock's operator (approve, deny, nobody);
the peer's ``confirm_unprivileged = false`` is the dev policy, which allows
the invoking user's unprivileged requests without asking.  Tests of the
peer's single TTY (prompts serialise) do not apply: airlock's operators
decide pending requests independently (docs/protocol.md).
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from peer import decide_when_pending, make_req, send
from support import Stack
from waits import wait_pending, wait_record


def timed(stack: Stack, request: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.monotonic()
    resp = send(stack, request)
    return time.monotonic() - start, resp


def test_long_exec_does_not_wedge_loop(peer_stack: Stack) -> None:
    """concurrency.rs::long_exec_does_not_wedge_loop"""
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(timed, peer_stack, make_req("wedge-A", [["sleep", "1"]]))
        wait_record(peer_stack, "exec.started", request_id="wedge-A")  # A runs: B comes in behind it
        b = pool.submit(timed, peer_stack, make_req("wedge-B", [["true"]]))
        (elapsed_a, resp_a), (elapsed_b, resp_b) = a.result(), b.result()
    assert resp_a["status"] == "ok" and resp_b["status"] == "ok"
    assert elapsed_b < 0.4 + 0.6, elapsed_b  # the peer's 400 ms, with room for a shared CI machine
    assert elapsed_a >= 0.9


def test_unprivileged_runs_during_privileged_prompt(peer_stack: Stack) -> None:
    """concurrency.rs::unprivileged_runs_during_privileged_prompt (and slow.rs::request_queued_behind_slow_prompt)"""
    with ThreadPoolExecutor(3) as pool:
        a = pool.submit(send, peer_stack, make_req("priv-A", [["true"]], privileged=True))
        decider = pool.submit(decide_when_pending, peer_stack, "priv-A", "deny", 1.0)
        wait_pending(peer_stack, "priv-A")  # A waits for its prompt: B comes in meanwhile
        elapsed_b, resp_b = timed(peer_stack, make_req("unpriv-B", [["true"]]))
        decider.result()
        resp_a = a.result()
    assert resp_b["status"] == "ok" and elapsed_b < 1.0, (elapsed_b, resp_b)
    assert resp_a["status"] == ("denied" if resp_a.get("code") != "privilege_unavailable" else "error"), resp_a


def test_prompter_returns_timeout_propagates_to_client(peer_stack: Stack) -> None:
    """concurrency.rs::prompter_returns_timeout_propagates_to_client (nobody decides within approval.timeout_seconds)"""
    resp = send(peer_stack, make_req("to-1", [["true"]], privileged=True))
    if resp.get("code") == "privilege_unavailable":
        pytest.skip("dev up without root refuses privileged work before it waits")
    assert resp["status"] == "timeout", resp


def test_prompter_returns_denied_propagates_to_client(peer_stack: Stack) -> None:
    """concurrency.rs::prompter_returns_denied_propagates_to_client"""
    with ThreadPoolExecutor(2) as pool:
        decider = pool.submit(decide_when_pending, peer_stack, "dn-1", "deny")
        resp = send(peer_stack, make_req("dn-1", [["true"]], privileged=True))
        if resp.get("code") != "privilege_unavailable":
            decider.result()
    if resp.get("code") == "privilege_unavailable":
        pytest.skip("dev up without root refuses privileged work before it waits")
    assert resp["status"] == "denied", resp


def test_unprivileged_no_confirm_skips_prompter(peer_stack: Stack) -> None:
    """concurrency.rs::unprivileged_no_confirm_skips_prompter"""
    resp = send(peer_stack, make_req("noprompt-1", [["true"]]))
    assert resp["status"] == "ok"
    story = [r["kind"] for r in peer_stack.journal_rows() if r["request_id"] == "noprompt-1"]
    assert "approval.pending" not in story, story


def test_concurrent_distinct_ids_succeed(peer_stack: Stack) -> None:
    """concurrency.rs::concurrent_distinct_ids_succeed: 8 identical `sleep 0.3` with distinct ids run side by side.

    Before issue 30, identical commands shared a derived operation ID: 7 of
    the 8 failed with ``operation_in_progress``.
    """
    start = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: send(peer_stack, make_req(f"par-{i}", [["sleep", "0.3"]])), range(8)))
    total = time.monotonic() - start
    assert [r["status"] for r in replies] == ["ok"] * 8, replies
    assert total < 1.5 + 1.0, total  # the peer's 1.5 s, with room for a shared CI machine


def test_burst_connections_above_cap_get_busy_response(tmp_path_factory: pytest.TempPathFactory) -> None:
    """concurrency.rs::burst_connections_above_cap_get_busy_response (the cap is limits.max_connections_per_agent)"""
    from pathlib import Path

    from support import custom_stack

    runtime = Path(tmp_path_factory.mktemp("cap")) / "rt"
    with custom_stack(runtime, "limits:\n  max_connections_per_agent: 4\n") as stack:
        held = []
        for _ in range(4):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(str(stack.agent))
            held.append(sock)
        time.sleep(0.3)  # intake has accepted them (the accept loop counts connections, not requests)
        try:
            overflow = [send(stack, make_req(f"over-{i}", [["true"]]), timeout=10) for i in range(3)]
        finally:
            for sock in held:
                sock.close()
        for resp in overflow:
            assert resp["status"] == "error" and "busy" in resp["message"], resp
        deadline = time.monotonic() + 10
        while True:  # drained: served again
            resp = send(stack, make_req(f"after-drain-{time.time_ns()}", [["true"]]))
            if resp["status"] == "ok" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert resp["status"] == "ok", resp


def test_concurrent_same_id_one_wins(peer_stack: Stack) -> None:
    """concurrency.rs::concurrent_same_id_one_wins"""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one() -> None:
        resp = send(peer_stack, make_req("race-id", [["sleep", "0.3"]]))
        with lock:
            results.append(resp)

    first = threading.Thread(target=one)
    first.start()
    time.sleep(0.05)
    second = threading.Thread(target=one)
    second.start()
    first.join(30)
    second.join(30)
    statuses = sorted(r["status"] for r in results)
    assert statuses == ["error", "ok"], results
    assert "duplicate" in next(r for r in results if r["status"] == "error")["message"]


def test_handshake_deadline_drops_silent_client(peer_stack: Stack) -> None:
    """slow.rs::handshake_deadline_drops_silent_client (the deadline is limits.read_timeout_seconds, 10 s)"""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(str(peer_stack.agent))
        start = time.monotonic()
        line = sock.makefile("rb").readline()
        elapsed = time.monotonic() - start
    assert 9 <= elapsed < 13, elapsed
    import json

    parsed = json.loads(line)
    assert parsed["status"] == "error" and "handshake deadline" in parsed["message"], parsed


def test_trickle_feed_client_disconnected_within_handshake_deadline(peer_stack: Stack) -> None:
    """slow.rs::trickle_feed_client_disconnected_within_handshake_deadline"""
    import json

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(15)
        sock.connect(str(peer_stack.agent))
        stop = threading.Event()

        def drip() -> None:
            for _ in range(18):
                if stop.is_set():
                    return
                try:
                    sock.send(b"x")
                except OSError:
                    return
                time.sleep(0.8)

        writer = threading.Thread(target=drip)
        start = time.monotonic()
        writer.start()
        line = sock.makefile("rb").readline()
        elapsed = time.monotonic() - start
        stop.set()
        writer.join(20)
    assert elapsed <= 13, elapsed
    parsed = json.loads(line)
    assert parsed["status"] == "error", parsed
    assert "handshake" in parsed["message"] or "deadline" in parsed["message"], parsed

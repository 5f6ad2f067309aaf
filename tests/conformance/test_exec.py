"""Ported from tarides/sudo-proxy tests/exec.rs and tests/forward_agent.rs, through the socket.

The peer calls its executor directly (``exec_direct``); here every request
goes through airlock's agent socket, so what is checked is what a client
receives.  The job timeout is ``limits.default_timeout_seconds`` (2 s in
this suite) where the peer sets ``SUDO_PROXY_EXEC_TIMEOUT_SECS=1``.
"""

from __future__ import annotations

import base64
import time

from peer import make_req, send
from support import Stack

MAX_OUTPUT_BYTES = 16 * 1024 * 1024


def stdout_of(resp: dict[str, object]) -> bytes:
    return base64.b64decode(str(resp.get("stdout") or ""))


def test_stdout_is_capped_at_max_output_bytes(peer_stack: Stack) -> None:
    """exec.rs::stdout_is_capped_at_max_output_bytes"""
    start = time.monotonic()
    resp = send(peer_stack, make_req("e-cap", [["sh", "-c", "yes x | head -c 200000000"]]))
    assert resp["status"] == "ok" and resp.get("stdout_truncated") is True, {k: resp[k] for k in resp if k != "stdout"}
    assert len(stdout_of(resp)) == MAX_OUTPUT_BYTES
    assert time.monotonic() - start < 30


def test_long_running_child_killed_after_timeout(peer_stack: Stack) -> None:
    """exec.rs::long_running_child_killed_after_timeout"""
    start = time.monotonic()
    resp = send(peer_stack, make_req("e-timeout", [["sleep", "30"]]))
    elapsed = time.monotonic() - start
    assert resp["status"] == "error" and "timed out" in resp["message"], resp
    assert elapsed < 2 + 5, elapsed  # the job's 2 s, then SIGTERM, grace, SIGKILL


def test_pipeline_timeout_kills_all_stages(peer_stack: Stack) -> None:
    """exec.rs::pipeline_timeout_kills_all_stages"""
    marker = f"conformance-{time.time_ns()}"
    start = time.monotonic()
    resp = send(
        peer_stack,
        make_req("e-pipe-timeout", [["sh", "-c", f"echo head; sleep 30 # {marker}"], ["sleep", "30"], ["wc", "-c"]]),
    )
    assert resp["status"] == "error" and "timed out" in resp["message"], resp
    assert time.monotonic() - start < 2 + 5
    import subprocess

    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.returncode == 1, f"stages left running: {left.stdout}"


def test_pipeline_succeeds_without_guard_interference(peer_stack: Stack) -> None:
    """exec.rs::pipeline_succeeds_without_guard_interference"""
    resp = send(peer_stack, make_req("e-pipe", [["echo", "hi"], ["wc", "-c"]]))
    assert resp["status"] == "ok" and len(resp["stages"]) == 2, resp
    assert resp["stages"][-1]["exit_code"] == 0
    assert stdout_of(resp).strip() == b"3"


def test_exec_sees_login_env_defaults(peer_stack: Stack) -> None:
    """exec.rs::exec_direct_sees_login_env_defaults (and login_env_defaults_populate_missing_keys)"""
    resp = send(peer_stack, make_req("e-env", [["env"]]))
    assert resp["status"] == "ok", resp
    lines = stdout_of(resp).decode().splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line)
    for key in ("HOME", "USER", "LOGNAME", "PATH"):
        assert values.get(key), f"child env missing {key}: {lines}"
    assert values["USER"] == values["LOGNAME"] and "/usr/bin" in values["PATH"]


def test_privileged_plus_forward_agent_rejected(peer_stack: Stack) -> None:
    """forward_agent.rs::privileged_plus_forward_agent_rejected"""
    resp = send(peer_stack, make_req("fa-priv", [["true"]], privileged=True, forward_agent=True))
    assert resp["status"] == "error", resp
    assert "forward_agent is only allowed for unprivileged" in resp["message"], resp


def test_ssh_auth_sock_in_request_env_rejected(peer_stack: Stack) -> None:
    """forward_agent.rs::ssh_auth_sock_in_request_env_rejected (and sanitize_env_rejects_ssh_auth_sock)"""
    resp = send(peer_stack, make_req("fa-env-sock", [["true"]], env={"SSH_AUTH_SOCK": "/tmp/x.sock"}))
    assert resp["status"] == "error", resp
    assert "SSH_AUTH_SOCK cannot be set in request env" in resp["message"] and "forward_agent" in resp["message"]


def test_no_forward_agent_does_not_inject(peer_stack: Stack) -> None:
    """forward_agent.rs::no_forward_agent_does_not_inject (and forward_agent_without_daemon_socket_is_noop)"""
    resp = send(peer_stack, make_req("fa-no-inject", [["printenv", "SSH_AUTH_SOCK"]], forward_agent=False))
    assert resp["status"] == "ok" and resp["stages"][-1]["exit_code"] == 1 and stdout_of(resp) == b"", resp
    noop = send(peer_stack, make_req("fa-noop", [["printenv", "SSH_AUTH_SOCK"]], forward_agent=True))
    assert noop["status"] == "ok" and noop["stages"][-1]["exit_code"] == 1, noop  # dev up has no agent socket

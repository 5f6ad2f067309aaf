"""Ported from tarides/sudo-proxy tests/validation.rs: what a sudo-proxy client sees for bad requests.

Each test names the peer test it comes from.  airlock's own wording stays
(with its error ``code``), and carries the phrase the peer's test matches.
"""

from __future__ import annotations

import json

from peer import iso_offset, make_req, send, send_raw
from support import Stack


def test_empty_pipeline_rejected(peer_stack: Stack) -> None:
    """validation.rs::empty_pipeline_rejected"""
    resp = send(peer_stack, make_req("v-empty-pipe", []))
    assert resp["status"] == "error" and "must not be empty" in resp["message"], resp


def test_empty_pipeline_stage_rejected(peer_stack: Stack) -> None:
    """validation.rs::empty_pipeline_stage_rejected"""
    resp = send(peer_stack, make_req("v-empty-stage", [[]]))
    assert resp["status"] == "error" and "stage 0" in resp["message"], resp


def test_dangerous_argv_chars_rejected(peer_stack: Stack) -> None:
    """validation.rs::dangerous_argv_chars_rejected"""
    resp = send(peer_stack, make_req("v-bidi", [["echo", "hello\u202eworld"]]))
    assert resp["status"] == "error" and "forbidden" in resp["message"], resp


def test_dangerous_env_key_rejected(peer_stack: Stack) -> None:
    """validation.rs::dangerous_env_key_rejected"""
    resp = send(peer_stack, make_req("v-envkey", [["true"]], env={"BAD\u0001KEY": "v"}))
    assert resp["status"] == "error" and "env key" in resp["message"], resp


def test_dangerous_env_value_rejected(peer_stack: Stack) -> None:
    """validation.rs::dangerous_env_value_rejected"""
    resp = send(peer_stack, make_req("v-envval", [["true"]], env={"LANG": "bad\nvalue"}))
    assert resp["status"] == "error" and "env value" in resp["message"], resp


def test_invalid_json_returns_error_with_empty_id(peer_stack: Stack) -> None:
    """validation.rs::invalid_json_returns_error_with_empty_id"""
    parsed = json.loads(send_raw(peer_stack, b"this is not json\n"))
    assert parsed["status"] == "error" and parsed["id"] == "", parsed
    assert "invalid JSON" in parsed["message"], parsed


def test_oversize_request_rejected(peer_stack: Stack) -> None:
    """validation.rs::oversize_request_rejected"""
    parsed = json.loads(send_raw(peer_stack, b"x" * (2 * 1024 * 1024) + b"\n"))
    assert parsed["status"] == "error", parsed


def test_stale_time_rejected(peer_stack: Stack) -> None:
    """validation.rs::stale_time_rejected (70 s old; airlock's limit is limits.freshness_seconds, 60 s)"""
    resp = send(peer_stack, make_req("v-stale", [["true"]], time=iso_offset(-70)))
    assert resp["status"] == "error" and "too old" in resp["message"], resp


def test_fresh_time_accepted(peer_stack: Stack) -> None:
    """validation.rs::fresh_time_accepted"""
    resp = send(peer_stack, make_req("v-fresh", [["true"]]))
    assert resp["status"] == "ok", resp


def test_missing_time_is_refused_naming_the_field(peer_stack: Stack) -> None:
    """validation.rs::request_with_empty_time_accepted -- a deliberate difference.

    The peer's test accepts an empty ``time``; its own server refuses it
    ("missing time field", server.rs check_freshness) and reference/000 says
    ``time`` must be fresh and non-empty.  airlock refuses it with the
    server's phrase (docs/protocol.md lists the difference).
    """
    resp = send(peer_stack, make_req("v-notime", [["true"]], time=""))
    assert resp["status"] == "error" and "missing time field" in resp["message"], resp


def test_missing_privileged_field_defaults_to_privileged(peer_stack: Stack) -> None:
    """validation.rs::missing_privileged_field_defaults_to_privileged

    The peer proves the privileged path by its prompter being called; here the
    request (no ``privileged`` field) waits for an operator, which the dev
    policy asks only for privileged work, and nobody decides: ``timeout``.
    """
    request = {"id": "defprivd", "pipeline": [["true"]], "session": "t", "time": iso_offset(0)}
    parsed = json.loads(send_raw(peer_stack, json.dumps(request).encode() + b"\n"))
    assert parsed["id"] == "defprivd"
    assert parsed["status"] in ("timeout", "error"), parsed
    if parsed["status"] == "error":  # airlock dev up without root: privileged work is refused at once
        assert parsed["code"] == "privilege_unavailable", parsed

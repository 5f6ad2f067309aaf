"""filesystem.execute of the gateway dialect: argument mapping and results, pure."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.gateway import fileop_execute
from airlock.gateway import protocol as p


def test_tools_with_or_without_prefix_and_camel_case_arguments() -> None:
    read = fileop_execute.parse({"tool": "read", "arguments": {"path": "/etc/hosts", "offsetBytes": 4, "maxBytes": 10}})
    assert read.tool == "files_read" and read.arguments == {"offset_bytes": 4, "length_bytes": 10}
    native = read.to_native(privileged=False, time="T")
    assert native == {"path": "/etc/hosts", "privileged": False, "time": "T", "offset_bytes": 4, "length_bytes": 10}
    write = fileop_execute.parse(
        {"operationId": "w1", "tool": "files_write", "arguments": {"path": "/tmp/x", "content": "héllo"}}
    )
    assert base64.b64decode(write.arguments["content"]) == "héllo".encode()
    assert write.to_native(privileged=True, time="T")["operation_id"] == "w1"
    edit = fileop_execute.parse({"tool": "edit", "arguments": {"path": "/a", "oldString": "x", "newString": "y"}})
    assert edit.arguments == {"old_text": "x", "new_text": "y"}


def test_trace_context_is_validated_and_not_forwarded() -> None:
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    parsed = fileop_execute.parse({"tool": "read", "arguments": {"path": "/a"}, "traceContext": {"traceparent": tp}})
    assert parsed.trace is not None and "traceparent" not in json.dumps(parsed.to_native(privileged=False, time="T"))
    with pytest.raises(p.GatewayError):
        fileop_execute.parse({"tool": "read", "arguments": {"path": "/a"}, "traceContext": {"traceparent": "00-bad"}})


@pytest.mark.parametrize(
    "params",
    [
        {"tool": "chmod", "arguments": {"path": "/a"}},
        {"arguments": {"path": "/a"}},
        {"tool": "read", "arguments": {"path": "relative"}},
        {"tool": "read", "arguments": []},
        {"tool": "read", "arguments": {"path": "/a", "content": "x"}},
        {"tool": "edit", "arguments": {"path": "/a", "oldText": "x", "oldString": "y"}},
        {"tool": "write", "arguments": {"path": "/a", "content": 5}},
        {"tool": "read", "operationId": "", "arguments": {"path": "/a"}},
    ],
)
def test_refused(params: dict[str, Any]) -> None:
    with pytest.raises(p.GatewayError) as info:
        fileop_execute.parse(params)
    assert info.value.code == "invalid_params"


def test_read_result_is_text_with_the_digest_of_what_is_delivered() -> None:
    outcome = {
        "ok": True,
        "error": None,
        "operation_id": "op-1",
        "tool": "files_read",
        "path": "/a",
        "content": base64.b64encode(b"hi \xff").decode(),
        "content_sha256": hashlib.sha256(b"hi \xff").hexdigest(),
        "offset_bytes": 0,
        "length_bytes": 4,
        "size_bytes": 9,
        "next_offset_bytes": 4,
        "eof": False,
    }
    result = fileop_execute.result(outcome)
    assert result["content"] == "hi \ufffd" and result["lossy"] is True and result["ok"] is True
    assert result["contentSha256"] == hashlib.sha256("hi \ufffd".encode()).hexdigest()
    assert result["fingerprint"] == outcome["content_sha256"] and result["nextOffsetBytes"] == 4


def test_a_read_too_big_for_a_frame_is_shortened_and_marked_incomplete() -> None:
    big = ("\x01" * (1024 * 1024)).encode()
    outcome = {
        "ok": True,
        "operation_id": "op",
        "tool": "files_read",
        "content": base64.b64encode(big).decode(),
        "content_sha256": "f",
        "next_offset_bytes": 1024 * 1024,
        "offset_bytes": 0,
        "eof": False,
    }
    frame = p.encode_result("r", fileop_execute.result(outcome))
    assert len(frame) <= p.MAX_FRAME_BYTES
    result = json.loads(frame)["result"]
    assert result["incomplete"] is True and result["transportTruncated"] is True and result["nextOffsetBytes"] is None
    assert "fingerprint" not in result
    assert result["contentSha256"] == hashlib.sha256(result["content"].encode()).hexdigest()


def test_error_outcomes_stay_results() -> None:
    result = fileop_execute.result(
        {
            "ok": False,
            "error": {"code": "permission_denied", "message": "x"},
            "operation_id": "op",
            "tool": "files_read",
            "replay": True,
        }
    )
    assert result["ok"] is False and result["error"]["code"] == "permission_denied" and result["replayed"] is True


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["tool", "arguments", "operationId", "traceContext"]),
        st.none()
        | st.text(max_size=12)
        | st.dictionaries(st.text(max_size=12), st.text(max_size=8) | st.integers(), max_size=4),
    )
)
def test_random_params_parse_or_refuse(params: dict[str, Any]) -> None:
    try:
        fileop_execute.parse(params)
    except p.GatewayError as exc:
        assert exc.code == "invalid_params"

"""The gateway dialect's pure core: parsing, validation, frames, evidence."""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airlock.common.errors import AirlockError, ErrorCode
from airlock.gateway import evidence
from airlock.gateway import params as params_of
from airlock.gateway import protocol as p

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def lines(reader: p.LineReader) -> list[bytes | p.GatewayError]:
    out: list[bytes | p.GatewayError] = []
    while (item := reader.next_line()) is not None:
        out.append(item)
    return out


# --- framing and envelopes ---------------------------------------------------------


def test_lines_whole_byte_by_byte_and_with_trailing_data() -> None:
    data = b'{"id":"a","method":"hello"}\n{"id":"b","method":"health"}\n{"id":"c"'
    whole = p.LineReader()
    whole.feed(data)
    assert lines(whole) == [b'{"id":"a","method":"hello"}', b'{"id":"b","method":"health"}']
    assert whole.leftover() == b'{"id":"c"'
    drip = p.LineReader()
    got: list[bytes | p.GatewayError] = []
    for byte in data:
        drip.feed(bytes([byte]))
        got += lines(drip)
    assert got == lines_of(data)


def lines_of(data: bytes) -> list[bytes | p.GatewayError]:
    r = p.LineReader()
    r.feed(data)
    return lines(r)


def test_an_overlong_line_is_one_error_and_the_next_line_is_read() -> None:
    r = p.LineReader(max_bytes=64)
    r.feed(b'{"id":"long","x":"' + b"y" * 200 + b'"}\n{"id":"n","method":"hello"}\n')
    out = lines(r)
    assert isinstance(out[0], p.GatewayError) and out[0].code == "request_too_large" and out[0].request_id == "long"
    assert out[1:] == [b'{"id":"n","method":"hello"}']


def test_parse_request() -> None:
    r = p.parse_request(b'{"id":"r1","method":"process.exec","params":{"command":"true"}}')
    assert r == p.Request("r1", "process.exec", {"command": "true"})
    assert p.parse_request(b'{"id":"r2","method":"hello"}').params == {}
    assert p.parse_request(b'{"id":7,"method":"hello"}').id == 7  # echoed as given


@pytest.mark.parametrize(
    ("line", "code", "rid"),
    [
        (b'{"id":"x1","method":', "invalid_json", "x1"),
        (b'{"method":"hello","id" : "x2", oops}', "invalid_json", "x2"),
        (b"garbage", "invalid_json", None),
        (b"\xff\xfe", "invalid_json", None),
        (b"NaN", "invalid_json", None),
        (b"[1,2]", "invalid_request", None),
        (b'{"id":"x3","method":5}', "invalid_request", "x3"),
        (b'{"id":"x4","method":"hello","params":[]}', "invalid_request", "x4"),
        (b'{"id":true,"method":"hello"}', "invalid_request", None),
    ],
)
def test_bad_requests(line: bytes, code: str, rid: str | None) -> None:
    with pytest.raises(p.GatewayError) as info:
        p.parse_request(line)
    assert info.value.code == code
    assert info.value.request_id == rid


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_yield_a_request_or_a_gateway_error(data: bytes) -> None:
    reader = p.LineReader(max_bytes=256)
    reader.feed(data)
    for item in lines(reader):
        if isinstance(item, p.GatewayError):
            continue
        try:
            p.parse_request(item)
        except p.GatewayError as exc:
            frame = p.encode_error(exc.request_id, exc)
            assert frame.endswith(b"\n") and json.loads(frame)["ok"] is False


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "executable",
                "args",
                "command",
                "cwd",
                "env",
                "timeoutMs",
                "deadlineMs",
                "maxOutputBytes",
                "operationId",
                "protectedValues",
                "traceContext",
            ]
        ),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
            max_leaves=8,
        ),
    )
)
def test_random_exec_params_validate_or_refuse(params: dict[str, Any]) -> None:
    try:
        parsed = params_of.parse_exec(params)
    except p.GatewayError as exc:
        assert exc.code == "invalid_params"
        return
    native = parsed.to_native(privileged=False, default_cwd="/", time="2026-01-01T00:00:00Z")
    assert ("argv" in native) != ("command" in native)


# --- process.exec params --------------------------------------------------------------


def test_exec_defaults_and_native_mapping() -> None:
    e = params_of.parse_exec(
        {"executable": "ls", "args": ["-l"], "env": {"TZ": 1, "LANG": True}, "protectedValues": {"LC_X": "s"}}
    )
    assert e.timeout_ms == 30_000 and e.max_output_bytes == 1024 * 1024
    assert e.env == {"TZ": "1", "LANG": "true"}
    native = e.to_native(privileged=False, default_cwd="/srv", time="T")
    assert native["argv"] == ["ls", "-l"] and native["privileged"] is False and native["cwd"] == "/srv"
    assert native["protected_env"] == {"LC_X": "s"} and native["stream"] is True
    assert native["max_output_bytes"] == 1024 * 1024 + 1
    assert "operation_id" not in native


def test_trace_context_never_reaches_the_native_request() -> None:
    with_trace = params_of.parse_exec(
        {"command": "true", "traceContext": {"traceparent": TRACEPARENT, "tracestate": "a=b"}}
    )
    without = params_of.parse_exec({"command": "true"})
    assert with_trace.trace is not None and with_trace.trace.sampled
    assert with_trace.to_native(privileged=True, default_cwd=None, time="T") == without.to_native(
        privileged=True, default_cwd=None, time="T"
    )


@pytest.mark.parametrize(
    "params",
    [
        {"command": "x", "executable": "y"},
        {"command": "x", "args": ["a"]},
        {},
        {"executable": ""},
        {"executable": "x", "args": "a"},
        {"executable": "x", "args": [1]},
        {"command": "x", "timeoutMs": 0},
        {"command": "x", "timeoutMs": True},
        {"command": "x", "maxOutputBytes": -1},
        {"command": "x", "cwd": "relative"},
        {"command": "x", "env": {"1BAD": "v"}},
        {"command": "x", "env": {"A": None}},
        {"command": "x", "protectedValues": {"A": ""}},
        {"command": "x", "protectedValues": {"A": 5}},
        {"command": "x", "operationId": ""},
        {"command": "x", "deadlineMs": "soon"},
    ],
)
def test_exec_params_refused(params: dict[str, Any]) -> None:
    with pytest.raises(p.GatewayError) as info:
        params_of.parse_exec(params)
    assert info.value.code == "invalid_params"


@pytest.mark.parametrize(
    "traceparent",
    [
        "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
    ],
)
def test_bad_traceparents(traceparent: str) -> None:
    with pytest.raises(p.GatewayError):
        params_of.parse_trace_context({"traceparent": traceparent})


def test_telemetry() -> None:
    t = params_of.parse_telemetry(
        {"enabled": True, "endpoint": "http://collector:4318/v1/traces", "headers": {"x-key": "v"}}
    )
    assert t.status() == {"enabled": True, "endpoint": "http://collector:4318/v1/traces", "headersConfigured": True}
    assert "'v'" not in repr(t)
    assert params_of.parse_telemetry({"enabled": False}).status()["headersConfigured"] is False
    for bad in (
        {"enabled": 1},
        {"enabled": True},
        {"enabled": True, "endpoint": "https://u:p@h"},
        {"enabled": True, "endpoint": "http://h", "headers": {"bad name": "v"}},
    ):
        with pytest.raises(p.GatewayError):
            params_of.parse_telemetry(bad)


# --- frames and evidence ---------------------------------------------------------------


def test_error_mapping() -> None:
    assert p.from_native(AirlockError(ErrorCode.OPERATION_ID_CONFLICT, "x")).code == "operation_id_conflict"
    assert p.from_native(AirlockError(ErrorCode.INVALID_ARGUMENTS, "x")).code == "invalid_params"
    assert (
        p.from_native(AirlockError(ErrorCode.PROTECTED_REDELIVERY_FORBIDDEN, "x")).code
        == "protected_redelivery_forbidden"
    )
    assert p.from_native(AirlockError(ErrorCode.DENIED, "x")).code == "denied"


def test_frames_never_exceed_the_limit() -> None:
    huge = {"name": "x" * (3 * 1024 * 1024)}
    frame = p.encode_result("r", huge)
    assert len(frame) <= p.MAX_FRAME_BYTES
    assert json.loads(frame)["error"]["code"] == "output_frame_too_large"
    text = {"stdout": "\x00" * (1024 * 1024), "stdoutSha256": "old", "stderr": ""}
    fitted = json.loads(p.encode_result("r", text))
    assert fitted["ok"] is True and fitted["result"]["transportTruncated"] is True
    assert fitted["result"]["stdoutSha256"] == hashlib.sha256(fitted["result"]["stdout"].encode()).hexdigest()
    assert len(p.encode_result("r", text)) <= p.MAX_FRAME_BYTES


def _evidence(stdout: bytes, stderr: bytes, **extra: Any) -> dict[str, Any]:
    return {
        "operation_id": "op-1",
        "started_at": "A",
        "ended_at": "B",
        "duration_ms": 5,
        "cwd": "/",
        "uid": 0,
        "gid": 0,
        "hostname": "h",
        "cancelled": False,
        "timed_out": False,
        "stdout": base64.b64encode(stdout).decode(),
        "stdout_truncated": False,
        "stages": [
            {"exit_code": None, "signal": 15, "stderr": base64.b64encode(stderr).decode(), "stderr_truncated": False}
        ],
    } | extra


def test_terminal_evidence_caps_combined_output_stdout_first() -> None:
    params = params_of.parse_exec({"command": "x", "maxOutputBytes": 10})
    t = evidence.terminal(_evidence(b"12345678", b"abcdef", cancelled=True), params)
    assert t["stdout"] == "12345678" and t["stderr"] == "ab"
    assert t["truncated"] is True and t["stderrTruncated"] is True and t["stdoutTruncated"] is False
    assert t["cancelled"] is False  # the overflow's termination is not a cancellation
    assert t["signal"] == "SIGTERM" and t["exitCode"] is None
    assert t["stdoutSha256"] == hashlib.sha256(b"12345678").hexdigest()
    fine = evidence.terminal(_evidence(b"ok", b"", cancelled=True), params)
    assert fine["cancelled"] is True and fine["truncated"] is False


def test_output_stream_sequence_budget_and_split_characters() -> None:
    out = evidence.OutputStream(cap=8)
    euro = "€".encode()
    a = out.feed("stdout", base64.b64encode(b"ab" + euro[:1]).decode())
    b = out.feed("stderr", base64.b64encode(b"x").decode())
    c = out.feed("stdout", base64.b64encode(euro[1:] + b"zzzz").decode())
    assert [e["sequence"] for e in a + b + c] == [1, 2, 3]
    assert a[0]["data"] == "ab" and c[0]["data"] == "€zz" and c[0]["truncated"] is True
    assert out.overflowed and out.feed("stdout", base64.b64encode(b"more").decode()) == []

"""intake/sudo_proxy.py: the sudo-proxy dialect (reference/000) — telling it apart, and every answer's shape."""

from __future__ import annotations

import base64
import json

import pytest

from airlock import __version__
from airlock.common.errors import AirlockError, ErrorCode
from airlock.intake import sudo_proxy


def _decode(line: bytes) -> dict[str, object]:
    assert line.endswith(b"\n") and line.count(b"\n") == 1  # one frame
    value = json.loads(line)
    assert isinstance(value, dict)
    return value


@pytest.mark.parametrize(
    ("obj", "is_legacy"),
    [
        ({"id": "a", "pipeline": [["true"]]}, True),
        ({"v": 1, "verb": "ping"}, False),
        ({"verb": "ping"}, False),
        ({"v": 1}, False),
        ({}, True),
    ],
)
def test_a_request_without_v_or_verb_is_the_sudo_proxy_dialect(obj: dict[str, object], is_legacy: bool) -> None:
    assert sudo_proxy.is_legacy(obj) is is_legacy


@pytest.mark.parametrize(
    ("raw", "dialect", "rid"),
    [
        (b'{"id": "r-1", "pipeline": [["true"]', "legacy", "r-1"),
        (b'{"v": 1, "id": "n-1", "verb": ', "native", "n-1"),
        (b"not json at all", "legacy", None),
        (b'{"id": "bad\\u0000", "verb":', "native", None),  # an escape in the ID: not recovered
        (b'{"id": "\x01"}', "legacy", None),  # a control byte: not recovered
    ],
)
def test_sniff_recovers_the_dialect_and_id_of_a_broken_line(raw: bytes, dialect: str, rid: str | None) -> None:
    assert sudo_proxy.sniff(raw) == (dialect, rid)


def test_sniff_looks_only_at_the_first_64_kib() -> None:
    assert sudo_proxy.sniff(b" " * (64 * 1024) + b'"id": "late", "verb": 1') == ("legacy", None)


def test_every_answer_carries_the_dialect_version_with_airlock_as_build_metadata() -> None:
    assert sudo_proxy.VERSION == f"1.1.0+airlock.{__version__}"
    assert _decode(sudo_proxy.encode_ok("r"))["version"] == sudo_proxy.VERSION


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (ErrorCode.DENIED, "denied"),
        (ErrorCode.APPROVAL_TIMEOUT, "timeout"),
        (ErrorCode.INVALID_ARGUMENTS, "error"),
        (ErrorCode.UNAUTHORIZED, "error"),
    ],
)
def test_an_error_maps_to_the_dialects_status(code: ErrorCode, status: str) -> None:
    body = _decode(sudo_proxy.encode_error("r-1", AirlockError(code, "because")))
    assert body == {
        "id": "r-1",
        "status": status,
        "message": "because",
        "code": code.value,
        "version": sudo_proxy.VERSION,
    }


def test_an_error_without_an_id_answers_with_an_empty_one() -> None:
    assert _decode(sudo_proxy.encode_error(None, AirlockError(ErrorCode.INVALID_JSON, "x")))["id"] == ""


def test_a_denial_without_a_message_has_no_message_field() -> None:
    body = _decode(sudo_proxy.encode_error("r", AirlockError(ErrorCode.DENIED, "")))
    assert "message" not in body and body["status"] == "denied"


def test_ok_with_and_without_a_message() -> None:
    assert _decode(sudo_proxy.encode_ok("r", "pong")) == {
        "id": "r",
        "status": "ok",
        "message": "pong",
        "version": sudo_proxy.VERSION,
    }
    assert _decode(sudo_proxy.encode_ok("r")) == {"id": "r", "status": "ok", "version": sudo_proxy.VERSION}


def test_a_result_is_ok_whatever_its_exit_codes_and_hoists_the_last_stdout() -> None:
    err = base64.b64encode(b"warn\n").decode()
    out = base64.b64encode(b"hello\n").decode()
    evidence = {
        "stages": [
            {"exit_code": 3, "stderr": err, "stderr_truncated": True},
            {"exit_code": None, "signal": 9, "stderr": ""},
            {"exit_code": None, "signal": None},
        ],
        "stdout": out,
        "stdout_truncated": False,
    }
    body = _decode(sudo_proxy.encode_result("r", evidence))
    assert body == {
        "id": "r",
        "status": "ok",
        "stages": [
            {"exit_code": 3, "stderr": err, "stderr_truncated": True},
            {"exit_code": 128 + 9, "stderr": ""},  # killed by a signal: the shell's 128+n
            {"exit_code": -1, "stderr": ""},
        ],
        "stdout": out,  # truncation flags only when true
        "version": sudo_proxy.VERSION,
    }


def test_an_undetermined_error_speaks_both_dialects() -> None:
    error = AirlockError(ErrorCode.BUSY, "too many connections", {"limit": 4})
    body = _decode(sudo_proxy.encode_undetermined(None, error))
    assert body == {
        "id": "",
        "ok": False,
        "error": error.to_dict(),
        "status": "error",
        "message": "too many connections",
        "version": sudo_proxy.VERSION,
    }


def test_answers_keep_non_ascii_text_as_utf8() -> None:
    line = sudo_proxy.encode_error("r", AirlockError(ErrorCode.DENIED, "nein: ü"))
    assert "ü".encode() in line

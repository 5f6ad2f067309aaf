"""Mutated and random lines at a live intake: exactly one well-formed reply each.

The stack's policy denies everything but /usr/bin/true, so no mutation can
run anything that matters.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import Stack, custom_stack, now_iso

CONFIG = """
limits:
  read_timeout_seconds: 2
  request_timeout_seconds: 3
approval:
  timeout_seconds: 1
policy:
  default: deny
  rules:
    - name: only-true
      decision: allow
      privileged: false
      commands: [[/usr/bin/true]]
"""

FIELDS = [
    "v",
    "id",
    "verb",
    "args",
    "token",
    "pipeline",
    "argv",
    "command",
    "privileged",
    "env",
    "protected_env",
    "cwd",
    "stdin",
    "timeout_ms",
    "deadline_ms",
    "max_output_bytes",
    "operation_id",
    "reason",
    "session",
    "host",
    "time",
    "forward_agent",
    "stream",
    "action",
]


@pytest.fixture(scope="module")
def fuzz_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("fz")), CONFIG) as s:
        yield s


def exchange(stack: Stack, data: bytes) -> list[bytes]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(stack.agent)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass
        buf = b""
        while chunk := sock.recv(1 << 20):
            buf += chunk
    return buf.splitlines()


def well_formed(lines: list[bytes]) -> list[dict[str, Any]]:
    replies = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) for r in replies)
    finals = [r for r in replies if "event" not in r]
    return finals


json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars, lambda v: st.lists(v, max_size=3) | st.dictionaries(st.text(max_size=6), v, max_size=3), max_leaves=8
)


def base_native() -> dict[str, Any]:
    return {
        "v": 1,
        "id": "fz",
        "verb": "exec",
        "token": None,
        "args": {"argv": ["true"], "privileged": False, "time": now_iso()},
    }


def base_legacy() -> dict[str, Any]:
    return {"id": "fz", "time": now_iso(), "pipeline": [["true"]], "privileged": False}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    legacy=st.booleans(),
    in_args=st.booleans(),
    field=st.sampled_from(FIELDS),
    value=json_values,
    newline=st.booleans(),
)
def test_mutated_requests_get_exactly_one_reply(
    fuzz_stack: Stack, legacy: bool, in_args: bool, field: str, value: Any, newline: bool
) -> None:
    body = base_legacy() if legacy else base_native()
    target = body["args"] if (in_args and not legacy) else body
    target[field] = value
    data = json.dumps(body).encode() + (b"\n" if newline else b"")
    finals = well_formed(exchange(fuzz_stack, data))
    assert len(finals) == 1, finals
    reply = finals[0]
    assert ("ok" in reply and ("data" in reply) != ("error" in reply)) or reply.get("status") in (
        "ok",
        "denied",
        "timeout",
        "error",
    )
    if "error" in reply:
        assert set(reply["error"]) == {"code", "message", "details"} and "Traceback" not in reply["error"]["message"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=2000))
def test_random_bytes_get_at_most_one_reply_per_line(fuzz_stack: Stack, raw: bytes) -> None:
    lines = exchange(fuzz_stack, raw + b"\n")
    finals = well_formed(lines)
    assert 1 <= len(finals) <= max(1, raw.count(b"\n") + 1)


def test_the_stack_keeps_serving_after_the_fuzzing(fuzz_stack: Stack) -> None:
    assert fuzz_stack.native("ping")["ok"] is True
    assert fuzz_stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
    for name in ("intake", "approval", "runner", "journal"):
        log = (fuzz_stack.runtime_dir / "logs" / f"{name}.log").read_text()
        assert "Traceback" not in log, f"{name} logged a traceback"

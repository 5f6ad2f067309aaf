"""A sudo-proxy client as the peer project's own tests drive its daemon (tarides/sudo-proxy, tests/common/mod.rs).

One JSON line per connection, one line back.  `make_req` builds what the
peer's ``make_req`` builds (session ``test``, fresh ``time``, unprivileged,
no env), so each ported test sends the bytes the peer's test sends.  The
peer's scripted prompter is played by airlock's policy (the dev stack allows
its invoking user's unprivileged requests) and by an operator on the
operator socket (approve, deny, or nobody: the approval timeout).
"""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from support import Stack, wait_pending


def iso_offset(seconds: float) -> str:
    """``time`` as the peer writes it (whole seconds, ``Z``), ``seconds`` from now."""
    return (datetime.now(UTC) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_req(request_id: str, pipeline: list[list[str]], **fields: Any) -> dict[str, Any]:
    request: dict[str, Any] = {
        "id": request_id,
        "host": "",
        "session": "test",
        "time": iso_offset(0),
        "pipeline": pipeline,
        "env": {},
        "reason": "",
        "privileged": False,
    }
    return request | fields


def send_raw(stack: Stack, data: bytes, timeout: float = 120) -> bytes:
    """The peer's ``send_raw``: write (a broken pipe is expected on oversize input), read one line."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(stack.agent))
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        line = b""
        while not line.endswith(b"\n"):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            line += chunk
        return line


def send(stack: Stack, request: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    reply = send_raw(stack, json.dumps(request).encode() + b"\n", timeout)
    parsed: dict[str, Any] = json.loads(reply)
    return parsed


def decide_when_pending(stack: Stack, request_id: str, verb: str, delay: float = 0.0) -> None:
    """The peer's scripted prompter: an operator who answers ``verb`` after ``delay`` seconds."""
    wait_pending(stack, request_id, timeout=30)
    time.sleep(delay)
    stack.native(verb, {"id": request_id, "reason": "conformance"}, path=stack.operator)

"""Helpers for the operator-door tests: a stack whose policy asks, and requests left pending."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support import Stack, start_stack, stop_stack

# Unprivileged work so the tests need no root: /usr/bin/true is allowed at
# once, everything else waits for an operator.
ASK_POLICY = """
policy:
  default: ask
  rules:
    - name: allow-true
      decision: allow
      privileged: false
      commands:
        - [/usr/bin/true]
"""


def stack_with(tmp: Path, extra: str = "") -> Iterator[Stack]:
    config = tmp / "config.yaml"
    config.write_text(ASK_POLICY + extra, encoding="utf-8")
    stack = start_stack(tmp, config)
    try:
        yield stack
    finally:
        stop_stack(stack)


class Background:
    """An exec request sent on a thread; its final reply arrives in ``reply``."""

    def __init__(self, stack: Stack, args: dict[str, Any], **envelope: Any) -> None:
        self.request_id = envelope.pop("id", None) or f"bg-{uuid.uuid4()}"
        self.operation_id: str = args.get("operation_id") or f"op-{uuid.uuid4()}"
        self.reply: dict[str, Any] | None = None
        body = {"privileged": False, "operation_id": self.operation_id} | args

        def run() -> None:
            self.reply = stack.exec(body, id=self.request_id, **envelope)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 30) -> dict[str, Any]:
        self.thread.join(timeout)
        assert self.reply is not None, "no reply in time"
        return self.reply


def wait_pending(stack: Stack, request_id: str, timeout: float = 15) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = stack.native("pending", path=stack.operator)
        for item in reply["data"]["pending"]:
            if item["request_id"] == request_id:
                found: dict[str, Any] = item
                return found
        time.sleep(0.05)
    raise AssertionError(f"{request_id} never became pending")


def ask(stack: Stack, argv: list[str] | None = None, **kw: Any) -> Background:
    """Start a request the policy sends to an operator, and wait until it is pending."""
    bg = Background(stack, {"argv": argv or ["echo", "hello"]} | kw)
    wait_pending(stack, bg.request_id)
    return bg

"""Helpers for the operator-door tests: a stack whose policy asks, and requests left pending."""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

from support import Background, Stack, custom_stack, wait_pending

__all__ = ["Background", "Stack", "ask", "stack_with", "wait_pending"]

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


def stack_with(tmp: Path, extra: str = "") -> Generator[Stack, None, None]:
    with custom_stack(tmp, ASK_POLICY + extra) as stack:
        yield stack


def ask(stack: Stack, argv: list[str] | None = None, **kw: Any) -> Background:
    """Start a request the policy sends to an operator, and wait until it is pending."""
    bg = Background(stack, {"argv": argv or ["echo", "hello"]} | kw)
    wait_pending(stack, bg.request_id)
    return bg

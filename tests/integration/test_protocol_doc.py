"""The examples in docs/protocol.md, run against a live stack (docs must not rot).

A ``jsonl example`` block holds pairs of lines: ``→`` is sent (as one
connection), ``←`` is the expected answer.  ``"…"`` in the expected answer
matches any value; ``<now>`` in a request is replaced by the current time.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from support import REPO, Stack, now_iso

BLOCK = re.compile(r"```jsonl example\n(.*?)```", re.S)


def examples() -> list[tuple[str, str]]:
    text = (REPO / "docs" / "protocol.md").read_text(encoding="utf-8")
    pairs: list[tuple[str, str]] = []
    for block in BLOCK.findall(text):
        lines = [line for line in block.splitlines() if line.strip()]
        for send, expect in zip(lines[::2], lines[1::2], strict=True):
            assert send.startswith("→ ") and expect.startswith("← "), (send, expect)
            pairs.append((send[2:], expect[2:]))
    return pairs


def matches(expected: Any, actual: Any) -> bool:
    if expected == "…":
        return True
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(matches(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(expected) == len(actual)
            and all(matches(e, a) for e, a in zip(expected, actual, strict=True))
        )
    return bool(expected == actual)


def test_the_doc_has_examples() -> None:
    assert len(examples()) >= 10


@pytest.mark.parametrize(("send", "expect"), examples(), ids=lambda s: s[:40])
def test_doc_example(stack: Stack, send: str, expect: str, tmp_path: Path) -> None:
    line = send.replace("<now>", now_iso())
    replies = [r for r in stack.send_raw(line.encode() + b"\n") if "event" not in r]
    assert len(replies) == 1, replies
    expected = json.loads(expect)
    assert matches(expected, replies[0]), f"\nexpected {expected}\nactual   {replies[0]}"

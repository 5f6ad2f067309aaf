"""The journal's line limit comes from what the journal itself accepts, not from the agents' request limit.

intake stores a request's settled outcome for replay (``op.complete``) with
its ``request.replied`` record; an outcome is bounded by the journal's own
caps (journal/records.py), not by ``limits.max_request_bytes``, which bounds
what an agent sends.  With a small request limit, a command whose output is
larger than it must still have its reply journaled and its outcome replayed.
Control: the same stack, a command whose output fits, behaves the same.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import Stack, custom_stack

REQUEST_LIMIT = 16 * 1024


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    runtime = Path(tmp_path_factory.mktemp("jline")) / "rt"
    with custom_stack(runtime, f"limits: {{max_request_bytes: {REQUEST_LIMIT}}}\n") as stack:
        yield stack


def _replied(stack: Stack, request_id: str) -> list[dict[str, object]]:
    return [r for r in stack.journal_rows() if r["request_id"] == request_id and r["kind"] == "request.replied"]


@pytest.mark.parametrize("output_bytes", [1000, 8 * REQUEST_LIMIT])
def test_an_outcome_larger_than_a_request_is_journaled_and_replayed(small: Stack, output_bytes: int) -> None:
    operation = f"op-{uuid.uuid4()}"
    args = {"argv": ["head", "-c", str(output_bytes), "/dev/zero"], "privileged": False, "operation_id": operation}
    first = small.exec(args, id=f"r1-{uuid.uuid4()}")
    assert first["ok"] is True, first
    assert len(_replied(small, first["id"])) == 1  # the reply is in the audit trail
    again = small.exec(args, id=f"r2-{uuid.uuid4()}")  # the same operation: its stored outcome, not a second run
    assert again["ok"] is True and again["data"].get("replay") is True, again

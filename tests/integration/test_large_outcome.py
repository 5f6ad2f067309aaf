"""A job whose outcome is too large for the replay store still answers with its output."""

from __future__ import annotations

import base64
import uuid

from conftest import Stack

SIZE = 1_100_000  # base64 makes it ~1.4 MiB of outcome: over the replay store's 1 MiB


def test_large_output_is_delivered_and_replays_without_its_bytes(stack: Stack) -> None:
    op = f"op-large-{uuid.uuid4()}"
    args = {"argv": ["head", "-c", str(SIZE), "/dev/zero"], "privileged": False, "operation_id": op}
    first = stack.exec(args)
    assert first["ok"] is True, first
    assert len(base64.b64decode(first["data"]["stdout"])) == SIZE
    again = stack.exec(args)
    assert again["ok"] is True, again
    data = again["data"]
    assert data["replay"] is True and data["output_omitted"] is True and data["stdout"] == ""
    assert data["stdout_sha256"] == first["data"]["stdout_sha256"]

"""Issue 30: a request is answered from another request's result only when the client named the same operation.

Before, an operation ID was derived from the command and the session when
none was given, so a second ``date +%s%N`` with a new request id got the
first one's stdout back (not run, not approved, and on the sudo-proxy
dialect not even marked as a replay).
"""

from __future__ import annotations

import base64
import uuid

from peer import make_req, send
from support import Stack, now_iso


def native(stack: Stack, **args: object) -> dict[str, object]:
    reply = stack.exec({"argv": ["date", "+%s%N"], "privileged": False, "time": now_iso()} | args)
    assert reply["ok"] is True, reply
    data: dict[str, object] = reply["data"]
    return data


def test_identical_sudo_proxy_requests_with_distinct_ids_both_run(peer_stack: Stack) -> None:
    first = send(peer_stack, make_req(f"date-{uuid.uuid4()}", [["date", "+%s%N"]]))
    second = send(peer_stack, make_req(f"date-{uuid.uuid4()}", [["date", "+%s%N"]]))
    assert first["status"] == second["status"] == "ok", (first, second)
    assert base64.b64decode(first["stdout"]) != base64.b64decode(second["stdout"])


def test_identical_native_requests_without_an_operation_id_both_run(peer_stack: Stack) -> None:
    first, second = native(peer_stack), native(peer_stack)
    assert first["replay"] is False and second["replay"] is False
    assert first["stdout"] != second["stdout"] and first["operation_id"] != second["operation_id"]


def test_a_named_operation_still_replays_and_says_so(peer_stack: Stack) -> None:
    op = f"op-{uuid.uuid4()}"
    first, again = native(peer_stack, operation_id=op), native(peer_stack, operation_id=op)
    assert first["replay"] is False and again["replay"] is True
    assert again["stdout"] == first["stdout"]

"""Issue 34 on a live stack: grants that stay small, and identical pending requests decided once.

`airlock approve ID --grant 30m --uses N` lets the same request through N times,
then the grant is used up (journaled ``grant.exhausted``) and the next one asks
again; the count of uses survives a restart of airlock-approval; `airlock grants`
shows the uses left.  Two identical requests of one agent pending at once are
one question: one approve decides both, and both run, each with its own story.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Background, Stack, custom_stack, wait_pending
from waits import until

CONFIG = """
approval:
  timeout_seconds: 30
  max_grant_seconds: 3600
policy:
  default: ask
  rules:
    - name: touchy
      decision: ask
      commands: [[/usr/bin/touch, "..."]]
"""


@pytest.fixture(scope="module")
def ustack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("gu")), CONFIG) as s:
        yield s


def run(stack: Stack, argv: list[str]) -> dict[str, Any]:
    return stack.exec({"argv": argv, "privileged": False, "operation_id": f"op-{uuid.uuid4()}"})


def asks(stack: Stack, argv: list[str]) -> bool:
    """Whether this command waits for an operator (it is then denied, so nothing runs)."""
    job = Background(stack, {"argv": argv})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if job.reply is not None:
            return False
        pending = stack.native("pending", path=stack.operator)["data"]["pending"]
        if any(p["request_id"] == job.request_id for p in pending):
            assert stack.native("deny", {"id": job.request_id}, path=stack.operator)["ok"]
            assert job.result()["error"]["code"] == "denied"
            return True
        time.sleep(0.05)
    raise AssertionError("neither ran nor waited")


def grant(stack: Stack, argv: list[str], *flags: str) -> str:
    job = Background(stack, {"argv": argv})
    wait_pending(stack, job.request_id)
    done = stack.cli("approve", job.request_id, *flags)
    assert done.returncode == 0, done.stderr
    assert job.result()["ok"] is True
    listed = stack.native("grants", path=stack.operator)["data"]["grants"]
    return str(next(g["grant_id"] for g in listed if g["request_id"] == job.request_id))


def listed(stack: Stack, grant_id: str) -> dict[str, Any] | None:
    for g in stack.native("grants", path=stack.operator)["data"]["grants"]:
        if g["grant_id"] == grant_id:
            found: dict[str, Any] = g
            return found
    return None


def grant_actions(stack: Stack, grant_id: str) -> list[str]:
    out = []
    for row in stack.journal_rows():
        payload = json.loads(row["payload"])
        if row["kind"] == "operator.action" and payload.get("grant_id") == grant_id:
            out.append(payload["action"])
        if row["kind"] == "approval.decided" and payload.get("grant_id") == grant_id:
            out.append(f"used {payload.get('grant_use')}/{payload.get('grant_uses')}")
    return out


def test_a_grant_of_two_uses_is_used_up_and_the_third_request_asks(ustack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "twice"
    grant_id = grant(ustack, ["touch", str(marker)], "--grant", "30m", "--uses", "2")
    shown = listed(ustack, grant_id)
    assert shown is not None and shown["uses"] == 2 and shown["uses_left"] == 2
    table = ustack.cli("grants").stdout
    assert "USES LEFT" in table and "2 of 2" in table, table
    first = run(ustack, ["touch", str(marker)])
    assert first["ok"] is True and first["data"]["decision"]["decided_by"] == f"grant {grant_id}"
    shown = listed(ustack, grant_id)
    assert shown is not None and shown["uses_left"] == 1
    assert "1 of 2" in ustack.cli("grants").stdout
    last = run(ustack, ["touch", str(marker)])
    assert last["ok"] is True
    story = ustack.cli("show", last["data"]["operation_id"]).stdout
    assert f"allow by grant {grant_id} (given by root), use 2 of 2" in story, story
    assert listed(ustack, grant_id) is None  # used up: no longer live
    assert asks(ustack, ["touch", str(marker)])  # the third asks a person
    assert grant_actions(ustack, grant_id) == ["approve", "grant", "used 1/2", "used 2/2", "grant.exhausted"]


def test_the_uses_survive_a_restart_of_approval(ustack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "restart"
    grant_id = grant(ustack, ["touch", str(marker)], "--grant", "30m", "--uses", "2")
    assert run(ustack, ["touch", str(marker)])["ok"] is True
    ustack.kill_service("approval")
    shown = listed(ustack, grant_id)
    assert shown is not None and shown["uses_left"] == 1, shown  # the use taken before is still taken
    again = run(ustack, ["touch", str(marker)])
    assert again["ok"] is True and again["data"]["decision"]["decided_by"] == f"grant {grant_id}"
    assert asks(ustack, ["touch", str(marker)])
    ustack.kill_service("approval")
    assert listed(ustack, grant_id) is None and asks(ustack, ["touch", str(marker)])  # still used up


def test_uses_without_a_grant_and_bad_uses_are_refused_and_approve_nothing(ustack: Stack, tmp_path: Path) -> None:
    job = Background(ustack, {"argv": ["touch", str(tmp_path / "bad")]})
    wait_pending(ustack, job.request_id)
    alone = ustack.cli("approve", job.request_id, "--uses", "2")
    assert alone.returncode == 2 and "--uses needs --grant" in alone.stderr
    zero = ustack.native("approve", {"id": job.request_id, "grant_seconds": 60, "uses": 0}, path=ustack.operator)
    assert zero["ok"] is False and zero["error"]["details"]["field"] == "uses"
    assert wait_pending(ustack, job.request_id)  # still pending: nothing was approved
    assert ustack.cli("deny", job.request_id).returncode == 0
    assert job.result()["error"]["code"] == "denied"


def test_two_identical_pending_requests_are_decided_by_one_approve_and_both_run(ustack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "twins"
    first = Background(ustack, {"argv": ["touch", str(marker)]})
    wait_pending(ustack, first.request_id)
    second = Background(ustack, {"argv": ["touch", str(marker)]})
    deadline = time.monotonic() + 15
    leader: dict[str, Any] = {}
    while time.monotonic() < deadline:
        leader = wait_pending(ustack, first.request_id)
        if leader.get("attached"):
            break
        time.sleep(0.05)
    assert leader["attached"] == [second.request_id]
    # One question, not two: the second is listed as attached, and the console's table names it on the first's line.
    assert wait_pending(ustack, second.request_id)["attached_to"] == first.request_id
    table = ustack.cli("pending").stdout
    assert f"{first.request_id} also decides: {second.request_id}" in table
    assert f"{second.request_id}: airlock approve" not in table
    assert ustack.cli("approve", first.request_id).returncode == 0
    a, b = first.result(), second.result()
    assert a["ok"] is True and b["ok"] is True, (a, b)
    assert a["data"]["stages"][0]["exit_code"] == 0 and b["data"]["stages"][0]["exit_code"] == 0
    # Each its own story: pending (attached), decided with the first, started, finished, replied.
    kinds = [r["kind"] for r in ustack.journal_rows() if r["request_id"] == second.request_id]
    assert kinds[:3] == ["request.received", "approval.pending", "approval.decided"], kinds
    assert "exec.finished" in kinds and kinds[-1] == "request.replied"
    records = {
        r["kind"]: json.loads(r["payload"]) for r in ustack.journal_rows() if r["request_id"] == second.request_id
    }
    assert records["approval.pending"]["attached_to"] == first.request_id
    assert records["approval.decided"]["decided_with"] == first.request_id
    assert records["approval.decided"]["decision"] == "allow" and records["approval.decided"]["by"] == "root"
    shown = ustack.cli("show", second.operation_id).stdout
    assert f"decided with the identical request {first.request_id}" in shown, shown


def test_an_attached_request_keeps_waiting_when_the_first_goes_away(ustack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "left"
    first = Background(ustack, {"argv": ["touch", str(marker)]})
    wait_pending(ustack, first.request_id)
    second = Background(ustack, {"argv": ["touch", str(marker)]})
    until("the second request attached to the first", lambda: wait_pending(ustack, first.request_id).get("attached"))
    # The operator cancels the first operation alone: the second becomes a question of its own.
    assert ustack.cli("cancel", first.operation_id).returncode == 0
    assert first.result()["error"]["code"] == "denied"
    promoted = wait_pending(ustack, second.request_id)
    assert "attached_to" not in promoted
    assert ustack.cli("approve", second.request_id).returncode == 0
    assert second.result()["ok"] is True


def test_the_journal_still_folds_through_the_lifecycle(ustack: Stack) -> None:
    done = ustack.cli("audit", "verify", "--lifecycle")
    assert done.returncode == 0, done.stdout + done.stderr

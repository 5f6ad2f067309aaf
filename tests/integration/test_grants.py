"""Issue 18: time-boxed grants on a live stack.

`airlock approve ID --grant DURATION [--scope command|rule]` approves and lets the
same requester run the same command (or anything the rule allows) without a
prompt -- not a different command, not after expiry or revoke, not while on
hold -- and the grant survives a restart of airlock-approval.
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
    - name: pair
      decision: ask
      approvals: 2
      commands: [[/usr/bin/mkdir, "..."]]
    - name: zz-careful
      decision: ask
      commands: [[/usr/bin/touch, -c, "..."]]
"""


@pytest.fixture(scope="module")
def gstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("gr")), CONFIG) as s:
        yield s


def run(stack: Stack, argv: list[str]) -> dict[str, Any]:
    """The same spec each time (a fresh operation ID, so it is not a replay)."""
    return stack.exec({"argv": argv, "privileged": False, "operation_id": f"op-{uuid.uuid4()}"})


def asks(stack: Stack, argv: list[str], answer: str = "deny") -> bool:
    """Whether this command waits for an operator (it is then denied, so nothing runs; or approved).

    A person's deny is remembered (issue 45): no grant stands in for that command afterwards.
    """
    job = Background(stack, {"argv": argv})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if job.reply is not None:
            return False
        pending = stack.native("pending", path=stack.operator)["data"]["pending"]
        if any(p["request_id"] == job.request_id for p in pending):
            assert stack.native(answer, {"id": job.request_id}, path=stack.operator)["ok"]
            assert (job.result().get("error") or {}).get("code") == ("denied" if answer == "deny" else None)
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
    found = [g for g in listed if g["request_id"] == job.request_id]
    assert found, listed
    grant_id: str = found[0]["grant_id"]
    return grant_id


def actions(stack: Stack, grant_id: str) -> list[str]:
    out = []
    for row in stack.journal_rows():
        payload = json.loads(row["payload"])
        if row["kind"] == "operator.action" and payload.get("grant_id") == grant_id:
            out.append(payload["action"])
        if row["kind"] == "approval.decided" and payload.get("grant_id") == grant_id:
            out.append("used")
    return out


def test_a_command_grant_lets_the_same_command_through_and_nothing_else(gstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "granted"
    grant_id = grant(gstack, ["touch", str(marker)], "--grant", "30m")
    marker.unlink()
    again = run(gstack, ["touch", str(marker)])
    assert again["ok"] is True and again["data"]["decision"]["decided_by"] == f"grant {grant_id}"
    assert marker.exists()
    shown = gstack.cli("show", again["data"]["operation_id"]).stdout
    assert f"allow by grant {grant_id} (given by" in shown, shown
    assert asks(gstack, ["touch", str(tmp_path / "other")])  # another command of the same rule still asks
    assert asks(gstack, ["touch", str(marker), str(tmp_path / "more")])
    assert actions(gstack, grant_id) == ["approve", "grant", "used"]
    listing = gstack.cli("grants")
    assert grant_id in listing.stdout and "command" in listing.stdout, listing.stdout
    # A person types a prefix, as for `airlock show` (issue 32: it used to say "no live grant").
    assert gstack.cli("grants", "revoke", grant_id[:6]).returncode == 0
    assert asks(gstack, ["touch", str(marker)])
    assert actions(gstack, grant_id)[-1] == "grant.revoke"


def test_a_rule_grant_covers_the_rule_and_not_other_rules(gstack: Stack, tmp_path: Path) -> None:
    grant_id = grant(gstack, ["touch", str(tmp_path / "a")], "--grant", "10m", "--scope", "rule")
    other = run(gstack, ["touch", str(tmp_path / "b")])
    assert other["ok"] is True and (tmp_path / "b").exists()
    assert asks(gstack, ["rmdir", str(tmp_path / "nothing")])  # the default's ask, not the rule's
    # Issue 27: touchy and zz-careful both ask for `touch -c`; touchy's name sorts first, but
    # zz-careful decides too, and a grant of touchy alone does not answer for it.
    assert asks(gstack, ["touch", "-c", str(tmp_path / "c")])
    assert gstack.cli("grants", "revoke", grant_id).returncode == 0


def test_a_grant_expires_and_its_end_is_journaled(gstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "short"
    grant_id = grant(gstack, ["touch", str(marker)], "--grant", "2s")
    until(f"{grant_id} expired", lambda: "grant.expired" in actions(gstack, grant_id), timeout=20)
    assert actions(gstack, grant_id)[-1] == "grant.expired"
    assert asks(gstack, ["touch", str(marker)])


def test_no_grant_applies_while_on_hold(gstack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "held"
    grant_id = grant(gstack, ["touch", str(marker)], "--grant", "10m")
    assert gstack.cli("hold", "--reason", "grant test").returncode == 0
    try:
        assert asks(gstack, ["touch", str(marker)], "approve")  # a deny would keep the grant from it
    finally:
        assert gstack.cli("release").returncode == 0
    assert run(gstack, ["touch", str(marker)])["ok"] is True  # control: released, the grant applies again
    assert gstack.cli("grants", "revoke", grant_id).returncode == 0


def test_a_grant_survives_a_restart_of_approval_and_a_revoke_too(gstack: Stack, tmp_path: Path) -> None:
    kept, revoked = tmp_path / "kept", tmp_path / "revoked"
    keep_id = grant(gstack, ["touch", str(kept)], "--grant", "10m")
    gone_id = grant(gstack, ["touch", str(revoked)], "--grant", "10m")
    assert gstack.cli("grants", "revoke", gone_id).returncode == 0
    gstack.kill_service("approval")
    again = run(gstack, ["touch", str(kept)])
    assert again["ok"] is True and again["data"]["decision"]["decided_by"] == f"grant {keep_id}"
    assert asks(gstack, ["touch", str(revoked)])
    assert gstack.cli("grants", "revoke", keep_id).returncode == 0


def test_bad_grants_are_refused_and_approve_nothing(gstack: Stack, tmp_path: Path) -> None:
    job = Background(gstack, {"argv": ["mkdir", str(tmp_path / "two")]})
    wait_pending(gstack, job.request_id)
    quorum = gstack.cli("approve", job.request_id, "--grant", "10m")
    assert quorum.returncode == 1 and "several approvers" in quorum.stderr
    too_long = gstack.native("approve", {"id": job.request_id, "grant_seconds": 7200}, path=gstack.operator)
    assert too_long["error"]["details"]["field"] == "grant_seconds"
    assert wait_pending(gstack, job.request_id)["quorum"]["approvals"] == 0
    assert gstack.cli("deny", job.request_id).returncode == 0
    assert job.result()["error"]["code"] == "denied"


def test_the_journal_with_grants_and_votes_still_folds_through_the_lifecycle(gstack: Stack) -> None:
    # Every grant and vote record is an operator.action, outside a request's lifecycle, even after its reply.
    done = gstack.cli("audit", "verify", "--lifecycle")
    assert done.returncode == 0, done.stdout + done.stderr

"""A request that waited for an operator still runs when the journal restarted meanwhile.

Deferred journal records (issue 21) are named by marks of one journal process.
A request waiting for an operator outlives the journal's idle exit easily
(services.idle_exit_seconds is 300 s, approval.timeout_seconds 600 s), so the
marks it collected before it waited must not be asked for again afterwards:
approval.pending committed them durably.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import ask, stack_with

from support import Stack


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("restart")), "approval:\n  timeout_seconds: 60\n")


def test_an_operator_approval_after_a_journal_restart_runs_and_is_audited(ops: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    bg = ask(ops, ["touch", str(marker)])
    old = ops.service_pid("journal")
    assert ops.kill_service("journal") != old  # a new journal process: the old marks are gone
    assert ops.cli("approve", bg.request_id).returncode == 0
    reply = bg.result()
    assert reply["ok"] is True, reply
    assert marker.exists()
    kinds = [r["kind"] for r in ops.journal_rows() if r["request_id"] == bg.request_id]
    for kind in ("request.received", "approval.pending", "approval.decided", "exec.started", "exec.finished"):
        assert kind in kinds, kinds
    assert ops.cli("audit", "verify", "--lifecycle").returncode == 0


def test_a_rule_allowed_request_after_a_journal_restart_runs(ops: Stack) -> None:
    # Control for the test above: the stack and the restart work for a request that never waited.
    ops.kill_service("journal")
    reply = ops.exec({"argv": ["/usr/bin/true"], "privileged": False})
    assert reply["ok"] is True, json.dumps(reply)

"""The emergency brake holds across restarts (issue 16).

`airlock hold` used to live only in approval's memory: an idle exit, a
SIGTERM or a crash lifted it, and a policy-allowed request then ran with no
operator.  The hold is now journaled and restored when approval starts; if
approval cannot read it then, it starts held.

Each test first shows that the request runs at once when nothing is held (the
control), so a hold that "survives" cannot pass vacuously.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Background, Stack, custom_stack, now_iso
from waits import wait_pending, wait_record, wait_service_exited

CONFIG = """
services:
  idle_exit_seconds: 2
approval:
  timeout_seconds: 60
policy:
  default: ask
  rules:
    - name: markers
      decision: allow
      privileged: false
      commands: [[/usr/bin/touch, "..."]]
"""


@pytest.fixture(scope="module")
def hstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("hold")), CONFIG) as s:
        yield s


def status(stack: Stack) -> dict[str, Any]:
    reply = stack.native("status", path=stack.operator)
    assert reply["ok"] is True, reply
    data: dict[str, Any] = reply["data"]
    return data


def runs_at_once(stack: Stack, marker: Path) -> None:
    """The control: nothing held, the rule allows the request and it runs."""
    reply = stack.exec({"argv": ["touch", str(marker)], "privileged": False})
    assert reply["ok"] is True, reply
    assert marker.exists()


def waits_for_an_operator(stack: Stack, marker: Path) -> None:
    job = Background(stack, {"argv": ["touch", str(marker)], "privileged": False})
    item = wait_pending(stack, job.request_id, timeout=30)
    assert item["rule"] == "hold"
    assert not marker.exists()
    assert stack.cli("deny", job.request_id, "--reason", "held").returncode == 0
    assert job.result()["error"]["code"] == "denied"
    assert not marker.exists()


def release(stack: Stack) -> None:
    result = stack.cli("release")
    assert result.returncode == 0, result.stderr


def test_a_hold_survives_sigterm_of_approval(hstack: Stack, tmp_path: Path) -> None:
    runs_at_once(hstack, tmp_path / "control")
    assert hstack.cli("hold", "--reason", "incident 16").returncode == 0
    before = status(hstack)
    assert before["hold"] is True and before["hold_reason"] == "incident 16"
    assert before["hold_by"] == getpass.getuser() and before["hold_uid"] == os.getuid()
    assert before["hold_since"]
    pid = hstack.service_pid("approval")
    os.kill(pid, signal.SIGTERM)
    wait_service_exited(hstack, "approval", pid)
    try:
        after = status(hstack)  # this connection starts approval again
        assert hstack.service_pid("approval") != pid
        assert after["hold"] is True and after["hold_reason"] == "incident 16"
        assert (after["hold_by"], after["hold_since"]) == (before["hold_by"], before["hold_since"])
        shown = hstack.cli("status").stdout
        assert f"on hold by {getpass.getuser()} since {before['hold_since']} (incident 16)" in shown, shown
        waits_for_an_operator(hstack, tmp_path / "after-sigterm")
    finally:
        release(hstack)
    runs_at_once(hstack, tmp_path / "released")


def test_a_hold_survives_an_idle_exit_and_so_does_its_release(hstack: Stack, tmp_path: Path) -> None:
    assert hstack.cli("hold", "--reason", "maintenance").returncode == 0
    try:
        pid = hstack.service_pid("approval")
        wait_service_exited(hstack, "approval", pid)  # idle_exit_seconds: 2
        assert status(hstack)["hold"] is True
        waits_for_an_operator(hstack, tmp_path / "after-idle")
    finally:
        release(hstack)
    pid = hstack.service_pid("approval")
    wait_service_exited(hstack, "approval", pid)
    assert status(hstack)["hold"] is False
    runs_at_once(hstack, tmp_path / "released-after-idle")


def test_approval_starts_held_when_it_cannot_read_the_hold_state(hstack: Stack, tmp_path: Path) -> None:
    runs_at_once(hstack, tmp_path / "control")
    journal = hstack.runtime_dir / "internal" / "journal.sock"
    hidden = journal.with_name("journal.sock.hidden")
    pid = hstack.service_pid("approval")
    os.kill(pid, signal.SIGTERM)
    wait_service_exited(hstack, "approval", pid)
    journal.rename(hidden)  # approval's next start cannot reach the journal
    try:
        held = status(hstack)
        assert held["hold"] is True and held["hold_by"] == "airlock-approval"
        assert "could not be read from the journal" in held["hold_reason"]
    finally:
        hidden.rename(journal)
    # Held, not broken: once the journal is back an operator releases it.
    waits_for_an_operator(hstack, tmp_path / "while-unknown")
    release(hstack)
    runs_at_once(hstack, tmp_path / "released")


def test_a_rule_s_ticket_issued_just_before_a_hold_is_not_redeemed(hstack: Stack, tmp_path: Path) -> None:
    """A rule allowed the request, then the operator held before the runner redeemed: nothing runs.

    The SPIN model's property P4 (model/airlock.pml): no ticket a policy rule
    issued is redeemed while the hold is on.  The runner is paused (SIGSTOP)
    between the decision and the redeem, as behind a slow runner.
    """
    runs_at_once(hstack, tmp_path / "control")
    marker = tmp_path / "raced"
    pid = hstack.service_pid("runner")
    os.kill(pid, signal.SIGSTOP)
    try:
        job = Background(hstack, {"argv": ["touch", str(marker)], "privileged": False})
        wait_record(hstack, "approval.decided", request_id=job.request_id, timeout=30)
        assert hstack.cli("hold", "--reason", "race").returncode == 0
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        reply = job.result()
        assert reply["ok"] is False and reply["error"]["code"] == "denied", reply
        assert "hold" in reply["error"]["message"]
        assert not marker.exists()
        refused = [
            r for r in hstack.journal_rows() if r["kind"] == "exec.refused" and r["request_id"] == job.request_id
        ]
        assert refused, "the runner's refusal was not journaled"
    finally:
        release(hstack)
    runs_at_once(hstack, tmp_path / "after")


ROLLING = CONFIG + "journal:\n  segment_max_bytes: 200000\n"


def test_a_hold_survives_a_rollover_of_the_journal_and_a_restart_of_approval(tmp_path: Path) -> None:
    """After a rollover the hold's record is in a sealed segment only: the new segment's opening record
    carries it (the queries common/wire/journal.py CARRIED declares), approval reads it back through the
    journal's generic read.  Control: before the rollover the record is in the live database."""
    with custom_stack(tmp_path / "rt", ROLLING) as stack:
        assert stack.cli("hold", "--reason", "incident carried").returncode == 0

        def kinds() -> list[tuple[str, str]]:
            # Closed at once: a connection left to the garbage collector would keep the rollover locked out.
            with contextlib.closing(sqlite3.connect(f"file:{stack.database}?mode=ro", uri=True)) as conn:
                return [(str(k), str(p)) for k, p in conn.execute("SELECT kind, payload FROM events")]

        assert any(k == "operator.action" and '"hold"' in p for k, p in kinds())  # the control
        job = Background(stack, {"argv": ["touch", str(tmp_path / "x")], "privileged": False})
        assert wait_pending(stack, job.request_id, timeout=30)["rule"] == "hold"  # held: every request asks
        assert stack.cli("deny", job.request_id, "--reason", "held").returncode == 0
        job.result()
        sealed = stack.database.with_name("segments")
        deadline = time.monotonic() + 120
        n = 0
        while not (sealed.is_dir() and any(sealed.glob("journal-*.db"))):
            assert time.monotonic() < deadline, "no rollover"
            n += 1
            stack.native("hello", {"time": now_iso()}, id=f"roll-{n}-" + "x" * 200)
        assert any(k == "segment.opened" for k, _ in kinds())
        assert not any(k == "operator.action" and '"hold"' in p for k, p in kinds())  # sealed away
        pid = stack.service_pid("approval")
        os.kill(pid, signal.SIGTERM)
        wait_service_exited(stack, "approval", pid)
        after = status(stack)
        assert after["hold"] is True and after["hold_reason"] == "incident carried", after

"""The relay an operator can leave alone (issue 28, items 5 and 6), under `airlock dev up`.

- A cursor belongs to one journal: after the journal is deleted and starts
  again at seq 1 (a purge and reinstall), the relay's old cursor would skip
  every event up to its seq.  It starts over instead, with a journald warning
  of its own, and the next pending request is delivered.  Control: restarted
  on the same journal, it resumes (no warning).
- A receiver that rejects every message is reported (a log event with its
  MESSAGE_ID, and `airlock status`), and `airlock status` shows the relay:
  running, each channel's last delivered event, its lag and its last error.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from notify_receivers import HttpReceiver

from support import Background, Stack, custom_stack, wait_pending

SECRET = "relay-trust-secret-0123456789"
RESET_ID = "3a7e5c9b1d2f4e8a9c6b0d4f2e8a1c57"
FAILING_ID = "8f4c2e1a9b7d4c3e8a6f5b2d1c9e7a40"


def _config(http: HttpReceiver) -> str:
    return (
        "approval: {timeout_seconds: 60}\n"
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  backoff_max_seconds: 1\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: {SECRET}}}\n"
    )


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    if receiver.server is not None:
        receiver.down()


def _ask_and_deny(stack: Stack, http: HttpReceiver, reason: str) -> str:
    bg = Background(stack, {"argv": ["/usr/bin/id", "-u"], "privileged": True, "reason": reason})
    wait_pending(stack, bg.request_id)
    http.wait("/hook", lambda p: p.json()["request_id"] == bg.request_id and p.json()["event"] == "pending")
    assert stack.native("deny", {"id": bg.request_id}, path=stack.operator)["ok"]
    bg.result()
    return bg.request_id


def _notify_log(stack: Stack) -> str:
    return (stack.runtime_dir / "logs" / "notify.log").read_text()


def _status(stack: Stack) -> dict[str, Any]:
    done = stack.cli("--json", "status")
    assert done.returncode == 0, done.stderr
    relay: dict[str, Any] = json.loads(done.stdout)["data"]["relay"]
    return relay


def test_a_cursor_of_a_deleted_journal_starts_over_and_the_next_request_is_delivered(
    tmp_path: Path, http: HttpReceiver
) -> None:
    runtime = tmp_path / "rt"
    cursor_file = runtime / "state" / "notify" / "cursor-hook.json"
    with custom_stack(runtime, _config(http)) as stack:
        for i in range(4):  # the old journal gets well ahead of where a new one will be
            _ask_and_deny(stack, http, f"old journal {i}")
        http.wait("/hook", lambda p: p.json()["event"] == "decided" and p.json()["reason"] == "old journal 3")
    old = json.loads(cursor_file.read_text())
    assert old["seq"] > 12 and isinstance(old["journal"], str), old

    # Control: the same journal again: the cursor is resumed, nothing is reset.
    with custom_stack(runtime, _config(http)) as stack:
        rid = _ask_and_deny(stack, http, "same journal")
        assert RESET_ID not in _notify_log(stack)
        assert '"notify.cursor.resumed"' in _notify_log(stack)
    assert json.loads(cursor_file.read_text())["journal"] == old["journal"]

    # The journal goes (what a purge does to /var/lib/airlock); the relay's state stays.
    for path in (runtime / "state").iterdir():
        if path.name != "notify":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (runtime / "logs" / "notify.log").unlink()
    with custom_stack(runtime, _config(http)) as stack:
        bg = Background(stack, {"argv": ["/usr/bin/id", "-u"], "privileged": True, "reason": "new journal"})
        pending = wait_pending(stack, bg.request_id)
        assert pending
        post = http.wait(
            "/hook", lambda p: p.json()["request_id"] == bg.request_id and p.json()["event"] == "pending", timeout=20
        )
        assert post.json()["seq"] < old["seq"]  # the old cursor would have skipped it
        log = _notify_log(stack)
        assert '"notify.cursor.reset"' in log and RESET_ID in log
        reset = next(json.loads(line) for line in log.splitlines() if '"notify.cursor.reset"' in line)
        assert reset["journal"] == old["journal"] and reset["current_journal"] != old["journal"]
        assert stack.native("deny", {"id": bg.request_id}, path=stack.operator)["ok"]
        bg.result()
    # Bound to the new journal now (it may have been empty when the relay started).
    now_bound = json.loads(cursor_file.read_text())["journal"]
    assert isinstance(now_bound, str) and now_bound != old["journal"]
    assert rid


def test_a_receiver_that_rejects_everything_is_reported_and_status_shows_the_relay(
    tmp_path: Path, http: HttpReceiver
) -> None:
    with custom_stack(tmp_path / "rt", _config(http)) as stack:
        # Healthy: running, nothing failing; then one delivery shows.
        deadline = time.monotonic() + 20
        while _status(stack)["state"] != "running":
            assert time.monotonic() < deadline, _status(stack)
            time.sleep(0.2)
        rid = _ask_and_deny(stack, http, "while the receiver is up")
        http.wait("/hook", lambda p: p.json()["request_id"] == rid and p.json()["event"] == "decided")
        deadline = time.monotonic() + 15
        while (hook := _status(stack)["channels"][0])["delivered_seq"] is None or hook["lag"]:
            assert time.monotonic() < deadline, hook
            time.sleep(0.2)
        assert hook["name"] == "hook" and hook["failing_since"] is None and hook["last_error"] is None

        # The receiver goes away for good: reported, not retried silently.
        http.down()
        bg = Background(stack, {"argv": ["/usr/bin/id", "-u"], "privileged": True, "reason": "nobody hears"})
        wait_pending(stack, bg.request_id)
        deadline = time.monotonic() + 30
        while FAILING_ID not in _notify_log(stack):
            assert time.monotonic() < deadline, "the failing channel was never reported"
            time.sleep(0.2)
        deadline = time.monotonic() + 5  # the status file follows within a second or so
        while (relay := _status(stack))["channels"][0]["failures"] < 5:
            assert time.monotonic() < deadline, relay
            time.sleep(0.2)
        hook = relay["channels"][0]
        assert relay["state"] == "running" and hook["failing_since"]
        assert "cannot reach the receiver" in hook["last_error"] and hook["queued"] + 1 >= 1
        text = stack.cli("status")
        assert text.returncode == 0, text.stderr
        assert "relay" in text.stdout and "FAILING since" in text.stdout and "cannot reach" in text.stdout

        # Back: the message goes out, and the channel is no longer failing.
        http.up()
        http.wait("/hook", lambda p: p.json()["request_id"] == bg.request_id, timeout=30)
        deadline = time.monotonic() + 15
        while _status(stack)["channels"][0]["failing_since"] is not None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert stack.native("deny", {"id": bg.request_id}, path=stack.operator)["ok"]
        bg.result()
    # Stopped: the status file says so, and status does not call a dead relay running.
    relay_file = tmp_path / "rt" / "state" / "notify" / "status.json"
    assert json.loads(relay_file.read_text())["state"] == "stopped"


def test_a_restarted_relay_still_shows_what_it_delivered(tmp_path: Path, http: HttpReceiver) -> None:
    """Issue 44: after a reinstall (the relay restarted on the same journal) `airlock status` said
    "nothing delivered yet" for a channel that had delivered; what it delivered is kept with the cursor."""
    runtime = tmp_path / "rt"
    relayed = _config(http).replace("approval: {timeout_seconds: 60}\n", "")  # the relayed wait, chosen for us
    with custom_stack(runtime, relayed) as stack:
        rid = _ask_and_deny(stack, http, "before the restart")
        http.wait("/hook", lambda p: p.json()["request_id"] == rid and p.json()["event"] == "decided")
        deadline = time.monotonic() + 15
        while (hook := _status(stack)["channels"][0])["delivered_seq"] is None or hook["lag"]:
            assert time.monotonic() < deadline, hook
            time.sleep(0.2)
        before = (hook["delivered_seq"], hook["delivered_at"])
    with custom_stack(runtime, relayed) as stack:
        deadline = time.monotonic() + 20
        while (relay := _status(stack))["state"] != "running" or relay.get("pid") is None:
            assert time.monotonic() < deadline, relay
            time.sleep(0.2)
        hook = relay["channels"][0]
        assert (hook["delivered_seq"], hook["delivered_at"]) == before, hook
        text = stack.cli("status")
        assert f"delivered up to event {before[0]}" in text.stdout and "nothing delivered" not in text.stdout, text
        # Issue 44 too: the 600 s that notify.channels chose for approval's wait is said.
        assert relay["approval_timeout_seconds"] == 600 and "notify.channels is set" in relay["approval_timeout_why"]
        assert "600 s for an operator: notify.channels is set and approval.timeout_seconds is not" in text.stdout

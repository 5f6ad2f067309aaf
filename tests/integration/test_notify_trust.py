"""The relay an operator can leave alone (issue 28, items 5 and 6), under `airlock dev up`.

- A cursor belongs to one journal: after the journal is deleted and starts
  again at seq 1 (a purge and reinstall), the relay's old cursor would skip
  every event up to its seq.  It starts over instead, with a journald warning
  of its own, and the next pending request is delivered.  Control: restarted
  on the same journal, it resumes (no warning).
- A receiver that rejects every message is reported (a log event with its
  MESSAGE_ID, and `airlock status`), and `airlock status` shows the relay:
  running, each channel's last delivered event, its lag and its last error.
- Issue 44: what a channel delivered survives a restart of the relay; a reload
  (SIGHUP) applies web.url and names what needs a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
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


def _caught_up(stack: Stack) -> dict[str, Any]:
    """The channel's status once it has delivered something and lags behind nothing."""
    deadline = time.monotonic() + 15
    while (hook := _status(stack)["channels"][0])["delivered_seq"] is None or hook["lag"]:
        assert time.monotonic() < deadline, hook
        time.sleep(0.2)
    return dict(hook)


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
        hook = _caught_up(stack)
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
        hook = _caught_up(stack)
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


def _relay_pid(stack: Stack) -> int:
    deadline = time.monotonic() + 20
    while True:
        found = subprocess.run(
            ["pgrep", "-P", str(stack.proc.pid), "-f", r"airlock\.relay( |$)"], capture_output=True, text=True
        )
        if found.stdout.split():
            return int(found.stdout.split()[0])
        assert time.monotonic() < deadline, "no relay"
        time.sleep(0.2)


def _link(stack: Stack, http: HttpReceiver, reason: str) -> str:
    rid = _ask_and_deny(stack, http, reason)
    return str(
        http.wait("/hook", lambda p: p.json()["request_id"] == rid and p.json()["event"] == "pending").json()["link"]
    )


def _log_event(stack: Stack, event: str, after: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        for line in _notify_log(stack).splitlines()[after:]:
            if f'"{event}"' in line:
                return dict(json.loads(line))
        assert time.monotonic() < deadline, f"no {event} in the relay's log"
        time.sleep(0.1)


def _hup(stack: Stack, text: str) -> int:
    """Write the runtime folder's airlock.yaml (the file the relay reads) and reload the relay."""
    lines = len(_notify_log(stack).splitlines())
    (stack.runtime_dir / "airlock.yaml").write_text(text)
    os.kill(_relay_pid(stack), signal.SIGHUP)
    return lines


def test_a_reload_applies_web_url_and_names_what_needs_a_restart(tmp_path: Path, http: HttpReceiver) -> None:
    """Issue 44: a relay reload (`systemctl reload airlock-notify`: SIGHUP) takes web.url from the file at
    once (before, SIGHUP ended the relay and web.url needed a restart); any other changed key is named as
    needing a restart, and a file that does not load is refused whole while the relay goes on."""
    with custom_stack(tmp_path / "rt", _config(http) + "web: {url: 'https://old.example.org'}\n") as stack:
        pid = _relay_pid(stack)
        assert _link(stack, http, "before").startswith("https://old.example.org/request?ref=")
        written = (stack.runtime_dir / "airlock.yaml").read_text()
        new = written.replace("https://old.example.org", "https://new.example.org")
        assert new != written
        after = _hup(stack, new)
        done = _log_event(stack, "notify.reloaded", after)
        assert done["web_url"] == "https://new.example.org" and done["needs_restart"] == [], done
        assert _link(stack, http, "after").startswith("https://new.example.org/request?ref=")
        assert _relay_pid(stack) == pid  # the same process: a reload, not a restart

        # Another change is named as needing a restart; web.url still follows the file.
        partial = new.replace("https://new.example.org", "https://third.example.org").replace(
            "poll_seconds: 0.2", "poll_seconds: 0.3"
        )
        after = _hup(stack, partial)
        warned = _log_event(stack, "notify.reload.partial", after)
        assert warned["needs_restart"] == ["notify.poll_seconds"], warned
        assert _link(stack, http, "partial").startswith("https://third.example.org/")

        # A file that does not load is refused whole: the relay goes on as it was.
        after = _hup(stack, partial + "web: [not, a, mapping]\n")
        refused = _log_event(stack, "notify.reload.refused", after)
        assert "web" in refused["error"], refused
        assert _link(stack, http, "refused").startswith("https://third.example.org/")
        assert _relay_pid(stack) == pid

"""A relay reload (`systemctl reload airlock-notify`: SIGHUP) applies web.url at once (issue 44, item 6).

Before, the relay ignored SIGHUP's purpose (it had no reload): a new web.url reached messages only
after a restart.  Now a reload takes web.url from the file, names every other changed key as needing
a restart (and keeps running on the old values), and a file that does not load is refused whole.
Under `airlock dev up`: the relay is a real process reading the runtime folder's airlock.yaml.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from notify_receivers import HttpReceiver

from support import Background, Stack, custom_stack, wait_pending

SECRET = "relay-reload-secret-0123456789"


def _config(http: HttpReceiver, web_url: str) -> str:
    return (
        f"approval: {{timeout_seconds: 60}}\nweb: {{url: '{web_url}'}}\n"
        "notify:\n  host: testhost\n  poll_seconds: 0.2\n  backoff_max_seconds: 1\n  channels:\n"
        f"    - {{type: webhook, name: hook, url: '{http.url('/hook')}', secret: {SECRET}}}\n"
    )


@pytest.fixture
def http() -> Iterator[HttpReceiver]:
    receiver = HttpReceiver()
    yield receiver
    if receiver.server is not None:
        receiver.down()


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
    bg = Background(stack, {"argv": ["/usr/bin/id", "-u"], "privileged": True, "reason": reason})
    wait_pending(stack, bg.request_id)
    post = http.wait("/hook", lambda p: p.json()["request_id"] == bg.request_id and p.json()["event"] == "pending")
    assert stack.native("deny", {"id": bg.request_id}, path=stack.operator)["ok"]
    bg.result()
    return str(post.json()["link"])


def _log_event(stack: Stack, event: str, after: int) -> dict[str, Any]:
    log = stack.runtime_dir / "logs" / "notify.log"
    deadline = time.monotonic() + 10
    while True:
        for line in log.read_text().splitlines()[after:]:
            if f'"{event}"' in line:
                return dict(json.loads(line))
        assert time.monotonic() < deadline, f"no {event} in the relay's log"
        time.sleep(0.1)


def _hup(stack: Stack, text: str) -> int:
    """Write the runtime folder's airlock.yaml (the file the relay reads) and reload the relay."""
    lines = len((stack.runtime_dir / "logs" / "notify.log").read_text().splitlines())
    (stack.runtime_dir / "airlock.yaml").write_text(text)
    os.kill(_relay_pid(stack), signal.SIGHUP)
    return lines


def test_a_reload_applies_web_url_and_names_what_needs_a_restart(tmp_path: Path, http: HttpReceiver) -> None:
    with custom_stack(tmp_path / "rt", _config(http, "https://old.example.org")) as stack:
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

"""One observer cannot starve the decision point (issue 28, item 4).

An observer (the relay's role: read-only on operator.sock) opened about
2,700 connections and held them: airlock-approval ran out of file
descriptors, its name lookups failed, and agents were refused as
`unauthorized`.  Now operator.sock caps connections per peer uid
(`operators.max_connections_per_user`) and in total before it reads a byte or
looks up a name, the approval unit's `LimitNOFILE=` fits the caps, and a
failed lookup is `identity_unavailable`, never `unauthorized`.

The attack runs as a real throwaway observer user against a live stack whose
approval service gets the unit's own `LimitNOFILE=` (prlimit).  With the caps
the flood (kept up: every closed connection is opened again) is refused
(`busy`) past the cap while another operator and an agent are served.
Control: the same flood with the caps raised out of the way is not refused,
holds nearly every descriptor approval may have, and makes its name lookups
fail (answered `identity_unavailable`; before the fix such a peer was judged
as a nameless stranger: `unauthorized`).
"""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import as_user, needs_root, red_stack, throwaway_user

from support import Stack

pytestmark = needs_root

UNIT = Path(__file__).resolve().parents[2] / "units" / "airlock-approval.service"
FLOOD = 2600  # more connections than the unit's LimitNOFILE allows descriptors

# Run as the observer with the system python: open FLOOD connections to operator.sock
# (a full backlog is retried until the server has accepted nothing for 3 s), read what
# each says, report; then keep FLOOD connections open (each one the server closes is
# opened again, as an attacker would) until stdin closes.
_FLOOD = r"""
import json, selectors, socket, sys, threading, time
path, count = sys.argv[1], int(sys.argv[2])
sel = selectors.DefaultSelector()
stop = threading.Event()
reasons, state = {}, {"open": 0, "closed": 0}

def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect(path)
    except OSError:  # the backlog is full: the server is not accepting (for now)
        s.close()
        return False
    sel.register(s, selectors.EVENT_READ, bytearray())
    state["open"] += 1
    return True

def pump(timeout):
    for key, _ in sel.select(timeout):
        try:
            chunk = key.fileobj.recv(4096)
        except OSError:
            chunk = b""
        if chunk:
            key.data.extend(chunk)
            continue
        sel.unregister(key.fileobj)
        key.fileobj.close()
        state["open"] -= 1
        state["closed"] += 1
        for line in bytes(key.data).splitlines():
            error = json.loads(line).get("error") or {}
            reason = error.get("details", {}).get("reason") or error.get("code")
            reasons[reason] = reasons.get(reason, 0) + 1
        yield key

made, progress = 0, time.monotonic()
while made < count and time.monotonic() - progress < 3:
    if connect():
        made, progress = made + 1, time.monotonic()
    else:
        time.sleep(0.002)
    for _ in pump(0):
        pass
quiet = time.monotonic()
while time.monotonic() - quiet < 3:
    for _ in pump(0.5):
        quiet = time.monotonic()
print(json.dumps({"connected": made, "refused_connect": count - made, "busy": reasons.get("busy", 0),
                  "closed": state["closed"], "held": state["open"], "reasons": reasons}), flush=True)
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
while not stop.is_set():
    for _ in pump(0.01):
        pass
    while state["open"] < count and connect():
        pass
"""


def unit_nofile() -> int:
    found = re.search(r"^LimitNOFILE=(\d+)$", UNIT.read_text(), re.MULTILINE)
    assert found, "units/airlock-approval.service sets no LimitNOFILE="
    return int(found.group(1))


def config(observer: str, extra: str = "") -> str:
    return (
        f"operators:\n  observers: {{users: [{observer}], groups: []}}\n{extra}"
        # Held connections stay held for the length of the test (no read timeout frees them).
        "limits: {read_timeout_seconds: 120, request_timeout_seconds: 240}\n"
        "policy:\n  default: deny\n  rules:\n"
        "    - {name: run-true, decision: allow, privileged: false, commands: [[/usr/bin/true]]}\n"
    )


def operator_status(stack: Stack, timeout: float) -> dict[str, Any] | str:
    """root's `status` on operator.sock, or what went wrong (a timeout is starvation)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(stack.operator)
            sock.sendall(json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": "status", "args": {}}).encode() + b"\n")
            line = sock.makefile("rb").readline()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    if not line:
        return "closed without a reply"
    reply: dict[str, Any] = json.loads(line)
    return reply


def agent_true(stack: Stack, timeout: float) -> dict[str, Any] | str:
    body = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "argv": ["/usr/bin/true"], "privileged": False}
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(stack.agent)
            sock.sendall(json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": "exec", "args": body}).encode() + b"\n")
            line = sock.makefile("rb").readline()
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"
    reply: dict[str, Any] = json.loads(line) if line else {}
    return reply or "closed without a reply"


class Flood:
    def __init__(self, stack: Stack, observer: Any) -> None:
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", _FLOOD, stack.operator, str(FLOOD)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **as_user(observer),
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, self.proc.stderr.read() if self.proc.stderr else ""
        self.report: dict[str, Any] = json.loads(line)

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


@pytest.fixture
def observer() -> Iterator[Any]:
    with throwaway_user("alflood") as user:
        yield user


def live_approval(stack: Stack) -> int:
    """approval's pid, limited to the unit's LimitNOFILE= as systemd would."""
    assert operator_status(stack, 10) != "", "approval did not answer"
    pid = stack.service_pid("approval")
    _soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (unit_nofile(), max(hard, unit_nofile())))
    return pid


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_an_observers_flood_is_capped_and_others_are_served(observer: Any) -> None:
    with red_stack(config(observer.pw_name)) as stack:
        os.chmod(stack.operator, 0o666)  # the socket unit's mode is not what is tested here
        approval = live_approval(stack)
        flood = Flood(stack, observer)
        try:
            report = flood.report
            # The cap refused the flood, at once, past a quarter of operators.max_connections (16).
            assert report["held"] <= 16, report
            assert report["busy"] >= FLOOD - 16 - report["refused_connect"] - 200, report
            assert open_fds(approval) < unit_nofile() // 2
            # Another operator and an agent are served while the observer holds its share.
            status = operator_status(stack, 10)
            assert isinstance(status, dict) and status.get("ok") is True, status
            ran = agent_true(stack, 30)
            assert isinstance(ran, dict) and ran.get("ok") is True, ran
        finally:
            flood.stop()
        log = (stack.runtime_dir / "logs" / "approval.log").read_text(errors="replace")
        assert "approval.peer.capped" in log and "approval.peer.unidentified" not in log


def test_control_without_the_cap_the_flood_takes_approvals_descriptors(observer: Any) -> None:
    """The same flood with the caps out of the way: nothing is refused as busy, the observer holds
    (nearly) every descriptor approval may have, and name lookups fail under it (answered
    identity_unavailable, never unauthorized): the starvation the caps prevent."""
    uncapped = "  max_connections: 100000\n  max_connections_per_user: 100000\n"
    text = config(observer.pw_name).replace("groups: []}\n", "groups: []}\n" + uncapped, 1)
    with red_stack(text) as stack:
        os.chmod(stack.operator, 0o666)
        approval = live_approval(stack)
        flood = Flood(stack, observer)
        try:
            report = flood.report
            assert report["busy"] == 0 and report["held"] >= unit_nofile() // 2, report
            # The flood is kept up: approval's descriptors fill up (nearly) to the unit's limit.
            deadline = time.monotonic() + 30
            while open_fds(approval) < unit_nofile() - 150:
                assert time.monotonic() < deadline, open_fds(approval)
                time.sleep(0.1)
            assert report["reasons"].get("identity_unavailable", 0) > 0, report
            assert "unauthorized" not in report["reasons"], report
        finally:
            flood.stop()
        log = (stack.runtime_dir / "logs" / "approval.log").read_text(errors="replace")
        assert "approval.peer.unidentified" in log and "approval.peer.capped" not in log

"""Test support: a real airlock stack (`airlock dev up`) on temporary sockets.

A module of its own, not conftest.py, so that test files can import it by a
name no other conftest.py shadows.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from waits import until, wait_service_replaced
from waits import wait_pending as wait_pending  # re-exported: the files that import it from here

REPO = Path(__file__).resolve().parent.parent


def now_iso(offset: float = 0.0) -> str:
    return datetime.fromtimestamp(time.time() + offset, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class Stack:
    runtime_dir: Path
    proc: subprocess.Popen[str]
    web: str | None = None  # airlock-web's web.url when started with web= (dev up --web)
    web_listen: str | None = None  # where it listens (HOST:PORT): web.url may name a proxy in front

    @property
    def agent(self) -> str:
        return str(self.runtime_dir / "agent.sock")

    @property
    def operator(self) -> str:
        return str(self.runtime_dir / "operator.sock")

    @property
    def database(self) -> Path:
        return self.runtime_dir / "state" / "journal.sqlite"

    def send_raw(
        self, data: bytes, *, path: str | None = None, shutdown: bool = True, timeout: float = 30
    ) -> list[dict[str, Any]]:
        """Write raw bytes to a socket and return every JSON line it answers."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(path or self.agent)
            sock.sendall(data)
            if shutdown:
                sock.shutdown(socket.SHUT_WR)
            buf = b""
            while True:
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                buf += chunk
        return [json.loads(line) for line in buf.splitlines() if line.strip()]

    def native(
        self, verb: str, args: dict[str, Any] | None = None, *, path: str | None = None, **envelope: Any
    ) -> dict[str, Any]:
        """One native request; returns the final response (events are skipped)."""
        request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args or {}, "token": None} | envelope
        replies = self.send_raw(json.dumps(request).encode() + b"\n", path=path)
        finals = [r for r in replies if "event" not in r]
        assert len(finals) == 1, replies
        return finals[0]

    def exec(self, args: dict[str, Any], **envelope: Any) -> dict[str, Any]:
        return self.native("exec", {"time": now_iso()} | args, **envelope)

    def cli(
        self, *argv: str, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        environ = (
            dict(os.environ) | {"AIRLOCK_SOCKET": self.agent, "AIRLOCK_OPERATOR_SOCKET": self.operator} | (env or {})
        )
        return subprocess.run(
            [sys.executable, "-m", "airlock", *argv], capture_output=True, text=True, timeout=timeout, env=environ
        )

    def find_service_pid(self, name: str) -> int | None:
        """The pid of one service (intake, approval, runner, journal, exectree) under this stack's `dev up`."""
        # `python -m airlock.entry NAME` (cli/dev.py); airlock.runner.exectree and airlock.NAME before it.
        found = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid), "-f", f"airlock\\.(entry |runner\\.)?{name}( |$)"],
            capture_output=True,
            text=True,
        ).stdout.split()
        return int(found[0]) if found else None

    def service_pid(self, name: str) -> int:
        """The pid of one of the stack's services (``intake``, ``journal``, ...)."""
        pid = self.find_service_pid(name)
        assert pid is not None, f"no {name} service under pid {self.proc.pid}"
        return pid

    def kill_service(self, name: str, *, timeout: float = 30) -> int:
        """SIGKILL one service and wait until `dev up` has started it again.

        Returns the new pid.  The socket stays bound by the supervisor, so a
        connection made meanwhile queues for the new instance.
        """
        old = self.service_pid(name)
        os.kill(old, signal.SIGKILL)
        return wait_service_replaced(self, name, old, timeout)

    @contextlib.contextmanager
    def down(self, name: str) -> Iterator[None]:
        """Take one service away for real: killed, not restarted, its socket gone."""
        os.kill(self.proc.pid, signal.SIGSTOP)  # the supervisor must not start it again yet
        sock = self.runtime_dir / "internal" / f"{name}.sock"
        hidden = sock.with_name(f"{name}.sock.down")
        pid = self.service_pid(name)
        try:
            os.kill(pid, signal.SIGKILL)
            until(f"{name} (pid {pid}) dead", lambda: _dead(pid))
            sock.rename(hidden)
            yield
        finally:
            hidden.rename(sock)
            os.kill(self.proc.pid, signal.SIGCONT)
        # Back: a new instance, whose socket (bound by dev up all along) queues what comes meanwhile.
        wait_service_replaced(self, name, pid, timeout=20)

    def journal_rows(self) -> list[dict[str, Any]]:
        import sqlite3

        with contextlib.closing(sqlite3.connect(f"file:{self.database}?mode=ro", uri=True)) as conn:
            conn.row_factory = sqlite3.Row
            return [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY seq")]


def _dead(pid: int) -> bool:
    """Whether ``pid`` is gone or a zombie (killed, not yet reaped by dev up, which is stopped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def start_stack(runtime_dir: Path, config: Path | None = None, *, web: str | None = None) -> Stack:
    argv = [sys.executable, "-m", "airlock", "dev", "up", "--runtime-dir", str(runtime_dir)]
    if config is not None:
        argv += ["--config", str(config)]
    if web is not None:
        argv += ["--web", web]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if "ready" in line:
            words = dict(w.split("=", 1) for w in line.split() if "=" in w)
            return Stack(runtime_dir, proc, words.get("web"), words.get("web_listen"))
    proc.kill()
    logs = (
        "".join(p.read_text() for p in (runtime_dir / "logs").glob("*.log")) if (runtime_dir / "logs").exists() else ""
    )
    raise AssertionError(f"airlock dev up did not become ready:\n{''.join(seen)}\n{logs}")


def kill_running(stack: Stack) -> None:
    """SIGKILL every job still running, as an operator would (`airlock kill`); best effort.

    A stopping runner lets running jobs finish for up to
    services.stop_timeout_seconds (20 s): a test that leaves a ``sleep``
    behind would pay that at its stack's stop.
    """

    def operator(verb: str, args: dict[str, Any]) -> dict[str, Any]:
        request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args, "token": None}
        replies = stack.send_raw(json.dumps(request).encode() + b"\n", path=stack.operator, timeout=5)
        return replies[-1] if replies else {}

    with contextlib.suppress(OSError, ValueError):
        for job in (operator("running", {}).get("data") or {}).get("running", []):
            ref = f"{job['agent_uid']}/{job['request_id']}"
            operator("kill", {"ref": ref, "signal": "KILL", "reason": "the test's stack stops"})


def stop_stack(stack: Stack) -> None:
    if stack.proc.poll() is None:
        kill_running(stack)
        stack.proc.send_signal(signal.SIGTERM)
        try:
            stack.proc.wait(30)
        except subprocess.TimeoutExpired:
            stack.proc.kill()
            stack.proc.wait()


@contextlib.contextmanager
def custom_stack(runtime_dir: Path, config: str | None = None) -> Iterator[Stack]:
    """A stack on its own config text (written beside the runtime folder), stopped afterwards."""
    path = None
    if config is not None:
        path = runtime_dir.parent / f"{runtime_dir.name}.yaml"
        path.write_text(config, encoding="utf-8")
    s = start_stack(runtime_dir, path)
    try:
        yield s
    finally:
        stop_stack(s)


class Background:
    """An exec request sent on a thread; its final reply arrives in ``reply``."""

    def __init__(self, stack: Stack, args: dict[str, Any], **envelope: Any) -> None:
        self.request_id = envelope.pop("id", None) or f"bg-{uuid.uuid4()}"
        self.operation_id: str = args.get("operation_id") or f"op-{uuid.uuid4()}"
        self.reply: dict[str, Any] | None = None
        body = {"privileged": False, "operation_id": self.operation_id} | args

        def run() -> None:
            self.reply = stack.exec(body, id=self.request_id, **envelope)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def result(self, timeout: float = 30) -> dict[str, Any]:
        self.thread.join(timeout)
        assert self.reply is not None, "no reply in time"
        return self.reply

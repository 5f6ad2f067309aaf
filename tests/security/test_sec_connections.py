"""Connection slots cannot be held hostage (issue 16).

A client that asks for a large output and never reads its answer used to
hold its slot for ever (`drain()` without a bound), and one agent could take
every slot.  Now a client that does not take its bytes within
`limits.write_timeout_seconds` is disconnected (journaled as
`connection.dropped`), its finished outcome stays in the replay store, and
`limits.max_connections_per_agent` caps one peer uid at accept.

Controls: while the non-readers hold the slots, another client really is
refused (`busy`), so the later success is the timeout's doing; and a second
user is served while the first is at its cap.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from secsupport import needs_root, throwaway_user

from support import Stack, custom_stack, now_iso
from waits import wait_record

WRITE_TIMEOUT = 2.0
LINES = 300000  # `seq 300000`: about 2 MB of output, far more than a socket buffer holds

HOSTAGE = f"""
limits:
  max_connections: 2
  max_connections_per_agent: 2
  write_timeout_seconds: {WRITE_TIMEOUT}
policy:
  default: deny
  rules:
    - name: seq
      decision: allow
      privileged: false
      commands: [[/usr/bin/seq, "..."], [/usr/bin/sleep, "..."]]
"""

CAPPED = """
agents:
  users: []
  groups: []
limits:
  max_connections: 8
  max_connections_per_agent: 1
policy:
  default: deny
  rules:
    - name: sleep
      decision: allow
      privileged: false
      commands: [[/usr/bin/sleep, "..."]]
"""


def exec_line(argv: list[str], op: str) -> bytes:
    body = {"time": now_iso(), "argv": argv, "privileged": False, "operation_id": op}
    return json.dumps({"v": 1, "id": f"c-{uuid.uuid4()}", "verb": "exec", "args": body}).encode() + b"\n"


def ping(stack: Stack) -> dict[str, Any]:
    """A ping on a fresh connection; the reply is read at once (busy comes before reading)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(10)
        sock.connect(stack.agent)
        try:
            sock.sendall(json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": "ping", "args": {}}).encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed before our line: the refusal is there to read
        reply: dict[str, Any] = json.loads(sock.makefile("rb").readline())
        return reply


def code(reply: dict[str, Any]) -> str | None:
    return (reply.get("error") or {}).get("code") if reply.get("ok") is False else None


def dropped_rows(stack: Stack) -> list[dict[str, Any]]:
    return [json.loads(r["payload"]) for r in stack.journal_rows() if r["kind"] == "connection.dropped"]


@pytest.fixture(scope="module")
def hostage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("wt")), HOSTAGE) as s:
        yield s


def test_clients_that_never_read_are_dropped_and_the_work_is_kept(hostage: Stack) -> None:
    ops = [f"op-{uuid.uuid4()}" for _ in range(2)]
    held = []
    try:
        for op in ops:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(hostage.agent)
            sock.sendall(exec_line(["seq", str(LINES)], op))
            held.append(sock)  # ... and never read
        # Control: both slots are taken, a third client is refused.
        deadline = time.monotonic() + 10
        while code(refused := ping(hostage)) != "busy":
            assert time.monotonic() < deadline, refused
            time.sleep(0.05)
        started = time.monotonic()
        deadline = started + WRITE_TIMEOUT + 60  # the job, the timeout, and a loaded machine
        while code(reply := ping(hostage)) == "busy":
            assert time.monotonic() < deadline, "the non-reading clients were never dropped"
            time.sleep(0.1)
        assert reply["ok"] is True, reply
        while len(dropped_rows(hostage)) < 2:
            assert time.monotonic() < deadline, "the second non-reading client was never dropped"
            time.sleep(0.1)
        # The dropped clients find their connection closed short of the reply.
        for sock in held:
            sock.settimeout(10)
            got = b""
            try:
                while chunk := sock.recv(1 << 20):
                    got += chunk
            except ConnectionResetError:
                pass
            assert not got.endswith(b"\n")  # never the whole reply line
    finally:
        for sock in held:
            sock.close()
    dropped = dropped_rows(hostage)
    assert len(dropped) == 2 and {d["reason"] for d in dropped} == {"write_timeout"}, dropped
    # The work was not affected: a retry with the same operation ID gets its outcome.
    expected = "".join(f"{n}\n" for n in range(1, LINES + 1)).encode()
    for op in ops:
        again = hostage.exec({"argv": ["seq", str(LINES)], "privileged": False, "operation_id": op})
        assert again["ok"] is True and again["data"]["replay"] is True, code(again)
        # Output this large is kept for replay by its digest (intake's REPLAY_OUTPUT_LIMIT).
        assert again["data"]["stages"][0]["exit_code"] == 0
        assert again["data"]["stdout_sha256"] == hashlib.sha256(expected).hexdigest()


def test_one_agent_cannot_take_every_slot(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir()
    with custom_stack(runtime, CAPPED) as capped:
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            first.connect(capped.agent)
            op = f"op-{uuid.uuid4()}"
            first.sendall(exec_line(["sleep", "5"], op))
            wait_record(capped, "exec.started", operation_id=op)  # the first connection is in flight
            second = ping(capped)
            assert code(second) == "busy", second
            assert "this user" in second["error"]["message"]
        finally:
            first.close()
        deadline = time.monotonic() + 20
        while code(reply := ping(capped)) == "busy":
            assert time.monotonic() < deadline, reply
            time.sleep(0.1)
        assert reply["ok"] is True


@needs_root
def test_another_agent_is_served_while_one_is_at_its_cap(tmp_path: Path) -> None:
    runtime = tmp_path / "rt"
    runtime.mkdir()
    with custom_stack(runtime, CAPPED) as capped, throwaway_user() as other:
        os.chmod(capped.agent, 0o666)
        first = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            first.connect(capped.agent)
            op = f"op-{uuid.uuid4()}"
            first.sendall(exec_line(["sleep", "5"], op))
            wait_record(capped, "exec.started", operation_id=op)  # the first connection is in flight
            assert code(ping(capped)) == "busy"  # the first agent is at its cap ...
            reply = ping_as(capped, other.pw_uid, other.pw_gid)
            assert reply.get("ok") is True, reply  # ... and the other is served
        finally:
            first.close()


def ping_as(stack: Stack, uid: int, gid: int) -> dict[str, Any]:
    """A ping from another user (a forked child that drops to uid/gid after chdir)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_fd)
            os.chdir(stack.runtime_dir)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(10)
                s.connect("agent.sock")
                s.sendall(json.dumps({"v": 1, "id": str(uuid.uuid4()), "verb": "ping", "args": {}}).encode() + b"\n")
                os.write(write_fd, s.makefile("rb").readline())
        except BaseException as exc:
            os.write(write_fd, json.dumps({"child_error": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(write_fd)
    os.waitpid(pid, 0)
    with os.fdopen(read_fd, "rb") as pipe:
        found: dict[str, Any] = json.loads(pipe.read())
    return found

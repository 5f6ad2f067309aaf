"""Approved file operations through a real stack: as root, as a user, via an operator, under SIGKILL."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import REPO, Stack, now_iso, start_stack, stop_stack
from waits import until, wait_pending, wait_service_replaced

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="file operations as another user need root")

NOBODY = pwd.getpwnam("nobody").pw_uid


def config(data: Path) -> str:
    return f"""
agents:
  users: [root, nobody]
approval:
  timeout_seconds: 20
policy:
  default: ask
  rules:
    - name: dev-unprivileged
      decision: allow
      users: [root]
      privileged: false
    - name: nobody-files
      decision: allow
      users: [nobody]
      privileged: false
      files:
        - tools: [files_read, files_inspect, files_list, files_find, files_search, files_write, files_edit]
          paths: [{data}/...]
    - name: root-reads
      decision: allow
      privileged: true
      files:
        - tools: [files_read, files_inspect, files_list, files_find, files_search]
          paths: [{data}/...]
"""


@pytest.fixture(scope="module")
def fstack() -> Iterator[Stack]:
    # Not under pytest's 0700 tmp folder: nobody must reach the agent socket and the data.
    runtime = Path(tempfile.mkdtemp(prefix="alf", dir="/tmp"))
    os.chmod(runtime, 0o755)
    data = runtime / "data"
    data.mkdir()
    os.chmod(data, 0o755)
    cfg = runtime.parent / f"{runtime.name}.yaml"
    cfg.write_text(config(data))
    stack = start_stack(runtime, cfg)
    os.chmod(stack.agent, 0o666)  # let nobody in (agents.users still decides)
    try:
        yield stack
    finally:
        stop_stack(stack)
        shutil.rmtree(runtime, ignore_errors=True)
        cfg.unlink()


def data_dir(stack: Stack) -> Path:
    return stack.runtime_dir / "data"


def files_call(stack: Stack, verb: str, args: dict[str, Any], **envelope: Any) -> dict[str, Any]:
    return stack.native(verb, {"time": now_iso()} | args, **envelope)


_AS_USER = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while chunk := s.recv(1 << 20):
    buf += chunk
print(buf.decode().strip().splitlines()[-1])
"""


def as_nobody(stack: Stack, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    request = {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": {"time": now_iso()} | args}
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-c", _AS_USER, stack.agent, json.dumps(request)],
        user=NOBODY,
        group=65534,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    reply: dict[str, Any] = json.loads(out.stdout)
    return reply


def test_read_ranges_and_listings_as_root(fstack: Stack) -> None:
    target = data_dir(fstack) / "ranges.txt"
    target.write_bytes(b"0123456789")
    reply = files_call(fstack, "files_read", {"path": str(target), "offset_bytes": 2, "length_bytes": 5})
    assert reply["ok"] is True, reply
    data = reply["data"]
    assert data["ok"] is True and base64.b64decode(data["content"]) == b"23456"
    assert data["next_offset_bytes"] == 7 and data["uid"] == 0
    assert data["content_sha256"] == hashlib.sha256(b"23456").hexdigest()
    assert data["decision"]["rule"] == "root-reads"
    listing = files_call(fstack, "files_list", {"path": str(data_dir(fstack))})["data"]
    assert "ranges.txt" in [e["name"] for e in listing["entries"]]
    found = files_call(fstack, "files_search", {"path": str(data_dir(fstack)), "query": "345"})["data"]
    assert found["matches"][0]["path"] == str(target)


def test_outside_the_granted_tree_asks(fstack: Stack) -> None:
    # root-reads covers only the data tree: a read of /etc/hostname waits for an operator.
    request_id = str(uuid.uuid4())
    reply: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: reply.update(files_call(fstack, "files_read", {"path": "/etc/hostname"}, id=request_id))
    )
    thread.start()
    pending = wait_pending(fstack, request_id)
    assert pending["request"]["tool"] == "files_read" and pending["policy"]["rule"] == "default"
    assert fstack.native("deny", {"id": request_id}, path=fstack.operator)["ok"] is True
    thread.join(30)
    assert reply["ok"] is False and reply["error"]["code"] == "denied"


def test_as_a_user_permission_denied_is_an_error_outcome(fstack: Stack) -> None:
    secret = data_dir(fstack) / "root-only"
    secret.write_text("secret\n")
    os.chmod(secret, 0o600)
    reply = as_nobody(fstack, "files_read", {"path": str(secret), "privileged": False})
    assert reply["ok"] is True, reply
    assert reply["data"]["ok"] is False and reply["data"]["error"]["code"] == "permission_denied"
    assert reply["data"]["uid"] == NOBODY
    write = as_nobody(
        fstack, "files_write", {"path": str(data_dir(fstack) / "new"), "privileged": False, "content": ""}
    )
    assert write["data"]["error"]["code"] == "permission_denied"
    mine = data_dir(fstack) / "nobodys"
    mine.write_text("hello\n")
    os.chown(mine, NOBODY, 65534)
    read = as_nobody(fstack, "files_read", {"path": str(mine), "privileged": False})
    assert read["data"]["ok"] is True and base64.b64decode(read["data"]["content"]) == b"hello\n"
    # An atomic write needs the directory too (temp file, rename): a root-owned one refuses.
    edit = as_nobody(
        fstack, "files_edit", {"path": str(mine), "privileged": False, "old_text": "hello", "new_text": "bye"}
    )
    assert edit["data"]["error"]["code"] == "permission_denied" and mine.read_text() == "hello\n"
    home = data_dir(fstack) / "nobody-home"
    home.mkdir()
    os.chown(home, NOBODY, 65534)
    shutil.move(mine, home / "nobodys")
    mine = home / "nobodys"
    edit = as_nobody(
        fstack, "files_edit", {"path": str(mine), "privileged": False, "old_text": "hello", "new_text": "bye"}
    )
    assert edit["data"]["ok"] is True and mine.read_text() == "bye\n"
    assert (mine.stat().st_uid, mine.stat().st_gid) == (NOBODY, 65534)


def test_write_keeps_owner_and_mode_and_journals_hashes(fstack: Stack) -> None:
    target = data_dir(fstack) / "owned.conf"
    target.write_text("old\n")
    os.chown(target, NOBODY, 65534)
    os.chmod(target, 0o640)
    op = f"op-{uuid.uuid4().hex}"
    reply = files_call(
        fstack,
        "files_write",
        {"path": str(target), "privileged": False, "operation_id": op, "content": base64.b64encode(b"new\n").decode()},
    )
    assert reply["ok"] is True and reply["data"]["ok"] is True, reply
    st = target.stat()
    assert target.read_text() == "new\n" and (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (NOBODY, 65534, 0o640)
    finished = [
        json.loads(r["payload"])
        for r in fstack.journal_rows()
        if r["kind"] == "files.finished" and r["operation_id"] == op
    ]
    assert finished and finished[0]["before_sha256"] == hashlib.sha256(b"old\n").hexdigest()
    assert finished[0]["after_sha256"] == hashlib.sha256(b"new\n").hexdigest()
    assert "new\n" not in json.dumps(finished) and base64.b64encode(b"new\n").decode() not in json.dumps(finished)
    replay = files_call(
        fstack,
        "files_write",
        {"path": str(target), "privileged": False, "operation_id": op, "content": base64.b64encode(b"new\n").decode()},
    )
    assert replay["data"]["replay"] is True
    conflict = files_call(
        fstack,
        "files_write",
        {
            "path": str(target),
            "privileged": False,
            "operation_id": op,
            "content": base64.b64encode(b"other\n").decode(),
        },
    )
    assert conflict["error"]["code"] == "operation_id_conflict"


def test_an_edit_approved_by_an_operator_shows_its_diff(fstack: Stack) -> None:
    target = data_dir(fstack) / "nginx.conf"
    target.write_text("worker_processes 1;\nlisten 80;\n")
    request_id = str(uuid.uuid4())
    reply: dict[str, Any] = {}
    args = {"path": str(target), "old_text": "listen 80;", "new_text": "listen 8080;", "reason": "move the port"}
    thread = threading.Thread(target=lambda: reply.update(files_call(fstack, "files_edit", args, id=request_id)))
    thread.start()
    pending = wait_pending(fstack, request_id)
    diff = pending["request"]["diff"]
    assert "-listen 80;" in diff and "+listen 8080;" in diff and diff.startswith(f"--- {target}")
    assert target.read_text() == "worker_processes 1;\nlisten 80;\n"  # nothing written before approval
    cli = fstack.cli("pending")
    assert cli.returncode == 0 and "files_edit" in cli.stdout
    assert fstack.native("approve", {"id": request_id}, path=fstack.operator)["ok"] is True
    thread.join(30)
    assert reply["ok"] is True and reply["data"]["ok"] is True
    assert reply["data"]["decision"]["decided_by"] == "root"
    assert target.read_text() == "worker_processes 1;\nlisten 8080;\n"


def test_edit_without_exactly_one_match_changes_nothing(fstack: Stack) -> None:
    target = data_dir(fstack) / "twice.conf"
    target.write_text("a\na\n")
    for old, code in (("a", "ambiguous_match"), ("b", "no_match")):
        reply = files_call(
            fstack, "files_edit", {"path": str(target), "privileged": False, "old_text": old, "new_text": "c"}
        )
        assert reply["data"]["ok"] is False and reply["data"]["error"]["code"] == code
    assert target.read_text() == "a\na\n"


def _file_writers() -> list[str]:
    """The runner's file-operation jobs of this checkout now (one may outlive a killed runner)."""
    pattern = f"fileop_child.* {REPO / 'services'}$"
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def test_sigkill_of_the_runner_mid_write_leaves_old_or_new(fstack: Stack) -> None:
    target = data_dir(fstack) / "big.bin"
    old = b"O" * (700 * 1024)
    new = b"N" * (700 * 1024)
    for delay in (0.0, 0.02, 0.05, 0.1, 0.2):
        target.write_bytes(old)
        pid = fstack.service_pid("runner")
        args = {
            "path": str(target),
            "privileged": False,
            "content": base64.b64encode(new).decode(),
            "operation_id": f"op-{uuid.uuid4().hex}",
        }
        thread = threading.Thread(target=lambda a=args: files_call(fstack, "files_write", a))
        thread.start()
        time.sleep(delay)  # the behaviour under test: the kill lands at a different point of the write
        os.kill(pid, signal.SIGKILL)
        thread.join(60)
        # A writer that outlived the runner finishes its rename or not at all: look once it is gone.
        until("the killed runner's file writer gone", lambda: not _file_writers(), timeout=30)
        assert target.read_bytes() in (old, new)
        wait_service_replaced(fstack, "runner", pid)
    # And the stack still works after the restarts.
    reply = files_call(
        fstack, "files_write", {"path": str(target), "privileged": False, "content": base64.b64encode(b"done").decode()}
    )
    assert reply["data"]["ok"] is True and target.read_bytes() == b"done"


def test_gateway_filesystem_execute(fstack: Stack) -> None:
    target = data_dir(fstack) / "gw.txt"
    target.write_text("alpha\nbeta\n")
    lines = [
        {
            "id": "r",
            "method": "filesystem.execute",
            "params": {
                "operationId": f"op-{uuid.uuid4().hex}",
                "tool": "read",
                "arguments": {"path": str(target), "lengthBytes": 6},
            },
        },
        {
            "id": "e",
            "method": "filesystem.execute",
            "params": {"tool": "files_edit", "arguments": {"path": str(target), "oldText": "beta", "newText": "gamma"}},
        },
        {
            "id": "x",
            "method": "filesystem.execute",
            "params": {"tool": "files_edit", "arguments": {"path": str(target), "oldText": "zeta", "newText": "eta"}},
        },
        {"id": "bad", "method": "filesystem.execute", "params": {"tool": "chmod", "arguments": {"path": str(target)}}},
    ]
    out = subprocess.run(
        [sys.executable, "-m", "airlock", "gateway", "--stdio", "--socket", fstack.agent],
        input="".join(json.dumps(line) + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=60,
    )
    frames = [json.loads(line) for line in out.stdout.splitlines()]
    responses = {f["requestId"]: f for f in frames if f["type"] == "response"}
    read = responses["r"]["result"]
    assert read["ok"] is True and read["content"] == "alpha\n" and read["nextOffsetBytes"] == 6
    assert read["contentSha256"] == hashlib.sha256(b"alpha\n").hexdigest()
    assert any(f["type"] == "accepted" and f["requestId"] == "r" for f in frames)
    assert responses["e"]["result"]["ok"] is True and "+gamma" in responses["e"]["result"]["diff"]
    assert responses["x"]["ok"] is True and responses["x"]["result"]["error"]["code"] == "no_match"
    assert responses["bad"]["ok"] is False and responses["bad"]["error"]["code"] == "invalid_params"
    assert target.read_text() == "alpha\ngamma\n"

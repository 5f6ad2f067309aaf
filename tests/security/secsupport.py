"""Support for the red-team suite: throwaway Unix users and running code as them.

The attacks in tests/security/ are played by real, unprivileged users against
a live stack (`airlock dev up` run as root), so the kernel decides what the
agent can and cannot touch, exactly as on a server.  Users are created with
``useradd`` for one test and removed with their home afterwards.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import sqlite3
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Stack, now_iso, start_stack, stop_stack

needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="the red-team suite plays agents as real throwaway users: it needs root and useradd",
)


@contextlib.contextmanager
def throwaway_user(prefix: str = "alsec") -> Iterator[pwd.struct_passwd]:
    """A fresh user with a home directory, deleted (home included) afterwards."""
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", name], capture_output=True)
        subprocess.run(["userdel", "--remove", "--force", name], capture_output=True)


def as_user(user: pwd.struct_passwd, groups: list[int] | None = None) -> dict[str, Any]:
    """`subprocess` keyword arguments that run a child as ``user`` (never as root)."""
    return {
        "user": user.pw_uid,
        "group": user.pw_gid,
        "extra_groups": list(groups or []),
        "env": {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8"},
        "cwd": user.pw_dir,
    }


# --- a live stack the throwaway users can reach ------------------------------------

# Run as the agent with the system python (nothing of the test's venv): send one
# native request, read every line; on the named event, rename one path over
# another (the attack's move) before reading on.  Prints the lines as JSON.
_AGENT_CLIENT = r"""
import json, os, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(job["timeout"])
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf, out = b"", []
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    buf += chunk
    while b"\n" in buf:
        line, buf = buf.split(b"\n", 1)
        message = json.loads(line)
        out.append(message)
        if job.get("rename") and message.get("event") == job.get("on_event"):
            os.rename(*job["rename"])
print(json.dumps(out))
"""


def agent_request(
    socket_path: str,
    user: pwd.struct_passwd,
    verb: str,
    args: dict[str, Any],
    *,
    request_id: str | None = None,
    rename: tuple[str, str] | None = None,
    on_event: str = "approved",
    timeout: float = 60,
    groups: list[int] | None = None,
    token: str | None = None,
) -> subprocess.Popen[str]:
    """Start one request on agent.sock from a process of ``user``; `replies` collects it."""
    request: dict[str, Any] = {
        "v": 1,
        "id": request_id or str(uuid.uuid4()),
        "verb": verb,
        "args": {"time": now_iso()} | args,
    }
    if token is not None:
        request["token"] = token
    job = {"socket": socket_path, "request": request, "rename": rename, "on_event": on_event, "timeout": timeout}
    proc: subprocess.Popen[str] = subprocess.Popen(
        ["/usr/bin/python3", "-I", "-c", _AGENT_CLIENT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **as_user(user, groups),
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(job))
    proc.stdin.close()
    return proc


def replies(proc: subprocess.Popen[str], timeout: float = 90) -> list[dict[str, Any]]:
    assert proc.stdout is not None and proc.stderr is not None
    proc.wait(timeout)
    out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, err
    lines: list[dict[str, Any]] = json.loads(out)
    return lines


def final(lines: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [line for line in lines if "event" not in line]
    assert len(finals) == 1, lines
    return finals[0]


def agent_exec(socket_path: str, user: pwd.struct_passwd, args: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """One exec request as ``user``; returns the final reply."""
    return final(replies(agent_request(socket_path, user, "exec", args, **kwargs)))


def run_as(user: pwd.struct_passwd, *argv: str) -> subprocess.CompletedProcess[str]:
    done: subprocess.CompletedProcess[str] = subprocess.run(
        list(argv), capture_output=True, text=True, check=True, **as_user(user)
    )
    return done


@contextlib.contextmanager
def red_stack(config: str, *, web: str | None = None) -> Iterator[Stack]:
    """A live `airlock dev up` (as root) whose agent socket the throwaway users can reach.

    Not under pytest's 0700 tmp folder; ``agents.users`` in ``config`` still
    decides who is served.  ``web``: airlock-web too, listening there (dev up --web).
    """
    runtime = Path(tempfile.mkdtemp(prefix="alsec", dir="/tmp"))
    os.chmod(runtime, 0o755)
    cfg = runtime.parent / f"{runtime.name}.yaml"
    cfg.write_text(config, encoding="utf-8")
    stack = start_stack(runtime, cfg, web=web)
    os.chmod(stack.agent, 0o666)
    try:
        yield stack
    finally:
        stop_stack(stack)
        shutil.rmtree(runtime, ignore_errors=True)
        cfg.unlink()


def root_dir() -> Path:
    """A directory only root may write in (where a payload run as root leaves its mark)."""
    path = Path(tempfile.mkdtemp(prefix="alsec-root", dir="/tmp"))
    os.chmod(path, 0o755)
    return path


def forge_record(db: Path, kind: str, payload: dict[str, Any]) -> int:
    """As root on a stopped journal: append a correctly linked and hashed record "written by the journal"
    (its triggers dropped first, as an attacker would); its seq."""
    from airlock.common.codec import canonical_json
    from airlock.journal.chain import compute_hash

    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        conn.row_factory = sqlite3.Row
        head = dict(conn.execute("SELECT * FROM events ORDER BY seq DESC LIMIT 1").fetchone())
        ids = {"request_id": None, "operation_id": None, "peer_uid": None, "session": None}
        record: dict[str, Any] = {"seq": head["seq"] + 1, "time": head["time"], "kind": kind, **ids}
        record |= {"writer": "journal", "payload": payload, "prev_hash": head["hash"]}
        columns = ("seq", "time", "kind", "request_id", "operation_id", "peer_uid", "session", "writer")
        conn.execute(
            "INSERT INTO events VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (*(record[k] for k in columns), canonical_json(payload).decode(), head["hash"], compute_hash(record)),
        )
        conn.execute("UPDATE chain_high SET seq = ?", (record["seq"],))
        return int(record["seq"])
    finally:
        conn.close()

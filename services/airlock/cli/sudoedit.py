"""`sudoedit FILE…` / `sudo -e` for agent accounts (issue 48): airlock's approved file operations, sudoedit's way.

As sudoedit does: each file is read as root (``files_read``) into a private
copy the agent owns, edited there as the agent (``$SUDO_EDITOR``, ``$VISUAL``,
``$EDITOR``, else ``vi``; or the new content given on stdin, the way an agent
without a terminal writes it), and written back only if it changed, by the
runner (``files_write`` with the content bound and ``expected_sha256`` the
content read: a file changed meanwhile is not overwritten).  The person who
approves sees the diff (approval's file preview).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import subprocess
import sys
import tempfile
from typing import Any

from airlock.cli.sudoargs import Invocation, Refusal
from airlock.cli.sudostdin import read_stdin
from airlock.cli.waiting import waiting_message
from airlock.common import client, render
from airlock.common.codec import iso_utc

MAX_FILE = 1024 * 1024  # files_read's most in one read: sudoedit here edits files up to this size


def edit(inv: Invocation, base: dict[str, Any]) -> int:
    """Edit each file of the line; 0 if every one was written (or unchanged), else 1."""
    if not base.get("privileged", True):
        raise Refusal("sudoedit as yourself: edit your own files directly")
    if base.get("user"):
        raise Refusal(f"sudoedit -u {base['user']}: airlock's file operations run as root; drop -u")
    envelope: dict[str, Any] = {k: base[k] for k in ("privileged", "reason", "session", "time") if k in base}
    piped = None
    if not os.isatty(0):
        piped = read_stdin()
    if piped is not None and len(inv.command) != 1:
        raise Refusal("new content on standard input is for one file; give one file, or edit each on its own")
    status = 0
    for path in inv.command:
        if not path.startswith("/"):
            path = os.path.join(os.getcwd(), path)
        status |= _edit_one(path, envelope, piped)
    return status


def _call(verb: str, args: dict[str, Any]) -> dict[str, Any]:
    def on_event(_raw: bytes, event: dict[str, Any]) -> None:
        if event.get("event") == "pending_approval":
            print(f"sudoedit: {waiting_message(event)}", file=sys.stderr)

    try:
        _raw, reply = client.call(
            client.agent_socket(None),
            verb,
            args | {"time": iso_utc()},  # fresh: an edit may take longer than a request stays fresh
            token=os.environ.get("AIRLOCK_TOKEN") or None,
            on_event=on_event,
        )
    except client.ClientError as exc:
        raise Refusal(f"airlock is unreachable: {exc}") from None
    return reply


def _edit_one(path: str, envelope: dict[str, Any], piped: bytes | None) -> int:
    shown = render.sanitise(path)
    reply = _call("files_read", envelope | {"path": path})
    data = reply.get("data") or {}
    # A refusal (reply) or the operation's own failure (data, as the runner saw the file).
    error = (reply.get("error") or {}) if not reply.get("ok") else (data.get("error") or {})
    before: bytes | None = None  # no such file: a new one, as sudoedit creates it
    if error and error.get("code") != "not_found":
        return _say(f"{shown}: {error.get('code')}: {render.sanitise(error.get('message'))}")
    if not error:
        if not data.get("eof", True):
            return _say(f"{shown}: larger than {MAX_FILE // 1024} KiB; sudoedit through airlock edits smaller files")
        before = base64.b64decode(data.get("content") or "")
    after = piped if piped is not None else _in_editor(path, before or b"")
    if after is None:
        return 1
    if after == (before or b""):
        print(f"sudoedit: {shown} unchanged", file=sys.stderr)
        return 0
    write = envelope | {"path": path, "content": base64.b64encode(after).decode()}
    if before is not None:
        write["expected_sha256"] = hashlib.sha256(before).hexdigest()
    reply = _call("files_write", write)
    if not reply.get("ok"):
        error = reply.get("error") or {}
        return _say(f"{shown} left unchanged: {error.get('code')}: {render.sanitise(error.get('message'))}")
    data = reply.get("data") or {}
    if data.get("error"):
        return _say(f"{shown} left unchanged: {render.sanitise((data.get('error') or {}).get('message'))}")
    return 0


def _in_editor(path: str, content: bytes) -> bytes | None:
    """The agent's edit of a private copy (sudoedit's temporary file), or None if the editor failed."""
    editor = os.environ.get("SUDO_EDITOR") or os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory(prefix="sudoedit.") as folder:
        copy = os.path.join(folder, os.path.basename(path) or "file")
        with open(copy, "wb") as f:
            f.write(content)
        try:
            # The agent's own editor, as the agent (sudoedit's point): nothing here runs with privilege.
            done = subprocess.run([*shlex.split(editor), copy], check=False)  # noqa: S603
        except (OSError, ValueError) as exc:
            _say(f"{render.sanitise(editor)}: {exc}")
            return None
        if done.returncode != 0:
            _say(f"{render.sanitise(editor)} exited with status {done.returncode}; {render.sanitise(path)} unchanged")
            return None
        with open(copy, "rb") as f:
            return f.read()


def _say(message: str) -> int:
    print(f"sudoedit: {message}", file=sys.stderr)
    return 1

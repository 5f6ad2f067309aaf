"""Red team (issue 36): runner.sock serves each verb to the callers its declaration names, and no one else.

* **Attack.** A compromised intake (its own account, not root) asks the root
  runner for ``files_preview`` of a write to a 0600 root file: the preview
  runs as root and its diff spells out the file's content.  Before issue 36
  the runner admitted intake's uid to every verb on the socket and
  ``files_preview`` checked no caller, so intake read any file on the host.
  Now the verb is approval's only (wire/runner.py), and intake gets
  ``unauthorized``; nothing is read.
* **Control.** The same request from approval's account (root, here) gets the
  diff with the secret in it: the refusal is about who asks, not what.
  And intake still reaches its own verbs (``cancel`` answers ``not_found``).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from secsupport import as_user, needs_root, throwaway_user

from support import custom_stack

pytestmark = needs_root

_CLIENT = r"""
import json, socket, sys
job = json.load(sys.stdin)
s = socket.socket(socket.AF_UNIX)
s.settimeout(30)
s.connect(job["socket"])
s.sendall(json.dumps(job["request"]).encode() + b"\n")
s.shutdown(socket.SHUT_WR)
buf = b""
while chunk := s.recv(1 << 16):
    buf += chunk
print(json.dumps([json.loads(line) for line in buf.splitlines() if line.strip()]))
"""


def _ask(sock: Path, verb: str, args: dict[str, Any], user: pwd.struct_passwd | None) -> dict[str, Any]:
    job = {"socket": str(sock), "request": {"v": 1, "id": str(uuid.uuid4()), "verb": verb, "args": args}}
    done = subprocess.run(
        [sys.executable, "-I", "-c", _CLIENT],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        **(as_user(user) if user is not None else {}),
    )
    reply: dict[str, Any] = json.loads(done.stdout)[-1]
    return reply


def test_intake_cannot_preview_a_root_file_through_the_runner() -> None:
    secret = f"root-only-{secrets.token_hex(8)}"
    with throwaway_user("alrun") as intake, tempfile.TemporaryDirectory(prefix="alsec-runner", dir="/tmp") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        target = root / "shadow.conf"
        target.write_text(f"password = {secret}\n", encoding="utf-8")
        os.chmod(target, 0o600)
        runtime = root / "stack"
        runtime.mkdir()
        os.chmod(runtime, 0o755)
        # The runner takes this account for intake (approval stays the dev stack's, root).
        config = f"services:\n  intake_user: {intake.pw_name}\n"
        with custom_stack(runtime, config) as stack:
            sock = stack.runtime_dir / "internal" / "runner.sock"
            os.chmod(sock.parent, 0o755)
            os.chmod(sock, 0o666)  # the socket's mode is not what is tested: the runner's caller check is
            spec = {
                "kind": "files",
                "tool": "files_write",
                "path": str(target),
                "privileged": True,
                "uid": intake.pw_uid,
                "params": {"content": "cGFzc3dvcmQgPSBjaGFuZ2VkCg=="},
            }
            refused = _ask(sock, "files_preview", {"spec": spec}, intake)
            assert refused["ok"] is False and refused["error"]["code"] == "unauthorized", refused
            assert secret not in json.dumps(refused)
            # Control: intake still reaches its own verbs (refused for what it names, not for who it is).
            own = _ask(sock, "cancel", {"operation_id": "op-none", "uid": intake.pw_uid}, intake)
            assert own["ok"] is False and own["error"]["code"] == "not_found", own
            # Control: approval's account gets the preview, and the diff spells the secret out.
            shown = _ask(sock, "files_preview", {"spec": spec}, None)
            assert shown["ok"] is True, shown
            assert secret in shown["data"]["outcome"]["diff"]

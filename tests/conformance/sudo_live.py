"""A live stack, an agent account with no sudo rights, and airlock's `sudo` first on its PATH (issue 48).

The agent is a real throwaway user (tests/security's `throwaway_user`): the
kernel decides what it can touch, so a file a `sudo` line wrote in a folder
only root may write proves the job ran as root.  Its `sudo` is the packaged
front (packaging/debian/agent-sudo) with this tree's code, run by Debian's
python3 -I as the package runs it, found on PATH as an agent's shell finds it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "security"))

from secsupport import needs_root, red_stack, throwaway_user

from support import REPO, Stack

__all__ = ["Agent", "needs_root", "sudo_agent"]

POLICY = """
approval:
  timeout_seconds: 30
limits:
  freshness_seconds: 3  # short, so a line whose request would go stale shows it (slow stdin, a long edit)
agents:
  users: [{user}]
  retry_window_seconds: {window}
policy:
  default: ask
  rules:
    - name: look
      decision: allow
      commands:
        - [/usr/bin/id, "..."]
        - [/usr/bin/whoami]
        - [/usr/bin/cat, "..."]
        - [/usr/bin/ls, "..."]
        - [/usr/bin/true]
        - [/usr/bin/false]
        - [/usr/bin/echo, "..."]
        - [/usr/bin/env]
        - [/usr/bin/printenv, "..."]
        - [/usr/bin/pwd]
        - [/usr/bin/head, "..."]
        - [/usr/bin/tail, "..."]
        - [/usr/bin/wc, "..."]
        - [/usr/bin/stat, "..."]
        - [/usr/bin/test, "..."]
        - [/usr/bin/dpkg-query, "..."]
        - [/usr/bin/apt-cache, "..."]
        - [/usr/bin/grep, "..."]
        - [/usr/bin/sort, "..."]
        - [/usr/bin/sleep, "..."]
    - name: app-files
      decision: allow
      commands:
        - [/usr/bin/tee, "..."]
        - [/usr/bin/mkdir, "..."]
        - [/usr/bin/touch, "..."]
        - [/usr/bin/cp, "..."]
        - [/usr/bin/chmod, "..."]
        - [/usr/bin/chown, "..."]
        - [/usr/bin/sed, "..."]
        - [/usr/bin/install, "..."]
        - [/usr/bin/ln, "..."]
    - name: scripts
      decision: allow
      commands: [[/bin/sh, -c, "..."], [/usr/bin/sh, -c, "..."], [/usr/bin/bash, -c, "..."]]
    - name: service-accounts
      decision: allow
      run_as: [nobody, www-data]
      commands: [[/usr/bin/id, "..."], [/usr/bin/whoami], [/usr/bin/printenv, "..."], [/usr/bin/cat, "..."]]
    - name: read-files
      decision: allow
      files: [{{tools: [files_read], paths: ["{root}/..."]}}]
    - name: app-edits
      decision: allow
      files: [{{tools: [files_write], paths: ["{root}/allowed/..."]}}]
    - name: never
      decision: deny
      commands: [[/usr/bin/dd, "..."], [/usr/bin/shred, "..."], [/usr/bin/rm, -rf, "..."]]
"""


@dataclass
class Agent:
    """The agent account, its PATH with airlock's sudo first, a folder only root may write, and the stack."""

    user: pwd.struct_passwd
    bin: Path
    root_dir: Path
    stack: Stack

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": f"{self.bin}:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": self.user.pw_dir,
            "LANG": "C.UTF-8",
            "AIRLOCK_SOCKET": self.stack.agent,
            "ROOT": str(self.root_dir),
        } | extra

    def start(self, line: str, *, stdin: bytes | None = None, **extra: str) -> subprocess.Popen[bytes]:
        """``sh -c LINE`` as the agent's tool runs it (stdin: the bytes given, else /dev/null)."""
        return subprocess.Popen(
            ["/bin/sh", "-c", line],
            stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            user=self.user.pw_uid,
            group=self.user.pw_gid,
            extra_groups=[],
            env=self.env(**extra),
            cwd=self.user.pw_dir,
            start_new_session=True,
        )

    def run(self, line: str, *, stdin: bytes | None = None, timeout: float = 60, **extra: str) -> Ran:
        proc = self.start(line, stdin=stdin, **extra)
        out, err = proc.communicate(stdin, timeout=timeout)
        return Ran(proc.returncode, out.decode(), err.decode())

    def pending(self) -> list[dict[str, Any]]:
        done = self.stack.cli("pending", "--json")
        data = json.loads(done.stdout)
        return list((data.get("data") or data).get("pending") or [])

    def decide_next(self, verb: str, *, timeout: float = 30) -> dict[str, Any]:
        """Wait for one request pending, then approve or deny it as an operator; the pending entry."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            waiting = self.pending()
            if waiting:
                entry = waiting[0]
                done = self.stack.cli(verb, entry["request_id"], "--reason", "the test's operator")
                assert done.returncode == 0, done.stderr
                return entry
            time.sleep(0.1)
        raise AssertionError("no request became pending")

    def run_deciding(self, line: str, verb: str, *, stdin: bytes | None = None) -> tuple[Ran, dict[str, Any]]:
        """Run ``line`` while an operator approves (or denies) the one request it makes."""
        proc = self.start(line, stdin=stdin)
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.update(ran=proc.communicate(stdin, timeout=90)))
        thread.start()
        entry = self.decide_next(verb)
        thread.join(90)
        out, err = box["ran"]
        return Ran(proc.returncode, out.decode(), err.decode()), entry


@dataclass
class Ran:
    code: int
    out: str
    err: str


@contextlib.contextmanager
def sudo_agent(window: float = 600) -> Iterator[Agent]:
    """The whole set-up; everything it made is removed afterwards.  ``window``: agents.retry_window_seconds."""
    bin_dir = Path(tempfile.mkdtemp(prefix="alsudo-bin", dir="/tmp"))
    root_dir = Path(tempfile.mkdtemp(prefix="alsudo-root", dir="/tmp"))
    try:
        os.chmod(bin_dir, 0o755)
        os.chmod(root_dir, 0o755)  # root's alone: an agent cannot write here, only its root jobs can
        packaged = (REPO / "packaging" / "debian" / "agent-sudo").read_text()
        # The package's script, pointed at this tree instead of dist-packages.
        here = f"sys.path.insert(0, {str(REPO / 'services')!r})"
        script = packaged.replace('sys.path.append("/usr/lib/python3/dist-packages")', here)
        assert script != packaged
        (bin_dir / "sudo").write_text(script)
        os.chmod(bin_dir / "sudo", 0o755)
        os.symlink("sudo", bin_dir / "sudoedit")
        (root_dir / "allowed").mkdir(mode=0o755)
        with (
            throwaway_user("alsudo") as user,
            red_stack(POLICY.format(user=user.pw_name, root=root_dir, window=window)) as stack,
        ):
            yield Agent(user, bin_dir, root_dir, stack)
    finally:
        shutil.rmtree(bin_dir, ignore_errors=True)
        shutil.rmtree(root_dir, ignore_errors=True)

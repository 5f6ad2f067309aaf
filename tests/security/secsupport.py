"""Support for the red-team suite: throwaway Unix users and running code as them.

The attacks in tests/security/ are played by real, unprivileged users against
a live stack (`airlock dev up` run as root), so the kernel decides what the
agent can and cannot touch, exactly as on a server.  Users are created with
``useradd`` for one test and removed with their home afterwards.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
from collections.abc import Iterator

import pytest

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


def as_user(user: pwd.struct_passwd) -> dict[str, object]:
    """`subprocess` keyword arguments that run a child as ``user`` (never as root)."""
    return {
        "user": user.pw_uid,
        "group": user.pw_gid,
        "extra_groups": [],
        "env": {"PATH": "/usr/bin:/bin", "HOME": user.pw_dir, "LANG": "C.UTF-8"},
        "cwd": user.pw_dir,
    }

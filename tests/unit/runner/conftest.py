"""Fixtures for the runner's engine tests: real processes, real users."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator

import pytest

from airlock.runner.identity import resolve_identity

from runner_testlib import ScratchUser, needs_root


@pytest.fixture(scope="session")
def test_user() -> Iterator[ScratchUser]:
    """A throw-away user with its own primary group and one supplementary group."""
    needs_root()
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd")
    suffix = os.getpid()
    user, group = f"al-t-{suffix}", f"al-tsup-{suffix}"
    subprocess.run(["groupadd", group], check=True)
    try:
        subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--groups", group, "--shell", "/usr/sbin/nologin", user],
            check=True,
        )
        try:
            uid = pwd.getpwnam(user).pw_uid
            yield ScratchUser(resolve_identity(uid), grp.getgrnam(group).gr_gid, group)
        finally:
            subprocess.run(["userdel", user], check=False)
    finally:
        subprocess.run(["groupdel", group], check=False)


@pytest.fixture
def world_dir() -> Iterator[str]:
    """A temporary directory any user can enter (pytest's tmp_path is 0700 root)."""
    path = tempfile.mkdtemp(prefix="airlock-runner-test-")
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)

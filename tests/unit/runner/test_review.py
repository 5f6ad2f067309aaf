"""Issue 34: how the runner starts the reviewer -- its identity and its unit's sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common import binary
from airlock.common import config as cfg
from airlock.runner import exechelper, review, units


def settings(**approval: Any) -> cfg.Config:
    base = cfg.defaults()
    return dataclasses.replace(base, approval=dataclasses.replace(base.approval, **approval))


def test_never_root_and_never_a_missing_user() -> None:
    assert "root" in str(review.identity(settings(reviewer_user="root")))
    assert "root" in str(review.identity(settings(reviewer_user="0")))
    assert "no user" in str(review.identity(settings(reviewer_user="no-such-user-xyz")))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may start it as another user")
def test_nobody_is_a_reviewer_user() -> None:
    assert review.identity(settings(reviewer_user="nobody")) == (65534, 65534)


def test_the_unit_is_confined() -> None:
    st = os.stat("/usr/bin/true")
    props = {name: value for name, _, value in review.properties(settings(reviewer_command=("/r",)), 999, 999, st)}
    assert props["User"] == "999" and props["SupplementaryGroups"] == []
    assert props["NoNewPrivileges"] is True and props["CapabilityBoundingSet"] == 0
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] is True
    assert props["PrivateNetwork"] is True
    assert "-/run/airlock" in props["InaccessiblePaths"] and "-/etc/airlock" in props["InaccessiblePaths"]
    # Not the path: a job unit's exec helper, which runs /r only if it is still the file the runner checked.
    [(python, argv, _)] = props["ExecStart"]
    assert argv[:5] == [python, "-I", "-S", "-c", exechelper.HELPER]
    assert argv[5:] == ["/r", str(st.st_dev), str(st.st_ino), str(st.st_uid), str(st.st_mode & 0o7777), "-", "/r"]
    env = b"PATH=/usr/bin:/bin\0LANG=C.UTF-8"
    assert props["Environment"] == ["AIRLOCK_JOB_ENV=" + env.hex()]
    networked = review.properties(settings(reviewer_command=("/r",), reviewer_network=True), 999, 999, st)
    assert "PrivateNetwork" not in {name for name, _, _ in networked}


def test_nothing_runs_without_a_command_or_a_safe_program() -> None:
    assert asyncio.run(review.review(settings(), {}, systemd=False))["ran"] is False
    missing = settings(reviewer_command=("/nonexistent/reviewer",), reviewer_user="nobody")
    assert asyncio.run(review.review(missing, {}, systemd=False))["ran"] is False


class FakeUnit:
    """systemd stood in for by a plain child: the unit's ExecStart with the stdio fds it was given."""

    started: dict[str, subprocess.Popen[bytes]] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def start(cls, name: str, props: Any, stdio: tuple[int, int, int]) -> None:
        settings = dict((n, v) for n, _, v in props)
        (path, argv, _), *_ = settings["ExecStart"]
        env = dict(item.split("=", 1) for item in settings.get("Environment", []))
        cls.started[name] = subprocess.Popen(
            argv, executable=path, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2], env=env
        )

    async def wait(self) -> int:
        while (code := self.started[self.name].poll()) is None:
            await asyncio.sleep(0.01)
        return code

    async def kill(self, signum: int) -> None:
        self.started[self.name].send_signal(signum)

    async def release(self) -> None:
        self.started[self.name].wait()


@pytest.fixture
def fake_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(units, "_start", FakeUnit.start)
    monkeypatch.setattr(units, "StageService", FakeUnit)


def run_service(script: str, timeout: float = 5.0) -> dict[str, Any]:
    python = os.path.realpath("/usr/bin/python3")  # the helper, like open_binary, never follows a symlink
    config = settings(reviewer_command=(python, "-c", script), reviewer_timeout_seconds=timeout)

    async def go() -> dict[str, Any]:
        stdin = review._memfd(b'{"v": 1}\n')
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            return await review._as_service(config, (65534, 65534), stdin, deadline, os.stat(python))
        finally:
            os.close(stdin)

    return asyncio.run(go())


@pytest.mark.usefixtures("fake_systemd")
def test_the_unit_path_reads_the_answer_and_bounds_the_output() -> None:
    said = run_service("import sys; sys.stdin.read(); print('{\"decision\": \"allow\"}'); sys.stderr.write('e' * 9000)")
    assert (said["exit_code"], said["timed_out"], said["stdout"]) == (0, False, '{"decision": "allow"}\n')
    assert len(said["stderr"]) == review.MAX_STDERR
    flood = run_service("import sys; sys.stdout.write('x' * 100000)")
    assert flood["truncated"] is True and len(flood["stdout"]) == review.MAX_STDOUT


@pytest.mark.usefixtures("fake_systemd")
def test_the_unit_path_kills_at_the_deadline() -> None:
    said = run_service("import time; time.sleep(30)", timeout=0.5)
    assert said["timed_out"] is True and said["exit_code"] is None
    assert all(p.poll() is not None for p in FakeUnit.started.values())


# What runs is what the runner checked (the rules for code that runs as root: resolve once, then hold).
# The reviewer is swapped for another root-owned program right after the runner opened and checked it:
# on either path the checked one runs (the child) or nothing does (the unit's helper sees another file);
# before, both executed the path again and ran the swapped-in program.
GOOD = '#!/bin/sh\ncat > /dev/null; echo \'{"decision": "ask", "reason": "checked"}\'\n'
SWAPPED = '#!/bin/sh\ncat > /dev/null; echo \'{"decision": "allow", "reason": "swapped in"}\'\n'


@pytest.fixture
def swapped_after_the_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    folder = Path(tempfile.mkdtemp(prefix="alrv-swap", dir="/tmp"))  # one the reviewer's user can enter
    folder.chmod(0o755)
    for name, text in (("reviewer", GOOD), ("other", SWAPPED)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    opened = binary.open_binary

    def open_then_swap(path: str, *, trusted: bool) -> tuple[int, os.stat_result]:
        held = opened(path, trusted=trusted)
        os.rename(folder / "other", folder / "reviewer")  # the race, made certain
        return held

    monkeypatch.setattr(binary, "open_binary", open_then_swap)
    yield str(folder / "reviewer")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may start it as another user")
def test_the_child_runs_the_program_it_checked_not_one_swapped_in_after(swapped_after_the_check: str) -> None:
    config = settings(reviewer_command=(swapped_after_the_check,), reviewer_user="nobody")
    said = asyncio.run(review.review(config, {"v": 1}, systemd=False))
    assert said["exit_code"] == 0 and '"checked"' in said["stdout"], said
    # Control: the swap happened, and what now sits at the path would have said allow.
    assert "swapped in" in open(swapped_after_the_check).read()


@pytest.mark.skipif(os.geteuid() != 0, reason="the unit's helper checks the owner of a root-owned reviewer")
@pytest.mark.usefixtures("fake_systemd")
def test_the_unit_refuses_a_program_swapped_in_after_the_check(
    swapped_after_the_check: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(review, "systemd_is_running", lambda: True)
    config = settings(reviewer_command=(swapped_after_the_check,), reviewer_user="nobody")
    said = asyncio.run(review.review(config, {"v": 1}, systemd=True))
    assert said["exit_code"] == exechelper.HELPER_EXIT_CHANGED and said["stdout"] == "", said
    assert "is not the file the runner checked" in said["stderr"]
    assert "swapped in" in open(swapped_after_the_check).read()  # control: the swap happened

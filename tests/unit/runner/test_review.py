"""Issue 34: how the runner starts the reviewer -- its identity and its unit's sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
from typing import Any

import pytest

from airlock.common import config as cfg
from airlock.runner import review, units


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
    props = {name: value for name, _, value in review.properties(settings(reviewer_command=("/r",)), 999, 999)}
    assert props["User"] == "999" and props["SupplementaryGroups"] == []
    assert props["NoNewPrivileges"] is True and props["CapabilityBoundingSet"] == 0
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] is True
    assert props["PrivateNetwork"] is True
    assert "-/run/airlock" in props["InaccessiblePaths"] and "-/etc/airlock" in props["InaccessiblePaths"]
    assert props["ExecStart"] == [("/r", ["/r"], False)]
    networked = review.properties(settings(reviewer_command=("/r",), reviewer_network=True), 999, 999)
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
        (path, argv, _), *_ = dict((n, v) for n, _, v in props)["ExecStart"]
        cls.started[name] = subprocess.Popen(argv, executable=path, stdin=stdio[0], stdout=stdio[1], stderr=stdio[2])

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
    config = settings(reviewer_command=("/usr/bin/python3", "-c", script), reviewer_timeout_seconds=timeout)

    async def go() -> dict[str, Any]:
        stdin = review._memfd(b'{"v": 1}\n')
        try:
            deadline = asyncio.get_running_loop().time() + timeout
            return await review._as_service(config, (65534, 65534), stdin, deadline)
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

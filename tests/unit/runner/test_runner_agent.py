"""forward_agent: the socket comes from the requesting process, checked, never from the client."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.runner.agent import agent_socket
from airlock.runner.identity import Identity

from runner_testlib import me, needs_root

NOBODY = Identity(uid=65534, gid=65534, groups=(65534,), user="nobody", home="/nonexistent")


@contextmanager
def process(env: dict[str, str], cwd: str | None = None) -> Iterator[int]:
    """A peer process started with ``env``: its pid, while it runs."""
    proc = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin"} | env, cwd=cwd)
    try:
        # Popen can return while /proc/<pid>/environ still shows the environment
        # from before the exec (seen under load): wait until it is sleep's own.
        deadline = time.monotonic() + 10
        while b"PATH=/usr/bin:/bin\0" not in _environ(proc.pid):
            assert time.monotonic() < deadline, "the peer process never showed its environment"
            time.sleep(0.01)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read() + b"\0"
    except OSError:
        return b""


@pytest.fixture
def agent_sock(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "agent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind(path)
        yield path


def refused(pid: int, identity: Identity, *, uid: int | None = None) -> str:
    with pytest.raises(AirlockError) as err:
        agent_socket(pid, identity.uid if uid is None else uid, identity)
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS
    assert err.value.details == {"field": "forward_agent"}
    assert err.value.message.startswith("forward_agent: ")
    return err.value.message


def test_the_socket_comes_from_the_peer_process(agent_sock: str) -> None:
    with process({"SSH_AUTH_SOCK": agent_sock}) as pid:
        assert agent_socket(pid, os.geteuid(), me()) == agent_sock


def test_only_the_variable_itself_counts_and_no_agent_means_none(agent_sock: str) -> None:
    with process({"SSH_AUTH_SOCK_OLD": agent_sock, "X_SSH_AUTH_SOCK": agent_sock}) as pid:
        assert agent_socket(pid, os.geteuid(), me()) is None
    with process({"SSH_AUTH_SOCK": ""}) as pid:
        assert agent_socket(pid, os.geteuid(), me()) is None


def test_a_relative_path_is_refused(agent_sock: str) -> None:
    with process({"SSH_AUTH_SOCK": os.path.basename(agent_sock)}, cwd=os.path.dirname(agent_sock)) as pid:
        assert "not an absolute path" in refused(pid, me())


def test_the_path_must_be_a_socket_itself(agent_sock: str, tmp_path: Path) -> None:
    link, plain = tmp_path / "link", tmp_path / "plain"
    link.symlink_to(agent_sock)  # lstat: a symlink to a socket is not a socket
    plain.write_text("")
    for path in (link, plain):
        with process({"SSH_AUTH_SOCK": str(path)}) as pid:
            message = refused(pid, me())
            assert "is not a socket" in message and str(path) not in message  # the value stays out of messages
    with process({"SSH_AUTH_SOCK": str(tmp_path / "missing")}) as pid:
        assert "does not exist" in refused(pid, me())


def test_a_socket_owned_by_another_uid_is_refused(agent_sock: str) -> None:
    needs_root()  # to chown the socket to another user
    os.chown(agent_sock, NOBODY.uid, NOBODY.gid)
    with process({"SSH_AUTH_SOCK": agent_sock}) as pid:
        assert f"owned by uid {NOBODY.uid}, not by uid 0" in refused(pid, me())


def test_a_process_of_another_uid_is_refused(agent_sock: str) -> None:
    # The pid was the peer's at connect time; now it is someone else's (pid reuse).
    with process({"SSH_AUTH_SOCK": agent_sock}) as pid:
        assert "no longer belongs to uid 65534" in refused(pid, NOBODY)


def test_a_gone_process_is_refused(agent_sock: str) -> None:
    with process({"SSH_AUTH_SOCK": agent_sock}) as pid:
        pass
    assert "has gone" in refused(pid, me())


def test_the_job_must_run_as_the_peer(agent_sock: str) -> None:
    with process({"SSH_AUTH_SOCK": agent_sock}) as pid:
        assert "must run as the requesting user (uid 0), not uid 65534" in refused(pid, NOBODY, uid=0)

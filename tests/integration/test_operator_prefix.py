"""Issue 27: `airlock approve PREFIX` typed on a terminal shows the request it found and asks first;
the answer acts on that request's whole ID and --expect digest only."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import ask, stack_with, wait_pending

from support import REPO, Stack
from waits import wait_screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("px")))


class Terminal:
    """One airlock command in its own tmux server and pane (a real terminal on stdin and stdout)."""

    def __init__(self, stack: Stack, *argv: str) -> None:
        self.server = str(stack.runtime_dir / f"tmux-{uuid.uuid4().hex[:8]}.sock")
        command = (
            f"cd {REPO} && AIRLOCK_OPERATOR_SOCKET={stack.operator} PYTHONPATH={REPO / 'services'} "
            f"{sys.executable} -m airlock {' '.join(argv)}; echo exit=$?; sleep 30"
        )
        self.tmux("new-session", "-d", "-s", "t", "-x", "160", "-y", "50", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.server, *args], capture_output=True, text=True, check=True).stdout

    def wait_for(self, text: str, timeout: float = 15) -> str:
        return wait_screen(lambda: self.tmux("capture-pane", "-p", "-t", "t"), text, timeout=timeout)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.server, "kill-server"], capture_output=True)
        Path(self.server).unlink(missing_ok=True)


def test_a_prefix_on_a_terminal_is_shown_and_asked(ops: Stack) -> None:
    bg = ask(ops, ["echo", "prefix-approved"])
    term = Terminal(ops, "approve", bg.request_id[:10], "--reason", "read-it")
    try:
        screen = term.wait_for("? [y/N]")
        assert f"approve {bg.request_id}? [y/N]" in screen and "echo prefix-approved" in screen
        term.tmux("send-keys", "-t", "t", "y", "Enter")
        term.wait_for("exit=0")
    finally:
        term.close()
    assert bg.result()["ok"] is True


def test_no_answer_but_yes_decides_nothing(ops: Stack) -> None:
    bg = ask(ops)
    term = Terminal(ops, "deny", bg.request_id[:10])
    try:
        term.wait_for("? [y/N]")
        term.tmux("send-keys", "-t", "t", "n", "Enter")
        term.wait_for("nothing decided")
        term.wait_for("exit=1")
    finally:
        term.close()
    assert wait_pending(ops, bg.request_id)["request_id"] == bg.request_id  # still waiting
    assert ops.cli("deny", bg.request_id).returncode == 0
    assert bg.result()["error"]["code"] == "denied"

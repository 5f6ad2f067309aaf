"""Issue 8: `airlock watch` driven through a real terminal (tmux): y approves, other keys deny,
type-ahead is discarded, a decision made elsewhere is reported, and agent text is sanitised;
issue 35: running jobs are listed and k then a number kills one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from operator_support import Background, ask, stack_with, wait_pending

from support import REPO, Stack
from waits import wait_screen

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)")


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from stack_with(Path(tmp_path_factory.mktemp("wa")))


class Console:
    """One `airlock watch` in its own tmux server and pane."""

    def __init__(self, stack: Stack) -> None:
        # A private tmux server whose socket lives (and dies) with the test stack's folder.
        self.server = str(stack.runtime_dir / f"tmux-{uuid.uuid4().hex[:8]}.sock")
        command = (
            f"cd {REPO} && AIRLOCK_OPERATOR_SOCKET={stack.operator} PYTHONPATH={REPO / 'services'} "
            f"exec {sys.executable} -m airlock watch"
        )
        self.tmux("new-session", "-d", "-s", "watch", "-x", "160", "-y", "50", command)
        self.wait_for("airlock watch: no pending requests")

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.server, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "watch")

    def wait_for(self, text: str, timeout: float = 15) -> str:
        return wait_screen(self.screen, text, timeout=timeout)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "watch", *keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.server, "kill-server"], capture_output=True)
        Path(self.server).unlink(missing_ok=True)


@pytest.fixture
def console(ops: Stack) -> Iterator[Console]:
    c = Console(ops)
    try:
        yield c
    finally:
        c.close()


def test_y_approves_and_the_screen_shows_what_a_reviewer_needs(ops: Stack, console: Console) -> None:
    bg = ask(ops, ["sh", "-c", "echo watched"], reason="rotate logs", session="night-1", host="web7", env={"LANG": "C"})
    screen = console.wait_for("approve?")
    for text in (
        bg.request_id,
        "rotate logs",
        "night-1",
        "web7",
        "(unprivileged)",
        "sh -c 'echo watched'",
        "binary",
        "LANG",
        "left",
        "uid",
        "pid",
    ):
        assert text in screen, text
    if Path("/usr/bin/sh").is_symlink() or Path("/bin/sh").is_symlink():
        assert "(symlink)" in screen
    console.keys("y")
    console.wait_for("approved")
    assert bg.result()["ok"] is True


def test_n_denies_with_the_reason_typed_for_the_agent(ops: Stack, console: Console) -> None:
    bg = ask(ops)
    console.wait_for(bg.request_id)
    console.wait_for("approve?")
    console.keys("n")
    console.wait_for("reason for the agent")
    console.keys("not during the freeze", "Enter")
    console.wait_for("denied")
    error = bg.result()["error"]
    assert error["code"] == "denied" and error["message"].endswith(": not during the freeze"), error


@pytest.mark.parametrize("key", ["q", "Enter", "Space"])
def test_other_keys_decide_nothing(ops: Stack, console: Console, key: str) -> None:
    """Issue 32: Enter (any unlisted key) used to deny, and the agent read the reason 'airlock watch'."""
    bg = ask(ops)
    console.wait_for(bg.request_id)
    console.wait_for("approve?")
    console.keys(key)
    console.wait_for("that key decides nothing")
    assert wait_pending(ops, bg.request_id)["request_id"] == bg.request_id  # still waiting
    console.keys("n")
    console.wait_for("reason for the agent")
    console.keys("Enter")
    console.wait_for("denied")
    assert bg.result()["error"]["code"] == "denied"


def test_type_ahead_is_discarded(ops: Stack, console: Console) -> None:
    # Keys pressed while nothing is on screen must not answer the next request.
    console.keys("y", "y", "y")
    time.sleep(0.5)  # not a wait: the keys reach the console's terminal before the request does
    bg = ask(ops)
    console.wait_for("approve?")
    time.sleep(1.5)  # not a wait: a window in which a type-ahead y would approve (it must not)
    assert wait_pending(ops, bg.request_id)["request_id"] == bg.request_id  # still waiting: the y's were dropped
    console.keys("n")
    console.wait_for("reason for the agent")
    console.keys("Enter")
    assert bg.result()["error"]["code"] == "denied"


def test_two_consoles_first_decision_wins_the_other_sees_it(ops: Stack, console: Console) -> None:
    other = Console(ops)
    try:
        bg = ask(ops)
        console.wait_for("approve?")
        other.wait_for("approve?")
        console.keys("y")
        console.wait_for("approved")
        other.wait_for("decided elsewhere")
        assert bg.result()["ok"] is True
    finally:
        other.close()


def test_a_decision_from_the_cli_is_seen_by_the_console(ops: Stack, console: Console) -> None:
    bg = ask(ops)
    console.wait_for("approve?")
    assert ops.cli("deny", bg.request_id).returncode == 0
    console.wait_for("decided elsewhere")
    assert bg.result()["error"]["code"] == "denied"  # the CLI's decision, not the console's


def test_wide_characters_are_escaped_not_drawn(ops: Stack, console: Console) -> None:
    bg = Background(ops, {"argv": ["echo", "日本"], "reason": "wide 日本 text"})
    screen = console.wait_for("approve?")
    assert "日" not in screen
    assert "\\u65e5\\u672c" in screen
    console.keys("n")
    console.wait_for("reason for the agent")
    console.keys("Enter")
    assert bg.result()["error"]["code"] == "denied"


def test_shift_g_approves_with_a_grant_for_the_same_command(ops: Stack, console: Console, tmp_path: Path) -> None:
    marker = tmp_path / "granted-from-watch"
    bg = ask(ops, ["touch", str(marker)])
    console.wait_for("[G] approve + grant 30m")
    console.keys("G")
    console.wait_for("with grant g-")
    assert bg.result()["ok"] is True
    marker.unlink()
    # The same command again: no prompt, the grant lets it through.
    again = ops.exec({"argv": ["touch", str(marker)], "privileged": False, "operation_id": f"op-{uuid.uuid4()}"})
    assert again["ok"] is True and again["data"]["decision"]["decided_by"].startswith("grant g-")
    grants = ops.native("grants", path=ops.operator)["data"]["grants"]
    assert [g["request_id"] for g in grants] == [bg.request_id]
    screen = console.wait_for("live grants")
    assert grants[0]["grant_id"] in screen and "about 30 min left" in screen, screen
    assert ops.cli("grants", "revoke", grants[0]["grant_id"]).returncode == 0


def test_the_console_shows_the_exact_approve_line(ops: Stack, console: Console) -> None:
    # Issue 27: the line for another terminal names this request and its --expect digest.
    bg = ask(ops)
    expect = wait_pending(ops, bg.request_id)["expect"]
    screen = console.wait_for("approve?")
    assert f"airlock approve {bg.request_id} --expect {expect}" in screen
    console.keys("n")
    console.wait_for("reason for the agent")
    console.keys("Enter")
    assert bg.result()["error"]["code"] == "denied"


def test_an_approved_job_is_offered_for_logs_follow(ops: Stack, console: Console) -> None:
    bg = ask(ops, ["sh", "-c", "echo started"])
    console.wait_for("approve?")
    console.keys("y")
    console.wait_for(f"follow its output: airlock logs {bg.request_id} --follow")
    assert bg.result()["ok"] is True


def _approved_sleep(ops: Stack, seconds: str) -> Background:
    bg = ask(ops, ["sleep", seconds])
    done = ops.cli("approve", bg.request_id)
    assert done.returncode == 0, done.stderr
    return bg


def test_k_then_a_number_kills_a_running_job_and_says_so(ops: Stack, console: Console) -> None:
    """Issue 35: the console lists running jobs and its kill key stops one (journaled: airlock watch)."""
    bg = _approved_sleep(ops, "37.25")
    screen = console.wait_for("running now")
    assert bg.request_id in screen and "sleep 37.25" in screen
    console.keys("k")
    console.wait_for("kill which job?")
    console.keys("1")
    console.wait_for("TERM sent to")
    reply = bg.result(20)
    assert reply["ok"] is True and reply["data"]["stages"][0]["signal"] == 15, reply
    shown = ops.cli("show", bg.request_id)
    assert "killed (SIGTERM) by" in shown.stdout and "airlock watch" in shown.stdout


def test_k_then_another_key_kills_nothing(ops: Stack, console: Console) -> None:
    bg = _approved_sleep(ops, "2.75")
    console.wait_for("sleep 2.75")
    console.keys("k")
    console.wait_for("kill which job?")
    console.keys("x")
    console.wait_for("nothing killed")
    reply = bg.result(20)
    assert reply["ok"] is True, reply
    assert reply["data"]["stages"][0]["exit_code"] == 0, reply

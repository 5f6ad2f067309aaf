"""An agent's tool kills `sudo` while a person has not decided; the agent types it again (issue 48).

The retry joins the request still pending, or gets the result of the job
that ran while nobody listened: one question, one run, and the retry prints
the output.  Typing the same command again after its result was printed is
a new intent: it asks again.  Ctrl-C withdraws, as sudo forwards SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest
from sudo_live import Agent, needs_root, sudo_agent

from waits import until

pytestmark = needs_root

# awk is not in the policy: a person is asked.  Each run appends one line to a root-only file.
LINE = """sudo awk 'BEGIN {{ print "ran" >> "{count}"; print "the output" }}'"""


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    with sudo_agent() as made:
        yield made


def _killed_after_two_seconds(agent: Agent, line: str) -> dict[str, object]:
    """The agent's tool: start the line, give up after 2 s (SIGKILL to its group); the request pending then."""
    proc = agent.start(line)
    until("the request is pending", lambda: len(agent.pending()) == 1)
    time.sleep(max(0.0, 2.0 - 0.5))
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    time.sleep(1.0)  # longer than the door's 0.25 s poll for a peer that went away
    waiting = agent.pending()
    assert len(waiting) == 1, "the killed front's request must stay pending"
    return waiting[0]


def test_a_retry_joins_the_pending_request(agent: Agent) -> None:
    count = agent.root_dir / "joined.count"
    line = LINE.format(count=count)
    first = _killed_after_two_seconds(agent, line)
    retry = agent.start(line)
    time.sleep(1.5)
    waiting = agent.pending()
    assert [w["request_id"] for w in waiting] == [first["request_id"]], "one question, not two"
    done = agent.stack.cli("approve", str(first["request_id"]))
    assert done.returncode == 0, done.stderr
    out, err = retry.communicate(timeout=60)
    assert retry.returncode == 0, err
    assert out.decode() == "the output\n"
    assert count.read_text() == "ran\n", "one run"
    # The result was printed: the same line now is a new intent, and asks again.
    again = agent.start(line)
    until("asked again", lambda: len(agent.pending()) == 1)
    assert agent.pending()[0]["request_id"] != first["request_id"]
    assert agent.stack.cli("deny", str(agent.pending()[0]["request_id"])).returncode == 0
    again.communicate(timeout=60)
    assert again.returncode == 1 and count.read_text() == "ran\n"


def test_a_retry_gets_the_result_of_the_job_that_ran_while_nobody_listened(agent: Agent) -> None:
    count = agent.root_dir / "unheard.count"
    line = LINE.format(count=count)
    first = _killed_after_two_seconds(agent, line)
    assert agent.stack.cli("approve", str(first["request_id"])).returncode == 0
    until("the job ran", lambda: count.exists())
    ran = agent.run(line)
    assert ran.code == 0 and ran.out == "the output\n", ran
    assert agent.pending() == [] and count.read_text() == "ran\n"


def test_ctrl_c_withdraws_the_request(agent: Agent) -> None:
    count = agent.root_dir / "interrupted.count"
    proc = agent.start("exec " + LINE.format(count=count))  # the front itself is the one the signal reaches
    until("the request is pending", lambda: len(agent.pending()) == 1)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    until("withdrawn", lambda: agent.pending() == [])
    assert not count.exists()


def test_a_request_nobody_came_back_for_is_withdrawn_after_the_window() -> None:
    """The window bounds it: the first front killed, the retry that joined killed too, and it is withdrawn."""
    with sudo_agent(window=6) as short:
        count = short.root_dir / "abandoned.count"
        line = LINE.format(count=count)
        first = _killed_after_two_seconds(short, line)
        retry = short.start(line)
        until("the retry joined", lambda: b"waiting for an operator" in _peek(retry))
        assert [w["request_id"] for w in short.pending()] == [first["request_id"]]
        os.killpg(retry.pid, signal.SIGKILL)
        retry.communicate(timeout=10)
        until("withdrawn once nobody listens and the window is over", lambda: short.pending() == [], timeout=15)
        assert short.stack.cli("approve", str(first["request_id"])).returncode != 0
        assert not count.exists()


def _peek(proc: subprocess.Popen[bytes]) -> bytes:
    """What the front wrote on stderr so far (non-blocking)."""
    assert proc.stderr is not None
    os.set_blocking(proc.stderr.fileno(), False)
    return proc.stderr.read() or b""

"""Issue 47: the exec trees come from airlock-exectree, a unit of its own; without it jobs still run.

On a dev stack (`airlock dev up` starts the listener as it starts the others,
its socket handed by LISTEN_FDS): with the listener gone (killed, its socket
away) or failing (stopped: it never answers), an approved job runs as before
and its ``exec.finished`` tree says ``complete: false`` and why it is missing.
Control: with the listener serving, the tree's reason (if any: a container
has no kernel source) is the listener's own, never "could not be reached".
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import Stack, custom_stack

CONFIG = """
runner:
  exec_tree_max: 40
"""


@pytest.fixture(scope="module")
def tstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with custom_stack(Path(tmp_path_factory.mktemp("tl")), CONFIG) as s:
        yield s


def _tree(stack: Stack) -> tuple[dict[str, Any], dict[str, Any]]:
    rid = f"tl-{uuid.uuid4()}"
    reply = stack.exec({"argv": ["sh", "-c", "echo ran"], "privileged": False}, id=rid)
    done = stack.cli("show", rid, "--json")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)["data"]
    return reply, shown["tree"]


def test_with_the_listener_serving_the_tree_is_the_listeners(tstack: Stack) -> None:
    reply, tree = _tree(tstack)
    assert reply["ok"] is True and base64.b64decode(reply["data"]["stdout"]) == b"ran\n", reply
    assert "airlock-exectree" not in str(tree.get("unavailable")), tree
    if "unavailable" not in tree:  # a kernel source is served here: the job's programs are in it
        assert tree["processes"], tree


def test_with_the_listener_gone_the_job_runs_and_the_tree_says_why(tstack: Stack) -> None:
    with tstack.down("exectree"):
        reply, tree = _tree(tstack)
    assert reply["ok"] is True and base64.b64decode(reply["data"]["stdout"]) == b"ran\n", reply
    assert tree["complete"] is False, tree
    assert tree["unavailable"].startswith("the exec-tree listener (airlock-exectree) could not be reached"), tree
    assert "processes" not in tree


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_with_the_listener_hung_the_job_runs_after_a_bounded_wait(tstack: Stack) -> None:
    with _stopped(tstack.service_pid("exectree")):
        reply, tree = _tree(tstack)
    assert reply["ok"] is True and base64.b64decode(reply["data"]["stdout"]) == b"ran\n", reply
    assert tree["complete"] is False and "no answer within 5s" in tree["unavailable"], tree

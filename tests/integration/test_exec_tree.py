"""Exec trees and `airlock kill` on a dev stack (issue 35).

The dev stack runs jobs in process groups here (no systemd as PID 1), so the
tree is the job's descendants by fork ancestry, from the kernel's
process-events connector: setsid'd and double-forked children included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.runner.proctree import ProcEvents

from support import Background, Stack, custom_stack

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the process-events connector needs CAP_NET_ADMIN (root)")

CONFIG = """
runner:
  exec_tree_max: 40
"""


def _connector_available() -> bool:
    import asyncio

    async def probe() -> str | None:
        events = ProcEvents()
        events.open()
        events.close()
        return events.unavailable

    return asyncio.run(probe()) is None


@pytest.fixture(scope="module")
def tstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if not _connector_available():
        pytest.skip("the kernel's process-events connector is not available here (a container?)")
    with custom_stack(Path(tmp_path_factory.mktemp("tr")), CONFIG) as s:
        yield s


def _show(stack: Stack, ref: str) -> dict[str, Any]:
    done = stack.cli("show", ref, "--json")
    assert done.returncode == 0, done.stderr
    shown: dict[str, Any] = json.loads(done.stdout)["data"]
    return shown


def _programs(tree: dict[str, Any]) -> list[str]:
    return [os.path.basename(p.get("exe") or "") for p in tree["processes"]]


def test_the_tree_has_every_program_including_setsid_and_double_forked_children(tstack: Stack) -> None:
    rid = f"tree-{uuid.uuid4()}"
    script = 'id; (setsid sh -c "uname -a" &); sleep 0.2'
    reply = tstack.exec({"argv": ["sh", "-c", script], "privileged": False}, id=rid)
    assert reply["ok"] is True, reply
    assert "tree" not in reply["data"]  # the agent's reply is what it was: the tree is the operator's
    shown = _show(tstack, rid)
    tree = shown["tree"]
    assert tree["source"] == "proc-connector" and tree["scope"] == "ancestry" and tree["complete"] is True
    procs = tree["processes"]
    # Every program is there and is named by the file the kernel executed: read from /proc at its
    # exec, or (one that exited within the instant, such as id) from the kernel's exit record.
    inodes = {name: os.stat(f"/usr/bin/{name}").st_ino for name in ("dash", "id", "setsid", "uname", "sleep")}
    seen = {p["exe_id"]["ino"] for p in procs}
    # setsid executes sh at once: when setsid's own exec is read /proc may already show sh (its entry is
    # then dash's file, at setsid's place in the tree); every other program is always named by its file.
    assert {inodes[n] for n in ("dash", "id", "uname", "sleep")} <= seen, (inodes, procs)
    root = procs[0]
    assert root["argv"][:2] == ["/usr/bin/dash", "-c"] and root["parent"] is None
    uname = next(p for p in procs if p["exe_id"]["ino"] == inodes["uname"])
    if uname.get("exited_before_read"):
        assert uname["comm"] == "uname"
    else:
        assert uname["argv"] == ["uname", "-a"] and "size" in uname["exe_id"]
    assert uname["uid"] == os.geteuid() and uname["exit_code"] == 0 and uname["end"] >= uname["start"]
    # uname's parent is the setsid'd sh (setsid executed dash), started through a subshell's fork by the job's sh.
    parent = procs[uname["parent"]]
    assert parent["exe_id"]["ino"] == inodes["dash"]
    assert procs[parent["parent"]]["exe_id"]["ino"] in (inodes["setsid"], inodes["dash"]), procs
    assert procs[procs[parent["parent"]]["parent"]] is root
    ident = next(p for p in procs if p["exe_id"]["ino"] == inodes["id"])
    assert ident["parent"] == 0 and ident["exit_code"] == 0
    text = tstack.cli("show", rid)
    assert text.returncode == 0
    assert "executed (" in text.stdout and "uname -a" in text.stdout


def test_the_tree_is_bounded_and_says_how_many_more(tstack: Stack) -> None:
    rid = f"tree-{uuid.uuid4()}"
    script = "i=0; while [ $i -lt 500 ]; do /usr/bin/true; i=$((i+1)); done"
    reply = tstack.exec({"argv": ["sh", "-c", script], "privileged": False, "timeout_ms": 60000}, id=rid)
    assert reply["ok"] is True, reply
    tree = _show(tstack, rid)["tree"]
    assert len(tree["processes"]) == 40 and tree["limit"] == 40
    assert tree["more"] == 501 - 40  # the shell and 500 trues, every one counted
    text = tstack.cli("show", rid).stdout
    assert "461 more (runner.exec_tree_max is 40)" in text


def test_a_renamed_process_shows_the_file_the_kernel_executed(tstack: Stack) -> None:
    """argv[0] is the process's to choose; the exe identity is the kernel's."""
    rid = f"tree-{uuid.uuid4()}"
    reply = tstack.exec(
        {"argv": ["bash", "-c", "exec -a innocent-looking /usr/bin/sleep 0.1"], "privileged": False}, id=rid
    )
    assert reply["ok"] is True, reply
    procs = _show(tstack, rid)["tree"]["processes"]
    renamed = procs[-1]
    assert renamed["argv"][0] == "innocent-looking"
    assert renamed["exe"] == os.path.realpath("/usr/bin/sleep")
    assert renamed["exe_id"]["ino"] == os.stat("/usr/bin/sleep").st_ino


def _no_process_with(marker: str) -> bool:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        return False
            except OSError:
                continue
    return True


def test_kill_stops_a_running_job_journaled_and_leaves_no_process(tstack: Stack) -> None:
    marker = f"{600 + (uuid.uuid4().int % 1000)}.{uuid.uuid4().int % 10**6}"
    rid = f"kill-{uuid.uuid4()}"
    job = Background(tstack, {"argv": ["sleep", marker], "timeout_ms": 60000}, id=rid)
    deadline = time.monotonic() + 20
    while _no_process_with(marker):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.05)
    done = tstack.cli("kill", rid, "--reason", "runaway")
    assert done.returncode == 0, done.stderr
    assert "TERM sent (running)" in done.stdout
    reply = job.result(30)
    assert reply["ok"] is True and reply["data"]["stages"][0]["signal"] == 15, reply
    assert _no_process_with(marker)
    shown = _show(tstack, rid)
    assert shown["outcome"]["killed"]["by"] == "root" and shown["outcome"]["killed"]["signal"] == "SIGTERM"
    assert shown["outcome"]["killed"]["reason"] == "runaway"
    actions = [e for e in shown["events"] if e["kind"] == "operator.action"]
    assert actions and actions[-1]["payload"]["action"] == "kill" and actions[-1]["payload"]["reason"] == "runaway"
    # Issue 44: it said "outcome ok, exit codes [None], killed (SIGTERM)".
    assert "killed (SIGTERM) by root: runaway, exit status 143 (SIGTERM)" in tstack.cli("show", rid).stdout


def test_kill_of_a_job_that_is_not_running_is_not_found_and_journals_nothing(tstack: Stack) -> None:
    before = len(tstack.journal_rows())
    done = tstack.cli("kill", f"nothing-{uuid.uuid4()}")
    assert done.returncode != 0 and "no running job" in done.stderr
    bad = tstack.cli("kill", "x", "--signal", "SEGV")
    assert bad.returncode != 0 and "signal" in bad.stderr
    assert len(tstack.journal_rows()) == before


def test_kill_reaches_a_child_that_left_the_process_group(tstack: Stack) -> None:
    """Process-group mode: setsid() leaves the job's group, not its fork ancestry."""
    marker = f"{600 + (uuid.uuid4().int % 1000)}.{uuid.uuid4().int % 10**6}"
    rid = f"kill-{uuid.uuid4()}"
    script = f"setsid sleep {marker} & sleep {marker}"
    job = Background(tstack, {"argv": ["sh", "-c", script], "timeout_ms": 60000}, id=rid)
    deadline = time.monotonic() + 20
    while _count_with(marker) < 2:
        assert time.monotonic() < deadline, "the job never started both sleeps"
        time.sleep(0.05)
    done = tstack.cli("kill", rid)
    assert done.returncode == 0, done.stderr
    job.result(30)
    deadline = time.monotonic() + 5
    while _count_with(marker):
        assert time.monotonic() < deadline, "a process of the killed job is left"
        time.sleep(0.05)


def _count_with(marker: str) -> int:
    found = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    found += f.read() == b"sleep\0" + marker.encode() + b"\0"
            except OSError:
                continue
    return found


def _cgroup2_root() -> str | None:
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            if fields[fields.index("-") + 1] == "cgroup2":
                return fields[4]
    return None


def test_by_cgroup_setsid_and_double_forked_children_are_the_jobs() -> None:
    """Service containment's rule without systemd: a process is the job's when it executes in the
    job's cgroup (named like its unit), whoever its parent is."""
    import subprocess

    root = _cgroup2_root()
    if root is None or not os.access(root, os.W_OK) or not _connector_available():
        pytest.skip("needs a writable cgroup2 hierarchy and the process-events connector")
    unit = f"airlock-job-treetest{uuid.uuid4().hex[:8]}.u0.service"
    cgroup = os.path.join(root, unit)
    os.mkdir(cgroup)

    def join() -> None:  # what systemd does for a unit's main process, before exec
        with open(os.path.join(cgroup, "cgroup.procs"), "w", encoding="ascii") as f:
            f.write("0")

    def run() -> dict[str, Any]:
        events = ProcEvents()
        events.open()
        try:
            watch = events.watch([unit], 50)
            script = 'id; (setsid sh -c "uname -a; sleep 0.1" &); sleep 0.3'
            subprocess.run(["/bin/sh", "-c", script], preexec_fn=join, check=True, capture_output=True)
            # The double-forked sh outlives its parent: wait until the cgroup is empty.
            deadline = time.monotonic() + 10
            while Path(cgroup, "cgroup.procs").read_text().strip():
                assert time.monotonic() < deadline
                time.sleep(0.02)
            events.finish(watch)
            return watch.record(32 * 1024)
        finally:
            events.close()

    try:
        tree = run()
    finally:
        os.rmdir(cgroup)
    assert tree["scope"] == "cgroup" and tree["complete"] is True
    inodes = {os.stat(f"/usr/bin/{n}").st_ino: n for n in ("dash", "id", "setsid", "uname", "sleep")}
    names = [inodes.get(p["exe_id"]["ino"]) for p in tree["processes"]]
    # setsid may already be sh when its exec is read (see the test above): every other program is there.
    assert {"dash", "id", "uname", "sleep"} <= set(names), tree
    assert len(names) >= 6, tree  # sh, id, the subshell's setsid (or its sh), sh, uname, sleep
    assert tree["processes"][0]["parent"] is None and names[0] == "dash"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) (util-linux)")
def test_a_runner_in_another_pid_namespace_learns_at_once_that_the_connector_is_not_served() -> None:
    """The kernel ignores a connector listener outside its initial PID and user namespaces (a container):
    the runner tells so from /proc/self/ns first instead of waiting out the acknowledgement, which every
    cold start in a container paid before its first job.  Control: here, in the initial ones, it subscribes."""
    from airlock.runner import connector

    connector.subscribe().close()  # control
    probe = (
        "import time; from airlock.runner import connector\n"
        "t = time.monotonic()\n"
        "try:\n    connector.subscribe(); print('subscribed')\n"
        "except connector.Unavailable as exc:\n    print(f'{time.monotonic() - t:.3f}', exc)\n"
    )
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(connector.__file__).parents[2])},
    )
    assert done.returncode == 0, done
    took, _, why = done.stdout.partition(" ")
    assert "initial PID and user namespaces" in why, done.stdout
    assert float(took) < connector.ACK_SECONDS / 2, done.stdout

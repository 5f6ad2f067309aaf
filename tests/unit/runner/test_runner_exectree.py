"""The exec-tree door (issue 47): its messages, the listener's reply, and a runner whose listener is
absent or fails (the job's tree then says why it is missing)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from airlock.common.config import Config, load
from airlock.common.errors import AirlockError
from airlock.common.server import Service
from airlock.common.wire import exectree as wire
from airlock.common.wire.verb import Caller
from airlock.runner import exectree
from airlock.runner.control import JobControl
from airlock.runner.execwatch import Watch
from airlock.runner.treeclient import TreeClient


def test_the_messages_refuse_what_the_listener_must_not_take() -> None:
    with pytest.raises(AirlockError, match="units"):
        wire.Watch.from_dict({"units": ["x"] * (wire.MAX_UNITS + 1)})
    with pytest.raises(AirlockError, match="limit"):
        wire.Watch.from_dict({"units": [], "limit": -1})
    with pytest.raises(AirlockError, match="pids"):
        wire.Claim.from_dict({"id": 1, "pids": [0]})
    with pytest.raises(AirlockError, match="only a watch by ancestry"):
        wire.Watch.from_dict({"units": ["airlock-job-x.service"], "pids": [42]})
    assert wire.Watch.from_dict({"pids": [42]}).pids == (42,)
    with pytest.raises(AirlockError, match="secret: unknown field"):
        wire.Finish.from_dict({"id": 1, "max_bytes": 10, "secret": "x"})
    tree = wire.Tree("proc-connector", complete=False, missed=("events were lost",), processes=({"pid": 7},))
    assert wire.Tree.from_dict(tree.to_dict()) == tree


def test_the_finished_tree_keeps_twice_the_runners_budget_and_counts_the_rest() -> None:
    w = Watch(limit=100)
    w.execs = [{"pid": n, "argv": ["x" * 90]} for n in range(50)]
    w.more = 3
    w.miss("events were lost")
    tree = exectree.tree_of(w, 1000)
    assert 0 < len(tree.processes) < 50
    assert sum(len(str(p)) for p in tree.processes) < 2 * 1000 + 200
    assert tree.more == 3 + 50 - len(tree.processes)  # nothing is dropped silently
    assert (tree.complete, tree.missed) == (False, ("events were lost",))


def _config(tmp_path: Path, tree_max: int = 8) -> Config:
    f = tmp_path / "airlock.yaml"
    f.write_text(
        f"paths:\n  runtime_dir: {tmp_path / 'run'}\n  state_dir: {tmp_path / 'state'}\n"
        f"  policy_dir: {tmp_path / 'policy.d'}\nrunner:\n  exec_tree_max: {tree_max}\n"
    )
    return load(f)


async def _record(control: JobControl) -> dict[str, object]:
    tree = await control.tree(32 * 1024)
    assert tree is not None
    return tree


def test_a_runner_whose_listener_is_absent_still_runs_and_says_why(tmp_path: Path) -> None:
    async def job() -> dict[str, object]:
        control = JobControl(TreeClient(tmp_path / "nobody-listens.sock"), 8, asyncio.Event())
        await control.begin(())
        await control.claim([1])
        await control.end()
        return await _record(control)

    tree = asyncio.run(job())
    assert tree["complete"] is False
    assert "airlock-exectree" in str(tree["unavailable"]) and "could not be reached" in str(tree["unavailable"])


def _serve(service: Service, path: Path) -> tuple[socket.socket, asyncio.Task[None]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock, asyncio.ensure_future(service.serve({"exectree": sock}, activated=False))


def test_a_listener_that_fails_mid_job_leaves_a_tree_that_says_so(tmp_path: Path) -> None:
    """A real listener on a socket: the job is watched, then the listener goes; control: while it
    serves, the runner gets its answer (here: no kernel source, by configuration), not an error."""
    config = _config(tmp_path, tree_max=0)  # the listener opens no kernel source: any user can run this

    async def job() -> tuple[dict[str, object], dict[str, object]]:
        service = await exectree.build(config, {})
        path = tmp_path / "exectree.sock"
        sock, serving = _serve(service, path)
        await asyncio.sleep(0.05)
        trees = TreeClient(path)
        served = JobControl(trees, 8, asyncio.Event())
        await served.begin(())
        await served.end()
        # Now one whose listener is watching it (id given by hand: this listener has no kernel source)
        # and then fails: its finish cannot be answered.
        failing = JobControl(trees, 8, asyncio.Event())
        failing.watch, failing.watch_id = Watch(limit=8), 7
        service.request_stop("test")
        await serving
        sock.close()
        trees.close()
        await failing.end()
        return await _record(served), await _record(failing)

    served, failed = asyncio.run(job())
    assert served == {"source": "proc-connector", "complete": False, "unavailable": "runner.exec_tree_max is 0"}
    assert failed["complete"] is False
    assert "failed before the job's tree was read" in str(failed["unavailable"]), failed


def test_the_listener_serves_the_runners_uid_only(tmp_path: Path) -> None:
    from airlock.common.peer import Peer

    tree = exectree.ExecTree(_config(tmp_path))
    runner = tree.runner_uid
    assert runner is not None
    assert tree.caller_of(Peer(pid=1, uid=runner, gid=0, user="", group_ids=(), groups=frozenset())) == {Caller.RUNNER}
    assert tree.caller_of(Peer(pid=1, uid=runner + 1, gid=0, user="", group_ids=(), groups=frozenset())) == frozenset()


class _Call:
    """What the listener's handlers read of a call: who asked (the runner's pid)."""

    def __init__(self, pid: int) -> None:
        from airlock.common.peer import Peer

        self.peer = Peer(pid=pid, uid=0, gid=0, user="", group_ids=(), groups=frozenset())


def _listener(tmp_path: Path) -> exectree.ExecTree:
    """A listener whose kernel events the test feeds by hand (no netlink socket: any user can run this)."""
    tree = exectree.ExecTree(_config(tmp_path))
    tree.events.unavailable = None
    return tree


def test_follow_answers_with_the_tree_when_the_jobs_last_process_is_gone_without_a_finish(tmp_path: Path) -> None:
    """Issue 47: one call per job, whose answer is ready when the job's end reaches the runner (not one
    round trip later).  Control: while a process of the job lives (a child its stage forked), no answer."""
    tree = _listener(tmp_path)
    runner, stage, child = 4242, 5001, 5002

    async def job() -> tuple[bool, wire.Tree]:
        tree.events.forks_of.add(runner)
        tree.events._fork(runner, stage)
        following = asyncio.ensure_future(tree.follow(_Call(runner), wire.Follow(1, (stage,), 8, 4096)))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        tree.events._fork(stage, child)
        tree.events._exec(child, 1.0)
        tree.events._exit(stage, 2.0, 0)
        await asyncio.sleep(0.05)
        early = following.done()  # the child still runs: the job is not over
        tree.events._exit(child, 3.0, 0)
        return early, await asyncio.wait_for(following, 5)

    early, got = asyncio.run(job())
    assert early is False
    assert [p["pid"] for p in got.processes] == [5002], got
    assert tree.watches == {} and tree.ending == {} and tree.keys == {}  # nothing is kept after the answer


def test_a_finish_by_key_answers_a_waiting_follow_with_the_same_tree(tmp_path: Path) -> None:
    """A job that left a process behind (a daemon): the runner's finish by key ends it for both calls;
    the key is the calling runner's own (another runner's finish with it finds nothing)."""
    tree = _listener(tmp_path)
    runner, stage = 4243, 6001

    async def job() -> tuple[wire.Tree, wire.Tree]:
        tree.events.forks_of.add(runner)
        tree.events._fork(runner, stage)
        tree.events._exec(stage, 1.0)
        following = asyncio.ensure_future(tree.follow(_Call(runner), wire.Follow(3, (stage,), 8, 4096)))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)
        with pytest.raises(AirlockError, match="no job followed by key 3"):
            await tree.finish(_Call(runner + 1), wire.Finish(0, 4096, key=3))  # type: ignore[arg-type]
        assert following.done() is False
        finished = await tree.finish(_Call(runner), wire.Finish(0, 4096, key=3))  # type: ignore[arg-type]
        return finished, await asyncio.wait_for(following, 5)

    finished, followed = asyncio.run(job())
    assert finished == followed and [p["pid"] for p in finished.processes] == [6001]
    with pytest.raises(AirlockError, match="no job followed by key 3"):  # one answer per job
        asyncio.run(tree.finish(_Call(runner), wire.Finish(0, 4096, key=3)))  # type: ignore[arg-type]


def test_a_watch_by_cgroup_is_never_told_gone(tmp_path: Path) -> None:
    """By cgroup a process may join the job at any time: only the runner's finish ends it."""
    tree = _listener(tmp_path)
    told: list[bool] = []
    w = tree.events.watch(("airlock-job-x.service",), 8)
    tree.events.at_exit(w, lambda: told.append(True))
    assert told == []
    by_ancestry = tree.events.watch((), 8)  # control: nothing alive by ancestry: told at once
    tree.events.at_exit(by_ancestry, lambda: told.append(True))
    assert told == [True]


def test_the_follow_message_names_one_job_by_one_name() -> None:
    with pytest.raises(AirlockError, match="pids"):
        wire.Follow.from_dict({"key": 1, "pids": []})
    with pytest.raises(AirlockError, match="key"):
        wire.Follow.from_dict({"key": 0, "pids": [5]})
    with pytest.raises(AirlockError, match="one of them"):
        wire.Finish.from_dict({"id": 2, "key": 3, "max_bytes": 10})
    with pytest.raises(AirlockError, match="one of them"):
        wire.Ref.from_dict({"id": 0})
    assert wire.Ref.from_dict({"id": 0, "key": 9}).key == 9

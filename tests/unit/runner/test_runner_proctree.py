"""The exec tree's bounds and how `airlock show` prints it (issue 35)."""

from __future__ import annotations

from typing import Any

from airlock.cli.show import tree_lines
from airlock.common.codec import canonical_json
from airlock.runner import execwatch


def _entry(i: int, parent: int | None, argv: list[str]) -> dict[str, Any]:
    return {
        "pid": 100 + i,
        "ppid": 99 + i,
        "parent": parent,
        "argv": argv,
        "exe": "/usr/bin/" + argv[0],
        "exe_id": {"dev": 1, "ino": 10 + i, "size": 5, "mtime": "x"},
        "uid": 0,
        "euid": 0,
        "start": "t",
        "exit_code": 0,
    }


def test_the_record_keeps_within_its_bytes_and_counts_the_rest() -> None:
    w = execwatch.Watch(limit=1000)
    w.execs = [_entry(i, None, ["true", "x" * 200]) for i in range(100)]
    out = w.record(4096)
    assert len(canonical_json(out)) <= 4096
    assert 0 < len(out["processes"]) < 100 and out["more"] == 100 - len(out["processes"])


def test_the_count_limit_counts_every_program_past_it(monkeypatch: Any) -> None:
    monkeypatch.setattr(execwatch, "read_process", lambda pid: {"argv": ["true"]})
    w = execwatch.Watch(limit=3)
    for pid in range(10, 20):
        w.fork(1, pid)
        w.exec(pid, 0.0)
        w.exit(pid, 0.0, 0)
    out = w.record(64 * 1024)
    assert len(out["processes"]) == 3 and out["more"] == 7 and out["limit"] == 3


def test_argv_is_bounded_in_count_and_bytes() -> None:
    import subprocess
    import time

    child = subprocess.Popen(["/usr/bin/sleep", "5", *["0"] * 99])
    try:
        deadline = time.monotonic() + 5
        while len((seen := execwatch.read_process(child.pid)).get("argv") or []) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert len(seen["argv"]) == execwatch.MAX_ARGS and seen["argv_truncated"] is True
    assert seen["argv"][:2] == ["/usr/bin/sleep", "5"] and seen["exe"].endswith("/sleep")
    assert seen["exe_id"]["ino"] > 0 and seen["uid"] >= 0


def test_show_indents_by_parentage_and_neutralises_what_the_job_chose() -> None:
    tree = {
        "source": "proc-connector",
        "scope": "cgroup",
        "complete": True,
        "limit": 256,
        "more": 2,
        "processes": [
            _entry(0, None, ["sh", "-c", "x"]),
            _entry(1, 0, ["evil\x1b[2J", "\u202eabc"]),
            {
                "pid": 7,
                "ppid": 100,
                "parent": 1,
                "exited_before_read": True,
                "comm": "id\x1b",
                "uid": 0,
                "exe_id": {"dev": 1, "ino": 9},
                "start": "t",
                "exit_code": 0,
            },
        ],
    }
    lines = tree_lines(tree)
    assert lines[0] == "executed (3 programs, the job's cgroups)"
    assert lines[1].startswith("  100 sh -c x")
    assert lines[2].startswith("    101 ") and "\x1b" not in lines[2] and "\u202e" not in lines[2]
    assert "\\x1b" in lines[2] and "\\u202e" in lines[2]
    assert lines[3].startswith("      7 ") and "exited before it could be read; was id\\x1b" in lines[3]
    assert lines[4] == "  … 2 more (runner.exec_tree_max is 256)"


def test_show_says_why_there_is_no_tree() -> None:
    lines = tree_lines({"source": "proc-connector", "unavailable": "no \x1b]connector"})
    assert lines == ["executed: not recorded (no \\x1b]connector)"]


def test_airlocks_own_shims_are_named_not_spelled_out() -> None:
    from airlock.runner.units import HELPER

    helper = ["/usr/bin/python3.11", "-I", "-S", "-c", HELPER[:900]]
    assert execwatch.shims_named(helper) == ["/usr/bin/python3.11", "-I", "-S", "-c", "<airlock exec helper>"]
    # A job's own short code that happens to begin like the helper is the job's, and shown.
    mine = ["/usr/bin/python3", "-I", "-S", "-c", "import fcntl"]
    assert execwatch.shims_named(mine) == mine


def test_a_secret_on_a_programs_command_line_is_redacted_from_the_tree() -> None:
    """A credential or protected value a job passes in argv (``mysql -pSECRET``) never reaches the journal."""
    w = execwatch.Watch(limit=10)
    w.execs = [_entry(0, None, ["mysql", "-pS3cr3t-value", "db"]), _entry(1, 0, ["echo", "S3cr3t-value"])]
    out = w.record(64 * 1024, (b"S3cr3t-value",))
    assert "S3cr3t-value" not in canonical_json(out).decode()
    assert out["processes"][0]["argv"] == ["mysql", "-p[redacted]", "db"]
    assert w.record(64 * 1024)["processes"][0]["argv"][1] == "-pS3cr3t-value"  # control: nothing to redact


def test_finished_jobs_are_not_kept_for_their_late_exit_events(monkeypatch: Any) -> None:
    """Issue 37's RSS row: the runner grew ~2 KiB per exec, each finished job's tree kept for a late exit.

    A job's process whose exit event arrives after the job ended (the runner reaped it first) is not
    kept; one that exits while its job runs is kept only briefly, for its taskstats record.
    """
    import time

    from airlock.runner import proctree

    monkeypatch.setattr(execwatch, "read_process", lambda pid: None)
    events = proctree.ProcEvents()
    events.unavailable = None
    runner = next(iter(events.forks_of))  # the runner whose forks are followed (here: this process)
    for n in range(3000):
        pid = 100_000 + n
        w = events.watch()
        events._fork(runner, pid)
        events.claim(w, [pid])
        events._exec(pid, 0.0)
        events.finish(w)
        events._exit(pid, 0.0, 0)  # the exit event comes after the job's end
    assert not events.exited and not events.owner and not events.unclaimed
    w = events.watch()
    events._fork(runner, 1)
    events.claim(w, [1])
    events._exec(1, 0.0)
    events._exit(1, 0.0, 0)  # while its job runs: findable for its taskstats record
    assert events.exited[1][0] is w
    monkeypatch.setattr(time, "monotonic", lambda: 1e9)
    events._fork(runner, 2)
    events.claim(w, [2])
    events._exec(2, 0.0)
    events._exit(2, 0.0, 0)
    assert list(events.exited) == [2]  # the older one aged out

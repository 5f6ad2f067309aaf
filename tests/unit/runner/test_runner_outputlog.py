"""runner/outputlog.py and runner/credentials.py: what is stored, cut, digested, followed and read back."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.runner import credentials, outputlog


def _log(tmp_path: Path, limit: int = 1000) -> outputlog.OutputLog:
    return outputlog.OutputLog(tmp_path / "out", outputlog.new_name(), limit, {"operation_id": "op"})


def test_what_is_stored_reads_back_with_the_digests_the_chain_gets(tmp_path: Path) -> None:
    log = _log(tmp_path)
    log.add("stdout", 1, b"hello ")
    log.add("stderr", 0, b"warning\n")
    log.add("stdout", 1, b"world\n")
    kept = log.close()
    assert kept["file"] == log.name and kept["stored_bytes"] == 20 and kept["cut"] is False
    assert {(s["stream"], s["stage"]): s["sha256"] for s in kept["streams"]} == {
        ("stdout", 1): hashlib.sha256(b"hello world\n").hexdigest(),
        ("stderr", 0): hashlib.sha256(b"warning\n").hexdigest(),
    }
    found = outputlog.read(tmp_path / "out", log.name, 1000)
    assert found["complete"] and found["header"] == {"operation_id": "op"}
    assert [(n, s, d) for n, s, _ms, d in found["chunks"]] == [
        ("stdout", 1, b"hello "),
        ("stderr", 0, b"warning\n"),
        ("stdout", 1, b"world\n"),
    ]
    assert sorted(found["streams"], key=str) == sorted(kept["streams"], key=str)
    # Issue 51: the whole log as written (header, every frame in order), as the file holds it.
    assert found["log_sha256"] == kept["log_sha256"]
    raw = gzip.decompress((tmp_path / "out" / log.name).read_bytes())
    assert kept["log_sha256"] == hashlib.sha256(raw).hexdigest()
    assert os.stat(tmp_path / "out").st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "out" / log.name).st_mode & 0o777 == 0o600


def test_past_its_bound_the_log_is_cut_and_says_so(tmp_path: Path) -> None:
    log = _log(tmp_path, limit=10)
    log.add("stdout", 0, b"0123456")
    log.add("stdout", 0, b"789abcdef")
    log.add("stdout", 0, b"more")
    kept = log.close()
    assert kept["cut"] is True and kept["stored_bytes"] == 10
    assert kept["streams"][0]["sha256"] == hashlib.sha256(b"0123456789").hexdigest()
    found = outputlog.read(tmp_path / "out", log.name, 10)
    assert found["chunks"][0][3] == b"0123456789"
    assert found["chunks"][-1][0] == "note" and b"cut at 10 bytes" in found["chunks"][-1][3]


def test_a_job_without_output_leaves_no_file(tmp_path: Path) -> None:
    log = _log(tmp_path)
    kept = log.close()
    assert kept == {"file": None, "stored_bytes": 0, "cut": False, "streams": []}
    assert not (tmp_path / "out").exists()


def test_names_are_the_runners_own(tmp_path: Path) -> None:
    for bad in ("../x", "a.out.gz", "20260101T000000Z-zzzzzzzzzzzzzzzz.out.gz", None, 3):
        assert not outputlog.valid_name(bad)
        if isinstance(bad, str):
            with pytest.raises(AirlockError):
                outputlog.read(tmp_path, bad, 100)
    assert outputlog.valid_name(outputlog.new_name())


def test_a_symlinked_log_is_not_read(tmp_path: Path) -> None:
    directory = tmp_path / "out"
    directory.mkdir(mode=0o700)
    name = outputlog.new_name()
    (directory / name).symlink_to("/etc/passwd")
    with pytest.raises(AirlockError) as info:
        outputlog.read(directory, name, 100)
    assert "symlink" in info.value.message


def test_a_slow_follower_loses_chunks_with_a_count_and_the_job_never_waits(tmp_path: Path) -> None:
    async def go() -> None:
        log = _log(tmp_path, limit=10 * outputlog.FOLLOW_QUEUE_BYTES)
        log.add("stdout", 0, b"before\n")
        follower = log.follow()
        chunk = b"x" * (outputlog.FOLLOW_QUEUE_BYTES // 4)
        for _ in range(8):  # twice what the follower may hold, nobody reading
            log.add("stdout", 0, chunk)
        got, dropped, ended = await outputlog.next_chunks(log, follower, 0.01)
        assert got[0][2] == b"before\n"  # the tail so far comes first
        assert dropped > 0 and sum(len(c[2]) for c in got) + dropped == 7 + 8 * len(chunk)
        assert not ended
        log.close()
        got, dropped, ended = await outputlog.next_chunks(log, follower, 0.01)
        assert ended and not got and follower not in log.followers

    asyncio.run(go())


def test_retention_plans_by_age_then_each_groups_budget_then_the_largest_group(tmp_path: Path) -> None:
    """Issue 51: one requester's output never pushes another's logs out; a running job's log stays."""
    from airlock.runner.outputkeep import Budgets, Entry, plan

    def entry(name: str, group: str, mtime: float, size: int = 100, running: bool = False) -> Entry:
        return Entry(name, group, size, mtime, running)

    budgets = Budgets(max_age=1000.0, agent=300, root=300, total=10_000)
    # Agent u1000 floods: its own oldest go until it fits; u1001 and r1000 are untouched.
    flood = [entry(f"a{i}", "u1000", 100.0 + i) for i in range(5)]
    others = [entry("b0", "u1001", 50.0), entry("r0", "r1000", 40.0)]
    assert [(d.name, d.reason) for d in plan(flood + others, budgets, now=500.0)] == [
        ("a0", "agent_budget"),
        ("a1", "agent_budget"),
    ]
    # Age first, in every group; then a root group's own budget.
    roots = [entry(f"r{i}", "r1000", 600.0 + i) for i in range(4)]
    old = [entry("b0", "u1001", 1.0)]
    assert [(d.name, d.reason) for d in plan(roots + old, budgets, now=1500.0)] == [
        ("b0", "age"),
        ("r0", "root_budget"),
    ]
    # Over the total: the group taking the most loses its oldest; a running log counts but stays.
    small = Budgets(max_age=1000.0, agent=1000, root=1000, total=400)
    big = [entry("a0", "u1000", 100.0, running=True), entry("a1", "u1000", 101.0), entry("a2", "u1000", 102.0)]
    mine = [entry("b0", "u1001", 10.0), entry("b1", "u1001", 11.0)]
    assert [(d.name, d.reason) for d in plan(big + mine, small, now=200.0)] == [("a1", "total")]


def test_log_names_carry_their_group(tmp_path: Path) -> None:
    name = outputlog.new_name(owner=outputlog.group(1000, root=True))
    assert outputlog.valid_name(name) and outputlog.group_of(name) == "r1000"
    assert outputlog.group_of(outputlog.new_name(owner="u0")) == "u0"
    old = outputlog.new_name()  # named before groups: still valid, its own group
    assert outputlog.valid_name(old) and outputlog.group_of(old) == ""
    for bad in (name.replace("r1000", "x1000"), name.replace("r1000", "r01"), name.replace("r1000", "../r1")):
        assert not outputlog.valid_name(bad)


def test_credentials_bound_are_checked_again() -> None:
    assert credentials.parse_bound(None, 1) == []
    assert credentials.parse_bound([{"db": "/etc/x"}, {}], 2) == [{"db": "/etc/x"}, {}]
    for bad in ([{"db": "relative"}], [{"../x": "/etc/x"}], [{"db": "/a:b"}], [{"db": "/x"}, {}], "x"):
        with pytest.raises(AirlockError):
            credentials.parse_bound(bad, 1)


def test_credentials_are_redacted_and_the_line_after_them_kept() -> None:
    from airlock.runner.redact import StreamRedactor

    loaded = credentials.Loaded(((0, "db", "/etc/x", b"hunter22-secret\n"),))
    redactor = StreamRedactor(loaded.redacted())
    # `cat file` prints the newline, `$(cat file)` drops it: either way the value goes and the line end stays.
    out = redactor.feed(b"password is: hunter22-secret\ntick 1\nx=hunter22-secret;\n") + redactor.flush()
    assert out == b"password is: [redacted]\ntick 1\nx=[redacted];\n"
    assert loaded.record() == [{"stage": 0, "name": "db", "sha256": hashlib.sha256(b"hunter22-secret\n").hexdigest()}]


def test_a_log_bound_past_what_one_reply_carries_is_refused() -> None:
    from airlock.common.config import MAX_TOTAL_OUTPUT, ConfigError, parse_text

    assert parse_text(f"runner: {{output_log_max_bytes: {MAX_TOTAL_OUTPUT}}}\n", "/x.yaml")
    with pytest.raises(ConfigError) as info:
        parse_text(f"runner: {{output_log_max_bytes: {MAX_TOTAL_OUTPUT + 1}}}\n", "/x.yaml")
    assert str(info.value) == (
        f"/x.yaml: runner.output_log_max_bytes: must be at most {MAX_TOTAL_OUTPUT} (got {MAX_TOTAL_OUTPUT + 1})"
    )


def test_a_job_alternating_streams_byte_by_byte_still_reads_back_whole_and_bounded(tmp_path: Path) -> None:
    log = _log(tmp_path, limit=20000)
    for i in range(20000):
        log.add("stdout" if i % 2 else "stderr", 0, b"ab"[i % 2 : i % 2 + 1])
    kept = log.close()
    found = outputlog.read(tmp_path / "out", log.name, 20000)
    assert found["complete"] and len(found["chunks"]) == outputlog.MAX_CHUNKS
    assert {(s["stream"], s["sha256"]) for s in found["streams"]} == {
        (s["stream"], s["sha256"]) for s in kept["streams"]
    }
    assert sum(len(c[3]) for c in found["chunks"]) == 20000


def test_credentials_go_only_to_a_job_that_runs_as_another_account() -> None:
    """Issue 51: systemd's copy belongs to the job's uid; the requester's uid must not be it."""
    credentials.not_the_requester(0, 1000)  # control: a root job for agent 1000
    for job_uid, requester in ((1000, 1000), (0, 0), (0, None)):
        with pytest.raises(AirlockError) as info:
            credentials.not_the_requester(job_uid, requester)
        assert info.value.code is ErrorCode.CREDENTIAL_UNSAFE

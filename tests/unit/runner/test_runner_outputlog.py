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


def test_pruning_by_age_then_total_size_keeps_running_jobs(tmp_path: Path) -> None:
    directory = tmp_path / "out"
    directory.mkdir(mode=0o700)
    names = [f"2026010{i}T000000Z-{i:016x}.out.gz" for i in range(1, 6)]  # oldest first
    for i, name in enumerate(names):
        (directory / name).write_bytes(b"x" * 10000)
        os.utime(directory / name, (1e9 + i * 100, 1e9 + i * 100))
    (directory / "unrelated").write_bytes(b"")
    size = os.stat(directory / names[0]).st_blocks * 512 or 10000
    # Over the total: the oldest go first, except a running job's, until the rest fit.
    removed = outputlog.prune(directory, max_age=1e12, total=3 * size, keep=frozenset({names[0]}))
    assert removed == [names[1], names[2]]
    assert sorted(os.listdir(directory)) == sorted([names[0], names[3], names[4], "unrelated"])
    # By age: everything older than a second goes (1e9 is 2001), never what is not a log.
    assert outputlog.prune(directory, max_age=1.0, total=1 << 30) == [names[0], names[3], names[4]]
    assert os.listdir(directory) == ["unrelated"]


def test_credentials_bound_are_checked_again() -> None:
    assert credentials.parse_bound(None, 1) == []
    assert credentials.parse_bound([{"db": "/etc/x"}, {}], 2) == [{"db": "/etc/x"}, {}]
    for bad in ([{"db": "relative"}], [{"../x": "/etc/x"}], [{"db": "/a:b"}], [{"db": "/x"}, {}], "x"):
        with pytest.raises(AirlockError):
            credentials.parse_bound(bad, 1)


def test_credentials_are_redacted_with_and_without_their_newline() -> None:
    loaded = credentials.Loaded(((0, "db", "/etc/x", b"hunter22-secret\n"),))
    assert set(loaded.redacted()) == {b"hunter22-secret\n", b"hunter22-secret"}
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

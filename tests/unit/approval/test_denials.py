"""approval/denials.py: a person's denial keyed by what would run (issue 45), pure."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from airlock.approval import denials
from airlock.approval.denials import DenialMemory, Meaning
from airlock.common.config import load

ID = {"path": "/usr/bin/id", "dev": 8, "ino": 42}


def command(argv: list[str], resolved: str, binary: dict[str, object] | None = None, uid: int = 1000) -> Meaning:
    return denials.of_command(uid, 0, [argv], [resolved], [binary or ID])


def memory(*denied: Meaning, at: float = 100.0) -> DenialMemory:
    out = DenialMemory()
    out.known = True
    for meaning in denied:
        out.add(meaning, at)
    return out


def test_spelling_does_not_matter_but_what_runs_does() -> None:
    known = memory(command(["id", "-u"], "/usr/bin/id"))
    assert known.covers(command(["/usr/bin/id", "-u"], "/usr/bin/id"), 200.0, 3600)
    assert known.covers(command(["/tmp/x/link", "-u"], "/usr/bin/id"), 200.0, 3600)
    # Another path to the same file (a hard link): the identity the ticket binds.
    assert known.covers(command(["/opt/id2", "-u"], "/opt/id2", {"path": "/opt/id2", "dev": 8, "ino": 42}), 200, 3600)
    assert not known.covers(command(["id", "-g"], "/usr/bin/id"), 200.0, 3600)  # other arguments
    assert not known.covers(command(["id", "-u"], "/usr/bin/id", uid=1001), 200.0, 3600)  # another requester
    other = denials.of_command(1000, 33, [["id", "-u"]], ["/usr/bin/id"], [ID])
    assert not known.covers(other, 200.0, 3600)  # another run-as
    assert not known.covers(command(["true", "-u"], "/usr/bin/true", {"dev": 8, "ino": 7}), 200.0, 3600)


def test_kept_for_its_time_and_everything_is_denied_until_known() -> None:
    meaning = command(["id"], "/usr/bin/id")
    assert memory(meaning).covers(meaning, 100.0 + 3600, 3600)
    assert not memory(meaning).covers(meaning, 100.0 + 3601, 3600)
    assert DenialMemory().covers(command(["true"], "/usr/bin/true"), 0.0, 1.0)  # not loaded: people decide
    pruned = memory(meaning)
    pruned.forget_before(101.0)
    assert len(pruned) == 0


def test_file_operations_keep_tool_and_path_apart() -> None:
    write = denials.of_file(1000, 0, "files_write", "/etc/motd", "/etc/motd")
    known = memory(write)
    assert known.covers(denials.of_file(1000, 0, "files_write", "/etc/motd", "/etc/../etc/motd"), 200, 3600)
    assert not known.covers(denials.of_file(1000, 0, "files_read", "/etc/motd", "/etc/motd"), 200, 3600)


def test_a_journaled_meaning_reads_back_and_garbage_does_not() -> None:
    meaning = denials.of_command(1000, 0, [["id", "-u"], ["cat"]], ["/usr/bin/id", "/usr/bin/cat"], [ID, ID])
    assert Meaning.from_dict(meaning.to_dict() | {"at": 5.0}) == meaning
    bads: list[object] = [
        None,
        [],
        {"uid": "1000", "run_as": 0, "stages": []},
        {"uid": 1, "run_as": 0, "stages": [{}]},
        {"uid": True, "run_as": 0, "stages": [{"path": "/x", "dev": 1, "ino": 1, "args": []}]},
        {"uid": 1, "run_as": 0, "stages": [{"path": "/x", "dev": 1, "ino": 1, "args": [3]}]},
    ]
    for bad in bads:
        assert Meaning.from_dict(bad) is None


def test_denials_unreadable_at_start_keep_everything_denied_until_read(monkeypatch: pytest.MonkeyPatch) -> None:
    from airlock.approval import reviewing
    from airlock.common.errors import AirlockError, ErrorCode
    from airlock.common.wire.journal import Found

    class Flaky:
        calls = 0

        async def call(self, verb: object, args: object, *, timeout: float | None = None) -> Found:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "journal down")
            denial = command(["id"], "/usr/bin/id").to_dict() | {"at": time.time()}
            return Found(({"seq": 1, "payload": {"denial": denial}},))

    class Log:
        def __getattr__(self, name: str) -> Any:
            return lambda *a, **k: None

    monkeypatch.setattr(reviewing, "RESTORE_RETRY_SECONDS", 0.01)
    config = load(None)
    review = reviewing.Reviewing(lambda: config, lambda: None, None, None, Flaky(), Log())  # type: ignore[arg-type, return-value]

    async def body() -> None:
        await review.restore_denials()
        assert not review.memory.known and review.memory.covers(command(["true"], "/usr/bin/true"), 0, 1)
        for _ in range(100):
            if review.memory.known:
                break
            await asyncio.sleep(0.01)
        assert review.memory.known
        assert review.memory.covers(command(["id"], "/usr/bin/id"), time.time(), 60)
        other = command(["true"], "/usr/bin/true", {"dev": 8, "ino": 7})
        assert not review.memory.covers(other, time.time(), 60)

    asyncio.run(body())

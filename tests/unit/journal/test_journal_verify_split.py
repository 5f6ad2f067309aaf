"""A long chain walk split with a helper process (journal/verification.py, spanwalk.py, spanchild.py).

On a real database file: the split walk answers exactly as the one walk does,
good or tampered at and around the span's edges; a helper that cannot start,
crashes, hangs or prints nonsense costs time, never the answer; every wait
is bounded and no helper outlives the walk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from journal_support import tamper
from structlog.testing import capture_logs
from test_journal_verify_fast import _long_chain

from airlock.journal import spanchild, spans, spanwalk, verification
from airlock.journal.chain import VerifyResult
from airlock.journal.schema import _COLUMNS, _reader
from airlock.journal.store import Store

N = 60  # two spans of 30: the walk keeps 1-30, a helper walks 31-60


@pytest.fixture
def database(tmp_path: Path) -> Path:
    path = tmp_path / "journal.sqlite"

    async def create() -> None:
        await Store.open(path).close()

    asyncio.run(create())
    conn = sqlite3.connect(path, isolation_level=None)
    conn.executemany(f"INSERT INTO events ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", _long_chain(N))
    conn.close()
    return path


@pytest.fixture(autouse=True)
def _even_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of 30 and 30 (the walk's head start, thousands of seqs, would leave the helper one)."""
    monkeypatch.setattr(verification, "HELPER_START_RECORDS", 0)


def _walk(path: Path, **kw: Any) -> VerifyResult:
    conn = _reader(path)
    try:
        conn.execute("BEGIN")
        return verification._verify_chain(conn, kw.pop("from_seq", None), kw.pop("anchor", None), **kw)
    finally:
        conn.close()


def _split(path: Path, **kw: Any) -> VerifyResult:
    return _walk(path, helpers=1, split_min=1, **kw)


def _one(path: Path, **kw: Any) -> VerifyResult:
    return _walk(path, helpers=0, **kw)


class Joins:
    """`spans.join`'s answers during a walk (True: a helper's span was taken)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.answers: list[bool] = []
        real = spans.join

        def spy(*args: Any) -> bool:
            self.answers.append(real(*args))
            return self.answers[-1]

        monkeypatch.setattr(spans, "join", spy)


def test_a_good_chain_is_walked_in_two_processes(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    joins = Joins(monkeypatch)
    result = _split(database)
    assert joins.answers == [True]  # the helper's span was taken, not walked again
    assert result == _one(database)
    assert result.ok and result.checked == N and result.head_seq == N


def test_a_short_walk_is_not_split(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    joins = Joins(monkeypatch)
    assert _walk(database, helpers=1, split_min=N + 1) == _one(database)
    assert joins.answers == []


@pytest.mark.parametrize("seq", [29, 30, 31, 32, 45, 59, 60])
@pytest.mark.parametrize(
    "edit",
    [
        "UPDATE events SET writer = 'forger' WHERE seq = {seq}",
        "UPDATE events SET payload = ' ' || payload WHERE seq = {seq}",
        "UPDATE events SET hash = replace(hash, substr(hash, 1, 1), 'g') WHERE seq = {seq}",
        "UPDATE events SET prev_hash = hash WHERE seq = {seq}",
        "DELETE FROM events WHERE seq = {seq}",
    ],
)
def test_a_record_changed_at_or_near_the_span_edge_is_reported_as_the_one_walk_does(
    database: Path, seq: int, edit: str
) -> None:
    tamper(database, edit.format(seq=seq))
    one = _one(database)
    assert not one.ok or (edit.startswith("DELETE") and seq == N)  # cutting the last record is for anchors
    assert _split(database) == one


@pytest.mark.parametrize("how", ["trust", "prev", "anchor"])
def test_a_walk_from_a_start_point_is_split_the_same(database: Path, how: str) -> None:
    rows = _long_chain(N)
    kw: dict[str, Any] = {"from_seq": 11}
    if how == "prev":
        kw["prev_hash"] = rows[9][10]
    elif how == "anchor":
        kw["anchor"] = rows[10][10]
    good = _split(database, **kw)
    assert good == _one(database, **kw) and good.ok and good.checked == N - 10
    tamper(database, "UPDATE events SET kind = 'x' WHERE seq = 36")  # the helper's first record (36-60)
    assert _split(database, **kw) == _one(database, **kw)
    assert _one(database, **kw).first_bad_seq == 36


def _tampered_in_the_helpers_span(database: Path) -> VerifyResult:
    tamper(database, "UPDATE events SET session = 'elsewhere' WHERE seq = 44")
    one = _one(database)
    assert not one.ok and one.first_bad_seq == 44
    return one


def test_a_helper_that_cannot_start_leaves_the_walk_to_one_process(
    database: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one = _tampered_in_the_helpers_span(database)
    monkeypatch.setattr(sys, "executable", str(database.parent / "no-such-python"))
    joins = Joins(monkeypatch)
    assert _split(database) == one
    assert joins.answers == []  # no helper: no span to join


@pytest.mark.parametrize(
    "entry",
    [
        "import sys; sys.exit(3)",  # crashes
        "print('{\"ok\": true}')",  # says something that is not a result
        "print('not json at all')",
        "import os; os.kill(os.getpid(), 9)",
    ],
)
def test_a_helper_that_gives_no_result_costs_time_never_the_answer(
    database: Path, monkeypatch: pytest.MonkeyPatch, entry: str
) -> None:
    one = _tampered_in_the_helpers_span(database)
    monkeypatch.setattr(spanwalk, "_ENTRY", entry)
    with capture_logs() as events:
        assert _split(database) == one
    assert [e["event"] for e in events] == ["journal.span_helper.failed"]  # the operator sees why it was slower


def _spy_on_helpers(monkeypatch: pytest.MonkeyPatch) -> list[spanwalk.Helper]:
    """The helpers the walk starts, as it starts them (to see each stopped and waited for)."""
    started: list[spanwalk.Helper] = []
    real = spanwalk.Helper.start

    def spy(path: str, part: spans.Span) -> spanwalk.Helper | None:
        helper = real(path, part)
        if helper is not None:
            started.append(helper)
        return helper

    monkeypatch.setattr(spanwalk.Helper, "start", staticmethod(spy))
    return started


def test_a_helper_that_hangs_is_stopped_at_its_deadline(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one = _tampered_in_the_helpers_span(database)
    monkeypatch.setattr(spanwalk, "_ENTRY", "import time; time.sleep(60)")
    monkeypatch.setattr(verification, "HELPER_SLACK_SECONDS", 0.5)
    started = _spy_on_helpers(monkeypatch)
    began = time.monotonic()
    assert _split(database) == one
    assert time.monotonic() - began < 10
    assert len(started) == 1 and started[0].proc.returncode is not None  # stopped and waited for


def test_a_helper_is_stopped_when_the_walk_fails_first(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tamper(database, "UPDATE events SET kind = 'x' WHERE seq = 3")
    monkeypatch.setattr(spanwalk, "_ENTRY", "import time; time.sleep(60)")
    started = _spy_on_helpers(monkeypatch)
    began = time.monotonic()
    result = _split(database)
    assert result == _one(database) and result.first_bad_seq == 3
    assert time.monotonic() - began < spanwalk.STOP_GRACE + 5
    assert len(started) == 1 and started[0].proc.returncode is not None


@pytest.mark.parametrize(
    "args",
    [[], ["relative.sqlite", "2", "3", "a" * 64], ["/x.sqlite", "1", "3", "a" * 64], ["/x.sqlite", "4", "3", "a" * 64]],
)
def test_the_helper_refuses_arguments_that_are_not_a_span(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert spanchild.main(args) == 2
    assert "usage: spanchild" in capsys.readouterr().err


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"[]",
        b'{"ok":true}',
        b'{"ok":1,"checked":1,"first_bad_seq":null,"reason":null,"head_seq":1,"head_hash":"' + b"a" * 64 + b'"}',
        b'{"ok":true,"checked":1,"first_bad_seq":null,"reason":null,"head_seq":1,"head_hash":"A"}',
        b'{"ok":true,"checked":1,"first_bad_seq":null,"reason":null,"head_seq":1,"head_hash":"'
        + b"a" * 64
        + b'","x":1}',
    ],
)
def test_only_a_whole_result_is_read_from_a_helper(line: bytes) -> None:
    assert spanwalk.parse_result(line) is None


def test_a_result_survives_the_trip_from_the_helper() -> None:
    result = VerifyResult(False, 7, 9, "seq 9: hash does not match the record's content", 8, "b" * 64)
    assert spanwalk.parse_result(json.dumps(result.to_dict()).encode()) == result


def test_the_journals_verify_and_verify_full_split_a_long_walk(database: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What `airlock audit verify` and `--full` run (`Store.verify`, `Store.verify_full`), with 60 records
    counting as long: the same answers as one walk, the helper's span taken."""
    monkeypatch.setattr(verification, "SPLIT_MIN_RECORDS", 1)
    monkeypatch.setattr(verification, "_helpers", lambda: 1)
    joins = Joins(monkeypatch)

    async def both() -> tuple[VerifyResult, dict[str, Any]]:
        store = Store.open(database)
        try:
            return store.verify(), store.verify_full()
        finally:
            await store.close()

    walked, full = asyncio.run(both())
    assert joins.answers == [True, True]
    assert walked == _one(database) and walked.ok and walked.checked == N
    assert full["ok"] and full["live"] == walked.to_dict()
    tamper(database, "UPDATE events SET payload = '{\"i\":1}' WHERE seq = 50")
    walked, full = asyncio.run(both())
    assert walked == _one(database) and walked.first_bad_seq == 50
    assert not full["ok"] and full["first_bad_seq"] == 50 and full["live"] == walked.to_dict()

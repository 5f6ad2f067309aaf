"""Incremental verification cannot be moved past a broken record (issue 38), against live stacks.

`airlock audit verify` starts from the last verified point: the newest
``chain.verified`` record the journal wrote after a verify that checked out
*and anchored at that very record*.  The attacker has the database file
while the journal is stopped: breaks a record written after the last verify
(an edit, no rehash) and appends a forged ``chain.verified`` record at the
head, linked and hashed correctly, claiming everything up to the head was
verified.  The forged record has no anchor of its own, so verify starts at
the real point and reaches the broken record.

Controls: the untampered stack verifies, and the verify after a restart is
incremental (starts at the recorded point, checks only what is new).  The
trade-off is shown too: a record broken *before* the verified point is
caught by ``--full``, not by the incremental walk (docs/security.md).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from secsupport import forge_record

from airlock.common.codec import canonical_json

from support import Stack, start_stack, stop_stack


def _run(stack: Stack, n: int) -> None:
    for _ in range(n):
        assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True


def _verify(stack: Stack, *extra: str) -> tuple[int, dict[str, Any]]:
    result = stack.cli("audit", "verify", "--json", *extra)
    assert result.stdout, result.stderr
    reply = json.loads(result.stdout)
    return result.returncode, reply.get("data") or reply


def _db(db: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(db, isolation_level=None)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    return conn


def _break(db: Path, seq: int) -> None:
    """Edit one record's payload in place, hash left as it was."""
    conn = _db(db)
    try:
        (payload,) = conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
        edited = canonical_json(json.loads(payload) | {"forged": True}).decode()
        conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (edited, seq))
    finally:
        conn.close()


def _forge_verified(db: Path) -> int:
    """Append a correctly linked chain.verified record that claims the head was verified; its seq."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        seq, digest = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    return forge_record(db, "chain.verified", {"seq": seq, "hash": digest, "checked": seq, "mode": "full"})


def _kinds(db: Path) -> dict[int, str]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return {int(s): str(k) for s, k in conn.execute("SELECT seq, kind FROM events")}


def test_a_forged_verified_point_does_not_skip_a_broken_record(tmp_path_factory: pytest.TempPathFactory) -> None:
    runtime = Path(tmp_path_factory.mktemp("vi")) / "rt"
    db = runtime / "state" / "journal.sqlite"
    s = start_stack(runtime)
    try:
        _run(s, 2)
        code, data = _verify(s)
        assert code == 0 and data["ok"] and data["mode"] == "full", data  # control: the first verify walks all
        point = data["recorded"]["seq"]
        _run(s, 2)
    finally:
        stop_stack(s)

    s = start_stack(runtime)  # control: after a restart, verify starts at the recorded point
    try:
        _run(s, 1)
        code, data = _verify(s)
        assert code == 0 and data["ok"] and data["mode"] == "incremental", data
        assert data["verified"]["record_seq"] == point, data
        assert data["checked"] == data["head_seq"] - data["verified"]["seq"] + 1 < data["head_seq"], data
        full_code, full = _verify(s, "--full")
        assert full_code == 0 and full["mode"] == "full" and full["checked"] == full["head_seq"], full
        point = full["recorded"]["seq"]
        _run(s, 2)
    finally:
        stop_stack(s)

    kinds = _kinds(db)
    after = [seq for seq, kind in kinds.items() if seq > point and kind == "request.received"]
    broken = after[0]
    _break(db, broken)
    forged = _forge_verified(db)

    s = start_stack(runtime)
    try:
        code, data = _verify(s)
        assert code == 1 and data["ok"] is False and data["first_bad_seq"] == broken, data
        assert data["mode"] == "incremental" and data["verified"]["record_seq"] == point != forged, data
    finally:
        stop_stack(s)


def test_a_record_broken_before_the_verified_point_needs_full(tmp_path_factory: pytest.TempPathFactory) -> None:
    runtime = Path(tmp_path_factory.mktemp("vf")) / "rt"
    db = runtime / "state" / "journal.sqlite"
    s = start_stack(runtime)
    try:
        _run(s, 2)
        code, data = _verify(s)
        assert code == 0 and data["ok"], data
        point = data["verified"] or data["recorded"]
    finally:
        stop_stack(s)
    before = next(seq for seq, kind in _kinds(db).items() if kind == "request.received")
    _break(db, before)
    s = start_stack(runtime)
    try:
        code, data = _verify(s)
        assert code == 0 and data["mode"] == "incremental", data  # the walk starts after it: documented
        code, data = _verify(s, "--full")
        assert code == 1 and data["first_bad_seq"] == before, data
        assert point
    finally:
        stop_stack(s)

"""An audit that cannot be quietly cut or rewritten (issue 16), against live stacks.

The attacker has the database file (as root or the journal's user would) and
edits it while the journal is stopped: deletes the newest records, or rewrites
one and recomputes every later hash, and drops the triggers on the way.  The
anchors file beside the database (and journald, tests/system) still holds the
heads the journal wrote; verify compares, and a journal that starts on a
mismatch refuses to serve until an operator acknowledges it.

Each test first shows the setup working untampered (the control), so none can
pass vacuously.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airlock.journal.chain import compute_hash

from support import Stack, start_stack, stop_stack

EVERY_RECORD = "journal:\n  anchor_every_records: 1\n"


def _stack(tmp: pytest.TempPathFactory, config: str | None = None) -> tuple[Path, Path | None]:
    runtime = Path(tmp.mktemp("ch")) / "rt"
    path = None
    if config is not None:
        path = runtime.parent / "cfg.yaml"
        path.write_text(config, encoding="utf-8")
    return runtime, path


def _run(stack: Stack, n: int = 2) -> None:
    for _ in range(n):
        assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True


def _attack(db: Path, *statements: str, params: tuple[Any, ...] = ()) -> None:
    """Edit the database as someone with the file would: triggers off first."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        for statement in statements:
            conn.execute(statement, params)
    finally:
        conn.close()


def _rewrite_and_rehash(db: Path, seq: int) -> None:
    """Change record ``seq``'s payload and recompute its hash and every later one: the chain stays whole."""
    _attack(db)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        rows = [dict(r) for r in conn.execute("SELECT * FROM events WHERE seq >= ? ORDER BY seq", (seq - 1,))]
        prev = rows[0]["hash"]
        for row in rows[1:]:
            payload = json.loads(row["payload"])
            if row["seq"] == seq:
                payload = payload | {"forged": True}
            text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            digest = compute_hash(row | {"payload": payload, "prev_hash": prev})
            conn.execute(
                "UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?", (text, prev, digest, row["seq"])
            )
            prev = digest
    finally:
        conn.close()


def _verify(stack: Stack, *extra: str) -> tuple[int, dict[str, Any]]:
    result = stack.cli("audit", "verify", "--json", *extra)
    assert result.stdout, result.stderr
    reply = json.loads(result.stdout)
    return result.returncode, reply.get("data") or reply


def _acknowledge(runtime: Path, reason: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "airlock",
            "audit",
            "acknowledge",
            "--config",
            str(runtime / "airlock.yaml"),
            "--reason",
            reason,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _max_seq(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT MAX(seq) FROM events").fetchone()[0])


def test_a_cut_tail_is_detected_and_the_journal_refuses_until_acknowledged(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    runtime, config = _stack(tmp_path_factory)
    s = start_stack(runtime, config)
    try:
        _run(s)
        code, data = _verify(s)
        assert code == 0 and data["ok"] and data["anchors"]["checked"] >= 1  # control: untampered is fine
    finally:
        stop_stack(s)
    db = runtime / "state" / "journal.sqlite"
    head = _max_seq(db)
    cut = head - 4
    # Delete the last rows and lower the high-water mark too: only the anchors remember.
    _attack(db, f"DELETE FROM events WHERE seq > {cut}", f"UPDATE chain_high SET seq = {cut}")

    s = start_stack(runtime, config)
    try:
        refused = s.exec({"argv": ["true"], "privileged": False})
        assert refused["ok"] is False and refused["error"]["code"] == "audit_unavailable", refused
        assert "does not match its anchors" in refused["error"]["message"]
        code, data = _verify(s)
        assert code == 1 and data["ok"] is False and data["first_bad_seq"] == cut + 1, data
        assert data["chain"]["ok"] is True  # the chain alone cannot see a cut tail
        text = s.cli("audit", "verify")
        assert text.returncode == 1 and f"FAILED at record {cut + 1}" in text.stdout, text.stdout
        log = (runtime / "logs" / "journal.log").read_text()
        assert "journal.chain.mismatched" in log and "bf4b97f7a56d42f9ace8b36d1b309c23" in log
    finally:
        stop_stack(s)

    ack = _acknowledge(runtime, "restored the disk; the cut is under investigation")
    assert ack.returncode == 0, ack.stdout + ack.stderr
    assert _max_seq(db) == head + 1  # above every seq ever anchored: none is reused

    s = start_stack(runtime, config)
    try:
        _run(s, 1)
        code, data = _verify(s)
        assert code == 0 and data["ok"], data
        assert [seg["seq"] for seg in data["segments"]] == [head + 1]
        assert data["segments"][0]["previous_seq"] == cut and data["anchors"]["acknowledged"] >= 1
        assert "segment: from seq" in s.cli("audit", "verify").stdout
    finally:
        stop_stack(s)


def test_rewrite_with_rehash_is_detected_at_the_rewritten_seq(tmp_path_factory: pytest.TempPathFactory) -> None:
    runtime, config = _stack(tmp_path_factory, EVERY_RECORD)
    s = start_stack(runtime, config)
    try:
        _run(s)
        assert _verify(s)[0] == 0
    finally:
        stop_stack(s)
    db = runtime / "state" / "journal.sqlite"
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        (target,) = conn.execute("SELECT MIN(seq) FROM events WHERE kind = 'exec.started'").fetchone()
    _rewrite_and_rehash(db, target)

    s = start_stack(runtime, config)
    try:
        # Control: the chain by itself checks out, as the issue found.
        code, chain_only = _verify(s, "--anchors", "none")
        assert code == 0 and chain_only["ok"] is True
        # Reported at the first anchored seq at or after the rewrite (with an anchor
        # after every commit that is the rewritten record itself, unless a commit
        # came while the previous anchor was still being written).
        anchored = sorted(
            json.loads(line)["seq"] for line in (runtime / "state" / "journal.anchors").read_text().splitlines()
        )
        expected = min(seq for seq in anchored if seq >= target)
        code, data = _verify(s)
        assert code == 1 and data["first_bad_seq"] == expected and "hash differs from its anchor" in data["reason"]
        refused = s.exec({"argv": ["true"], "privileged": False})
        assert refused["error"]["code"] == "audit_unavailable"
    finally:
        stop_stack(s)


def test_dropped_triggers_are_recreated_at_start(tmp_path_factory: pytest.TempPathFactory) -> None:
    runtime, config = _stack(tmp_path_factory)
    s = start_stack(runtime, config)
    stop_stack(s)
    db = runtime / "state" / "journal.sqlite"
    _attack(db)  # drop every trigger, change nothing else
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'").fetchone()[0] == 0
        conn.execute("UPDATE events SET kind = kind WHERE seq = 1")  # control: updates go through now
    s = start_stack(runtime, config)
    try:
        _run(s, 1)  # nothing was cut or rewritten: it serves
        conn = sqlite3.connect(db)
        try:
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute("UPDATE events SET kind = kind WHERE seq = 1")
            with pytest.raises(sqlite3.DatabaseError, match="append-only"):
                conn.execute("DELETE FROM events WHERE seq = 1")
        finally:
            conn.close()
        log = (runtime / "logs" / "journal.log").read_text()
        restored = [json.loads(line) for line in log.splitlines() if "journal.trigger.restored" in line]
        assert {"events_no_update", "events_no_delete"} <= {r["trigger"] for r in restored}
        assert all(r["level"] == "warning" for r in restored)
    finally:
        stop_stack(s)


def test_deleted_seqs_are_not_written_again(tmp_path_factory: pytest.TempPathFactory) -> None:
    runtime, config = _stack(tmp_path_factory, "journal:\n  anchor_every_records: 0\n  anchor_every_seconds: 0\n")
    s = start_stack(runtime, config)
    stop_stack(s)
    db = runtime / "state" / "journal.sqlite"
    head = _max_seq(db)
    anchors = runtime / "state" / "journal.anchors"
    anchors.unlink(missing_ok=True)  # no anchors at all: the high-water mark alone must catch it
    _attack(db, f"DELETE FROM events WHERE seq > {head - 2}")
    assert _max_seq(db) == head - 2  # control: the rows are gone
    s = start_stack(runtime, config)
    try:
        refused = s.exec({"argv": ["true"], "privileged": False})
        assert refused["error"]["code"] == "audit_unavailable"
        code, data = _verify(s, "--anchors", "none")
        assert code == 1 and data["first_bad_seq"] == head - 1 and data["high_water"] == head
    finally:
        stop_stack(s)
    assert _acknowledge(runtime, "tail lost in a crash test").returncode == 0
    s = start_stack(runtime, config)
    try:
        _run(s, 1)
        seqs = [r["seq"] for r in s.journal_rows()]
        assert not set(range(head - 1, head + 1)) & set(seqs)  # the deleted numbers stay unused
        assert seqs == sorted(seqs) and seqs[-1] > head
    finally:
        stop_stack(s)

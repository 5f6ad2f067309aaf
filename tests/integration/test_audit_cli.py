"""`airlock audit verify | head | export` and `airlock events` against a live stack (issue 7)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from support import Stack, now_iso, start_stack, stop_stack


def test_verify_head_and_export(stack: Stack) -> None:
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"] is True
    verify = stack.cli("audit", "verify")
    assert verify.returncode == 0 and verify.stdout.startswith("ok:"), verify.stdout + verify.stderr
    head = stack.cli("audit", "head").stdout.split()
    seq, digest = int(head[0]), head[1]
    assert seq > 0 and len(digest) == 64
    anchored = stack.cli("audit", "verify", "--from", str(seq), "--anchor", digest)
    assert anchored.returncode == 0, anchored.stdout + anchored.stderr
    exported = [json.loads(line) for line in stack.cli("audit", "export").stdout.splitlines()]
    assert [e["seq"] for e in exported] == list(range(1, len(exported) + 1))
    assert len(exported) >= seq
    recent = [json.loads(line) for line in stack.cli("audit", "export", "--since", now_iso(3600)).stdout.splitlines()]
    assert recent == []


def test_events_paging_follows_reference_004(stack: Stack) -> None:
    for _ in range(3):
        stack.exec({"argv": ["true"], "privileged": False})
    page = stack.native("events", {"tail": 5}, path=stack.operator)["data"]
    assert len(page["events"]) == 5 and page["latest"] == page["events"][-1]["seq"]
    first = stack.native("events", {"after": 0, "limit": 2}, path=stack.operator)["data"]
    assert [e["seq"] for e in first["events"]] == [1, 2] and first["next_cursor"] == 2
    nxt = stack.native("events", {"after": first["next_cursor"], "limit": 2}, path=stack.operator)["data"]
    assert [e["seq"] for e in nxt["events"]] == [3, 4]
    assert stack.native("events", {"limit": 1000}, path=stack.operator)["error"]["code"] == "invalid_arguments"


def test_verify_names_the_first_bad_record_after_tampering(tmp_path_factory: pytest.TempPathFactory) -> None:
    s = start_stack(Path(tmp_path_factory.mktemp("tamper")))
    try:
        for _ in range(2):
            s.exec({"argv": ["true"], "privileged": False})
        with sqlite3.connect(s.database) as conn:
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'").fetchall():
                conn.execute(f"DROP TRIGGER {name}")
            (seq,) = conn.execute("SELECT min(seq) FROM events WHERE kind = 'exec.started'").fetchone()
            conn.execute("UPDATE events SET payload = replace(payload, 'true', 'rm') WHERE seq = ?", (seq,))
        result = s.cli("audit", "verify")
        assert result.returncode == 1 and f"FAILED at record {seq}" in result.stdout, result.stdout
    finally:
        stop_stack(s)

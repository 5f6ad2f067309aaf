"""Journal records forged to excuse what an attacker did (issue 51), against live stacks.

The attacker has root on the journal's files while it is stopped:

1. deletes a sealed segment (to hide what it held) and appends to the live
   database a correctly linked and hashed ``segment.deleted`` record naming
   exactly that segment (range and final hash), as retention would.  A
   deletion counts only where an anchor the journal wrote names that very
   record (the journal anchors each one as it writes it), so ``audit verify
   --full`` names the missing segment.  Control: retention's own deletion
   verifies (tests/security/test_sec_segments.py), and the untouched
   history does here.
2. (a forged ``chain.verified`` moving incremental verification past a
   broken record: tests/security/test_sec_verify_incremental.py, where the
   attack fails for the same reason: the journal anchors its own.)
3. An agent floods requests to fill the disk until retention deletes old
   audit segments.  With the defaults (``journal.archive_delete_when:
   never``) retention moves sealed segments to the archive past its limits
   but never deletes one: however much an agent writes, the history stays
   and verifies.  Deleting takes an operator's ``confirmed`` (or a
   collector's ``shipped``) setting: test_sec_segments.py.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from secsupport import agent_exec, forge_record, needs_root, red_stack, throwaway_user

from airlock.journal import segments

from support import Stack, start_stack, stop_stack

SMALL = "journal:\n  segment_max_bytes: 131072\n"


def _stack(runtime: Path) -> Stack:
    path = runtime.parent / "cfg.yaml"
    path.write_text(SMALL, encoding="utf-8")
    return start_stack(runtime, path)


def _verify_full(stack: Stack) -> tuple[int, dict[str, Any]]:
    result = stack.cli("audit", "verify", "--full", "--json", timeout=120)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout).get("data") or {}


def test_a_forged_segment_deleted_record_does_not_excuse_a_missing_segment(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    runtime = Path(tmp_path_factory.mktemp("forge")) / "rt"
    db = runtime / "state" / "journal.sqlite"
    s = _stack(runtime)
    try:
        while len(sorted((runtime / "state" / "segments").glob("journal-*.db"))) < 3:
            assert s.exec({"argv": ["true"], "privileged": False}, id=str(uuid.uuid4()))["ok"] is True
        code, data = _verify_full(s)
        assert code == 0 and data["ok"], data  # control: the untouched history verifies
    finally:
        stop_stack(s)
    files = sorted((runtime / "state" / "segments").glob("journal-*.db"))
    hidden = segments.verify_file(files[1])
    assert hidden["ok"] and hidden["segment"] == 2, hidden
    os.unlink(files[1])
    forged = forge_record(
        db,
        "segment.deleted",
        {
            "segment": hidden["segment"],
            "first_seq": hidden["first_seq"],
            "last_seq": hidden["last_seq"],
            "final_hash": hidden["final_hash"],
            "file": os.path.basename(files[1]),
            "reason": "archive_max_bytes",
        },
    )
    s = _stack(runtime)
    try:
        code, data = _verify_full(s)
        assert code == 1 and data["ok"] is False, data
        assert "segment 2" in data["reason"] and f"seq {forged}" in data["reason"], data
    finally:
        stop_stack(s)


@needs_root
def test_an_agent_filling_the_disk_never_makes_retention_delete_with_the_defaults() -> None:
    with throwaway_user("alfill") as agent:
        # Small segments and every archive limit exceeded at once; archive_delete_when left at its default.
        config = f"""
agents:
  users: [{agent.pw_name}]
policy:
  default: deny
  rules:
    - name: flood
      decision: allow
      privileged: false
      commands: [[/usr/bin/true]]
journal:
  segment_max_bytes: 131072
  retention_max_bytes: 1
  archive_max_bytes: 1
  archive_max_age: 1
"""
        with red_stack(config) as s:
            archive = s.runtime_dir / "state" / "journal-archive"
            sealed = s.runtime_dir / "state" / "segments"
            sent = 0
            while len(list(sealed.glob("journal-*.db")) + list(archive.glob("journal-*.db"))) < 3:
                assert agent_exec(s.agent, agent, {"argv": ["true"], "privileged": False})["ok"] is True
                sent += 1
                assert sent < 600, "the journal never sealed a segment"
            listing = s.cli("audit", "archive", "--json")
            assert listing.returncode == 0, listing.stdout + listing.stderr
            report = json.loads(listing.stdout)["data"]
            # Past every limit, and still kept: the default never deletes, and says why.
            assert report["kept"] and not report["deleted"], report
            assert report["kept"][0]["why"] == "journal.archive_delete_when is never", report["kept"]
            assert {k["why"] for k in report["kept"][1:]} <= {"an older segment is kept"}, report["kept"]
            rows = s.journal_rows()
            assert not [r for r in rows if r["kind"] == "segment.deleted"]
            code, data = _verify_full(s)
            assert code == 0 and data["ok"] and not data["full"]["deleted"], data

"""Sealed audit segments an attacker deletes or swaps (issue 38), against a live stack.

The journal seals its live database into read-only segment files as it
grows (a small ``journal.segment_max_bytes`` here).  The attacker has root on
the files: removes a sealed segment to hide what it held, or puts another
segment (valid on its own, from another journal) in its place.  ``airlock
audit verify --full`` walks every segment, each on its own and linked into
one chain, and names the break; the control shows the untouched history
verifying, the story of a request sealed away still shown in full, and retention's
journaled deletion accepted where a silent one is not.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from support import Stack, start_stack, stop_stack

SMALL = "journal:\n  segment_max_bytes: 131072\n"


def _stack(tmp: pytest.TempPathFactory, config: str) -> Stack:
    runtime = Path(tmp.mktemp("seg")) / "rt"
    path = runtime.parent / "cfg.yaml"
    path.write_text(config, encoding="utf-8")
    return start_stack(runtime, path)


def _fill(stack: Stack, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        rid = str(uuid.uuid4())
        assert stack.exec({"argv": ["true"], "privileged": False}, id=rid)["ok"] is True
        ids.append(rid)
    return ids


def _segments(stack: Stack) -> list[Path]:
    return sorted((stack.runtime_dir / "state" / "segments").glob("journal-*.db"))


def _verify_full(stack: Stack) -> tuple[int, dict[str, Any]]:
    result = stack.cli("audit", "verify", "--full", "--json", timeout=120)
    assert result.stdout, result.stderr
    return result.returncode, json.loads(result.stdout).get("data") or {}


def _filled(stack: Stack) -> list[str]:
    ids: list[str] = []
    while len(_segments(stack)) < 3:
        ids += _fill(stack, 10)
        assert len(ids) < 400, "the journal never sealed a segment"
    return ids


def test_a_deleted_or_swapped_sealed_segment_is_caught_by_verify_full(tmp_path_factory: pytest.TempPathFactory) -> None:
    other = _stack(tmp_path_factory, SMALL)
    try:
        _filled(other)
        foreign = _segments(other)[1]
    finally:
        stop_stack(other)
    s = _stack(tmp_path_factory, SMALL)
    try:
        ids = _filled(s)
        files = _segments(s)
        assert all(os.stat(f).st_mode & 0o777 == 0o440 for f in files)
        # Control: the whole history verifies, a request sealed away still has its whole story.
        code, data = _verify_full(s)
        assert code == 0 and data["ok"] and data["full"]["segments"] >= len(files), data
        shown = s.cli("show", ids[0], "--json")
        assert shown.returncode == 0 and "exec.finished" in shown.stdout and "request.received" in shown.stdout
        one = s.cli("audit", "verify", "--segment", str(files[1]))
        assert one.returncode == 0 and one.stdout.startswith("ok: segment 2"), one.stdout + one.stderr
        lifecycle = s.cli("audit", "verify", "--lifecycle", "--json", timeout=120)
        assert lifecycle.returncode == 0, lifecycle.stdout

        # Attack 1: a sealed segment removed.
        aside = files[1].with_name("aside")
        os.rename(files[1], aside)
        code, data = _verify_full(s)
        assert code == 1 and data["ok"] is False and "segment 2 is missing" in data["reason"], data
        os.rename(aside, files[1])
        assert _verify_full(s)[0] == 0  # restored: fine again

        # Attack 2: another journal's segment 2 (valid on its own) in its place.
        os.unlink(files[1])
        shutil.copyfile(foreign, files[1])
        assert s.cli("audit", "verify", "--segment", str(files[1])).returncode == 0
        code, data = _verify_full(s)
        assert code == 1 and data["ok"] is False and "does not link" in data["reason"], data
        # The default verify sees it too where an anchor (written at every rollover) falls in that segment.
        assert s.cli("audit", "verify").returncode == 1
    finally:
        stop_stack(s)


def test_retention_deletes_only_when_confirmed_and_journals_it(tmp_path_factory: pytest.TempPathFactory) -> None:
    config = SMALL + "  retention_max_bytes: 1\n  archive_max_bytes: 1\n  archive_delete_when: confirmed\n"
    s = _stack(tmp_path_factory, config)
    try:
        archive = s.runtime_dir / "state" / "journal-archive"
        ids: list[str] = []
        while len(list(archive.glob("journal-*.db"))) < 2:
            ids += _fill(s, 10)
            assert len(ids) < 400, "nothing was archived"
        archived = sorted(archive.glob("journal-*.db"))
        # Past the archive's limit, but not confirmed: nothing is deleted, and verify walks the archive.
        listing = s.cli("audit", "archive")
        assert listing.returncode == 0 and "kept" in listing.stdout, listing.stdout + listing.stderr
        assert all(p.exists() for p in archived)
        code, data = _verify_full(s)
        assert code == 0 and data["full"]["segments"] >= 2, data
        # A silent deletion is caught...
        aside = archived[0].with_name("aside")
        os.rename(archived[0], aside)
        assert _verify_full(s)[0] == 1
        os.rename(aside, archived[0])
        # ...a confirmed one is journaled with each segment's range and final hash, and verifies.
        done = s.cli("audit", "archive", "--confirm", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        deleted = json.loads(done.stdout)["data"]["deleted"]
        assert deleted and not any(p.exists() for p in archived)
        code, data = _verify_full(s)
        assert code == 0 and data["ok"], data
        assert {d["segment"] for d in deleted} <= {d["segment"] for d in data["full"]["deleted"]}
    finally:
        stop_stack(s)

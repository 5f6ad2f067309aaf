from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.kinds import KINDS, NOTICES, WRITERS, check_writer, message_id

CATALOG = Path(__file__).resolve().parents[3] / "units" / "airlock.catalog"

REQUIRED = {
    "request.received": "intake",
    "request.rejected": "intake",
    "request.replied": "intake",
    "operation.replayed": "intake",
    "approval.pending": "approval",
    "approval.decided": "approval",
    "operator.action": "approval",
    "policy.reloaded": "approval",
    "exec.started": "runner",
    "exec.finished": "runner",
    "exec.cancelled": "runner",
    "exec.refused": "runner",
}


def test_required_kinds_and_owners() -> None:
    for kind, owner in REQUIRED.items():
        assert KINDS[kind].writers <= {owner, "operator"}, kind
        assert owner in KINDS[kind].writers
    for kind in ("service.started", "service.stopping"):
        assert {"intake", "approval", "runner", "journal"} <= KINDS[kind].writers


def test_message_ids_are_unique_uuid_hex() -> None:
    ids = [message_id(kind) for kind in KINDS]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # Fixed forever: a spot check that nobody regenerated them.
    assert message_id("exec.started") == "d82c1a4b180b46478e2da2a8621231de"


def test_unknown_kind_is_invalid_arguments() -> None:
    with pytest.raises(AirlockError) as info:
        message_id("exec.exploded")
    assert info.value.code is ErrorCode.INVALID_ARGUMENTS


@pytest.mark.parametrize(
    ("writer", "kind"),
    [
        ("intake", "exec.finished"),
        ("intake", "approval.decided"),
        ("approval", "exec.started"),
        ("runner", "request.replied"),
        ("journal", "exec.finished"),
        ("operator", "exec.started"),
        ("nobody", "service.started"),
    ],
)
def test_writer_cannot_append_others_kinds(writer: str, kind: str) -> None:
    with pytest.raises(AirlockError) as info:
        check_writer(writer, kind)
    assert info.value.code is ErrorCode.UNAUTHORIZED


def test_operator_acts_as_approval() -> None:
    assert check_writer("operator", "operator.action").name == "operator.action"
    assert check_writer("operator", "approval.decided").name == "approval.decided"
    for writer in WRITERS:
        check_writer(writer, "service.started")


def _catalog_entries() -> dict[str, dict[str, str]]:
    entries: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for line in CATALOG.read_text().splitlines():
        if line.startswith("-- "):
            current = {"_body": ""}
            entries[line[3:].strip()] = current
        elif current is not None:
            match = re.fullmatch(r"([A-Z][A-Za-z-]+): (.+)", line)
            if match and not current["_body"]:
                current[match.group(1)] = match.group(2)
            else:
                current["_body"] += line + "\n"
    return entries


def test_catalog_has_one_entry_per_message_id() -> None:
    entries = _catalog_entries()
    assert set(entries) == {info.message_id for info in KINDS.values()} | set(NOTICES.values())
    for mid, entry in entries.items():
        assert entry.get("Subject"), mid
        assert entry.get("Defined-By") == "airlock", mid
        assert entry.get("Support"), mid
        assert entry.get("Documentation") == "man:airlock(1)", mid
        assert len(entry["_body"].strip()) > 40, mid


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="needs journalctl")
def test_journalctl_accepts_the_catalog(tmp_path: Path) -> None:
    catalog_dir = tmp_path / "usr/lib/systemd/catalog"
    catalog_dir.mkdir(parents=True)
    (tmp_path / "var/lib/systemd/catalog").mkdir(parents=True)
    shutil.copy(CATALOG, catalog_dir)
    subprocess.run(["journalctl", f"--root={tmp_path}", "--update-catalog"], check=True, capture_output=True)
    listed = subprocess.run(
        ["journalctl", f"--root={tmp_path}", "--list-catalog"], check=True, capture_output=True, text=True
    ).stdout
    for info in KINDS.values():
        assert info.message_id in listed
    for mid in NOTICES.values():
        assert mid in listed

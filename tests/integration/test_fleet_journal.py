"""`airlock audit verify --journal` and `audit compare` on journal files written by systemd-journal-remote (issue 19).

A live stack's records become journald entries exactly as the journal sends
them (`fleet.record_fields`, plus the fields journald adds itself), in the
export format ``systemd-journal-upload`` speaks; the real
``systemd-journal-remote`` writes them into journal files, as on a collector,
and the real CLI reads those with python3-systemd.  (journald itself, upload
over HTTPS and the container pair are the system test's: tests/system/test_9_fleet.py.)
"""

from __future__ import annotations

import base64
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.journal import fleet
from fleet_support import REMOTE, write_collector

from support import Stack, start_stack, stop_stack

pytestmark = pytest.mark.skipif(
    REMOTE is None, reason="needs systemd-journal-remote (apt-get install systemd-journal-remote)"
)
pytest.importorskip("systemd.journal", reason="needs python3-systemd")

MID = "5f1e0c2a9b8d4e7fa6c3b2d1e0f9a8b7"
HOST = fleet.host_identity(MID, "web1")
SECRET = "s3cr3t-fleet-value"


def rows(database: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(database) as conn:
        conn.row_factory = sqlite3.Row
        found = [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY seq")]
    for r in found:
        r["payload"] = json.loads(r["payload"])
    return found


def shipped(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What airlock-journal.service sends for each record, with journald's own trusted fields."""
    return [
        dict(fleet.record_fields(r, r["hash"], HOST))
        | {"_SYSTEMD_UNIT": "airlock-journal.service", "_UID": "998", "MESSAGE": fleet.record_message(r)}
        for r in records
    ]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = start_stack(Path(tmp_path_factory.mktemp("fleet")))
    try:
        assert s.exec({"argv": ["true"], "privileged": False})["ok"]
        reply = s.exec({"command": "echo token=$LANG", "privileged": False, "protected_env": {"LANG": SECRET}})
        assert base64.b64decode(reply["data"]["stdout"]) == b"token=[redacted]\n"  # the secret was used
        assert s.exec({"argv": ["echo", "x" * 40000], "privileged": False})["ok"]  # a large record
        yield s
    finally:
        stop_stack(s)


def test_verify_on_collector_files_and_protected_values_stay_out(live: Stack, tmp_path: Path) -> None:
    records = rows(live.database)
    write_collector(tmp_path / "remote", shipped(records))
    # Issue 44: without host keys the collector proves nothing, and says so with a non-zero exit.
    unkeyed = live.cli("audit", "verify", "--journal", str(tmp_path / "remote"))
    assert unkeyed.returncode == 1, unkeyed.stdout + unkeyed.stderr
    assert f"host {HOST}: UNPROVEN (its chain checks out under the name it claims): {len(records)} records" in (
        unkeyed.stdout
    )
    assert "UNPROVEN: 1 host known only by the name its records claim" in unkeyed.stdout
    assert "--host-keys FILE" in unkeyed.stdout and "--trust-claimed-hosts" in unkeyed.stdout
    as_json = json.loads(live.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--json").stdout)
    assert not as_json["ok"] and as_json["unproven_hosts"] == [HOST] and as_json["hosts"][0]["ok"], as_json
    r = live.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--trust-claimed-hosts")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"host {HOST}: ok: {len(records)} records, seqs 1-{len(records)}" in r.stdout
    assert "note: hosts as their records claim them (--trust-claimed-hosts" in r.stdout
    assert r.stdout.rstrip().endswith("ok: 1 host check out")
    both = live.cli(
        "audit", "verify", "--journal", str(tmp_path / "remote"), "--trust-claimed-hosts", "--host-keys", "/dev/null"
    )
    assert both.returncode == 2 and "the keys decide" in both.stderr, both
    # the files hold the exact bytes that were hashed, and never the protected value
    from systemd import journal

    reader = journal.Reader(path=str(tmp_path / "remote"), converters={"AIRLOCK_RECORD": lambda b: b})
    held = list(reader)
    assert len(held) == len(records)
    assert max(len(e["AIRLOCK_RECORD"]) for e in held) > 40000
    assert not any(SECRET in str(value) for e in held for value in e.values())


def test_verify_names_missing_seqs_as_ranges_and_a_forged_record(live: Stack, tmp_path: Path) -> None:
    records = rows(live.database)
    assert len(records) >= 8
    entries = shipped([r for r in records if r["seq"] not in (3, 4, 6)])
    forged = dict(entries[-1]) | {
        "AIRLOCK_RECORD": entries[-1]["AIRLOCK_RECORD"].replace(b'"writer":"', b'"writer":"x')
    }
    write_collector(tmp_path / "remote", [*entries[:-1], forged])
    r = live.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--json")
    assert r.returncode == 1, r.stdout + r.stderr
    (host,) = json.loads(r.stdout)["hosts"]
    assert host["gaps"] == [{"from": 3, "to": 4}, {"from": 6, "to": 6}] and host["first_bad_seq"] == 3
    assert any("hash does not match" in p for p in host["problems"]), host["problems"]
    other = live.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--host", "web2")
    assert other.returncode == 1 and "no airlock records of host 'web2'" in other.stdout


def test_compare_reports_a_truncated_then_a_rewritten_database(live: Stack, tmp_path: Path) -> None:
    records = rows(live.database)
    write_collector(tmp_path / "remote", shipped(records))
    copy = tmp_path / "journal.sqlite"
    with sqlite3.connect(live.database) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    compare = ("audit", "compare", "--journal", str(tmp_path / "remote"), "--database", str(copy), "--host", HOST)
    same = live.cli(*compare)
    assert same.returncode == 0 and same.stdout.startswith("ok:"), same.stdout + same.stderr
    with sqlite3.connect(copy) as conn:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        conn.execute("DELETE FROM events WHERE seq > 5")
    cut = live.cli(*compare)
    assert (
        cut.returncode == 1 and cut.stdout.startswith("DIFFERS at seq 6:") and "cut short after seq 5" in cut.stdout
    ), cut.stdout
    with sqlite3.connect(copy) as conn:
        conn.execute("UPDATE events SET hash = ? WHERE seq = 2", ("0" * 64,))
    rewritten = live.cli(*compare, "--json")
    assert rewritten.returncode == 1 and json.loads(rewritten.stdout)["first_differing_seq"] == 2


def test_unreadable_paths_are_a_usage_error(live: Stack, tmp_path: Path) -> None:
    r = live.cli("audit", "verify", "--journal", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "no such file or directory" in r.stderr

"""Attacks on the fleet audit and the SSH console (issue 19), against a live stack.

1. A user on a host sends journald entries that look like airlock's records (any
   process may use any MESSAGE_ID and field): the collector must not count them.
   Control: the very same entries, as airlock-journal.service sends them, do count.
2. A "host" that is an ssh option (``-oProxyCommand=…``) must never reach ssh as one.
   Control: ssh itself runs such a ProxyCommand when handed it.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airlock.journal import fleet
from fleet_support import REMOTE, write_collector

from support import Stack

HOST = fleet.host_identity("00112233445566778899aabbccddeeff", "web9")


def _records(stack: Stack) -> list[dict[str, Any]]:
    with sqlite3.connect(stack.database) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY seq")]
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def _collector(tmp: Path, records: list[dict[str, Any]], sender: dict[str, str | bytes]) -> Path:
    entries = [dict(fleet.record_fields(r, r["hash"], HOST)) | sender for r in records]
    write_collector(tmp, entries)
    return tmp


@pytest.mark.skipif(REMOTE is None, reason="needs systemd-journal-remote (apt-get install systemd-journal-remote)")
def test_records_sent_by_another_process_do_not_count(stack: Stack, tmp_path: Path) -> None:
    pytest.importorskip("systemd.journal", reason="needs python3-systemd")
    assert stack.exec({"argv": ["true"], "privileged": False})["ok"]
    records = _records(stack)
    forged = _collector(tmp_path / "forged", records, {"_SYSTEMD_UNIT": "session-4.scope", "_UID": "1000"})
    r = stack.cli("audit", "verify", "--journal", str(forged), "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["hosts"] == [] and report["ignored"] == len(records), report
    # control: the same entries from the journal's unit are a good chain
    genuine = _collector(tmp_path / "genuine", records, {"_SYSTEMD_UNIT": "airlock-journal.service", "_UID": "998"})
    ok = stack.cli("audit", "verify", "--journal", str(genuine), "--trust-claimed-hosts")
    assert ok.returncode == 0, ok.stdout + ok.stderr


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_a_host_that_is_an_ssh_option_never_reaches_ssh(tmp_path: Path) -> None:
    control = tmp_path / "control-ran"
    subprocess.run(
        ["ssh", "-o", "BatchMode=yes", f"-oProxyCommand=touch {control}", "nowhere"],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert control.exists()  # ssh does run it: the attack is real
    attack = tmp_path / "attack-ran"
    r = subprocess.run(
        [sys.executable, "-m", "airlock", "--host", f"-oProxyCommand=touch {attack}", "pending"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 2 and "not a [USER@]HOST" in r.stderr and not attack.exists()

"""A compromised host cannot forge another host's audit at the collector (issue 29, attack 2).

Root on web2 controls every field its own journald writes, ``_SYSTEMD_UNIT``
and ``_UID`` included, so it can ship entries that claim ``AIRLOCK_HOST`` web1:
a record that extends web1's chain, a forged acknowledgement, a checkpoint
signed with web2's own key.  Before signed checkpoints the collector filed
them as web1's: the forged record made web1's chain fail (two records for one
seq), the forged acknowledgement was accepted as a new segment of web1, and
web1's own `audit compare` said its database was rewritten.

Now each host's chain is what its own key's checkpoints sign: with
``--host-keys`` the forgeries are reported as claims web1 cannot be shown to
make, web1's chain checks out without them, and web1's compare (by default
with its own key) holds nothing forged against its database.  The control is
the same collector read without keys: the attack works there.

web1 is a live stack (its records, anchors and checkpoint key are the real
ones); web2 is played by this test with a key of its own; the collector's
files are written by the real systemd-journal-remote (tests/fleet_support.py).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airlock.common import checkpoint
from airlock.journal import chain, fleet, journalfiles
from fleet_support import REMOTE, anchor_entries, write_collector

from support import Stack, start_stack, stop_stack

pytestmark = [
    pytest.mark.skipif(REMOTE is None, reason="needs systemd-journal-remote (apt-get install systemd-journal-remote)"),
    pytest.mark.skipif(not Path("/usr/bin/ssh-keygen").exists(), reason="needs ssh-keygen (openssh-client)"),
]
pytest.importorskip("systemd.journal", reason="needs python3-systemd")

JOURNAL_UNIT = {"_SYSTEMD_UNIT": "airlock-journal.service", "_UID": "998"}


def _rows(database: Path) -> list[dict[str, Any]]:
    with sqlite3.connect(f"file:{database}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(r) for r in conn.execute("SELECT * FROM events ORDER BY seq")]
    for r in rows:
        r["payload"] = json.loads(r["payload"])
    return rows


def _shipped(rows: list[dict[str, Any]], host: str, sender: dict[str, str] = JOURNAL_UNIT) -> list[dict[str, Any]]:
    return [dict(fleet.record_fields(r, r["hash"], host)) | sender | {"MESSAGE": "r"} for r in rows]


def _forge(seq: int, prev: str, kind: str = "exec.finished", payload: dict[str, Any] | None = None) -> dict[str, Any]:
    record = {
        "seq": seq,
        "time": "2026-12-03T12:00:00.000Z",
        "kind": kind,
        "request_id": None if kind == chain.ACK_KIND else "forged",
        "operation_id": None,
        "peer_uid": 0,
        "session": None,
        "writer": "journal" if kind == chain.ACK_KIND else "runner",
        "payload": payload or {"exit_codes": [0]},
        "prev_hash": prev,
    }
    return record | {"hash": chain.compute_hash(record)}


class World:
    def __init__(self, stack: Stack, web1: str, keys: Path, collector: Path, forged_seq: int, ack_seq: int) -> None:
        self.stack, self.web1, self.keys, self.collector = stack, web1, keys, collector
        self.forged_seq, self.ack_seq = forged_seq, ack_seq


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    where = Path(tmp_path_factory.mktemp("keys"))
    stack = start_stack(Path(tempfile.mkdtemp(prefix="alfk", dir="/tmp")) / "rt")
    web1 = journalfiles.local_host()  # what the stack's checkpoints name
    try:
        for _ in range(2):
            assert stack.exec({"argv": ["true"], "privileged": False})["ok"]
        early = _rows(stack.database)
        head = early[-1]
        # web2's root: a record that extends web1's chain exactly where web1 is now ...
        forged = _forge(head["seq"] + 1, head["hash"])
        for _ in range(2):
            assert stack.exec({"argv": ["true"], "privileged": False})["ok"]
    finally:
        stop_stack(stack)  # web1's stop anchor: a checkpoint over everything it wrote
    rows = _rows(stack.database)
    assert rows[forged["seq"] - 1]["hash"] != forged["hash"]  # web1 wrote its own record at that seq
    # ... an acknowledgement that cuts web1 back to that early head, and a checkpoint for it, signed by web2's key.
    ack = _forge(rows[-1]["seq"] + 5, head["hash"], chain.ACK_KIND, {"reason": "forged"})
    web2_key = where / "web2_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(web2_key)], check=True)
    claim = checkpoint.Checkpoint(web1, ack["seq"], ack["hash"], "2026-12-03T12:00:01.000Z")
    signature = subprocess.run(
        ["ssh-keygen", "-q", "-Y", "sign", "-f", str(web2_key), "-n", checkpoint.NAMESPACE],
        input=claim.statement(),
        capture_output=True,
        check=True,
    ).stdout.decode()
    forged_anchor = {
        "MESSAGE_ID": fleet.ANCHOR_MESSAGE_ID,
        "MESSAGE": "journal.chain.anchored",
        "AIRLOCK_CHAIN_SEQ": str(ack["seq"]),
        "AIRLOCK_CHAIN_HASH": ack["hash"],
        "AIRLOCK_HOST": web1,
        "AIRLOCK_CHECKPOINT": claim.statement(),
        "AIRLOCK_SIGNATURE": signature,
    } | JOURNAL_UNIT
    ack_anchor = {
        "MESSAGE_ID": fleet.ANCHOR_MESSAGE_ID,
        "MESSAGE": "journal.chain.anchored",
        "AIRLOCK_CHAIN_SEQ": str(ack["seq"]),
        "AIRLOCK_CHAIN_HASH": ack["hash"],
        "AIRLOCK_CHAIN_ACK": "true",
        "AIRLOCK_HOST": web1,
        "_UID": "0",
    }
    anchors = anchor_entries(stack.runtime_dir / "state" / "journal.anchors", web1)
    assert any("AIRLOCK_CHECKPOINT" in a for a in anchors)  # web1's anchors are signed checkpoints
    # The collector: web1's own entries, with web2's forgeries in between (as uploads interleave).
    cut = len(early)
    entries = [
        *_shipped(rows[:cut], web1),
        *_shipped([forged], web1),
        *_shipped(rows[cut:], web1),
        *anchors,
        *_shipped([ack], web1, {"_UID": "0"}),
        ack_anchor,
        forged_anchor,
    ]
    write_collector(where / "remote", entries)
    keys = where / "host-keys"
    web1_pub = (stack.runtime_dir / "checkpoint_ed25519_key.pub").read_text().split()
    web2_pub = Path(f"{web2_key}.pub").read_text().split()
    keys.write_text(
        f"{web1} {web1_pub[0]} {web1_pub[1]}\nweb2/{'b' * 32} {web2_pub[0]} {web2_pub[1]}\n", encoding="ascii"
    )
    yield World(stack, web1, keys, where / "remote", forged["seq"], ack["seq"])
    shutil.rmtree(stack.runtime_dir.parent, ignore_errors=True)


def test_forged_records_do_not_verify_as_the_host_they_name(world: World) -> None:
    # control: read by claimed name (as told), the collector files web2's forgeries under web1
    plain = world.stack.cli("audit", "verify", "--journal", str(world.collector), "--json", "--trust-claimed-hosts")
    (host,) = json.loads(plain.stdout)["hosts"]
    assert f"seq {world.forged_seq}: the collector holds two different records" in host["problems"], host
    assert [s["seq"] for s in host["segments"]] == [world.ack_seq], host  # the forged cut, taken as web1's
    # with the hosts' keys: web1's chain is what its own checkpoints sign, and it checks out
    r = world.stack.cli("audit", "verify", "--journal", str(world.collector), "--host-keys", str(world.keys), "--json")
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["keyed"], report  # something claims a host it cannot prove
    (host,) = report["hosts"]
    assert host["ok"] and host["host"] == world.web1 and host["key"].startswith("SHA256:"), host
    assert host["segments"] == [] and host["conflicts"] == [] and host["unproven_tail"] == [], host
    assert host["proven_to"] == host["last_seq"] < world.ack_seq, host
    claims = {(u["what"], u["seq"]) for u in report["unproven"]}
    assert claims == {
        ("record", world.forged_seq),
        ("acknowledgement", world.ack_seq),
        ("checkpoint", world.ack_seq),
    }, report["unproven"]
    text = world.stack.cli("audit", "verify", "--journal", str(world.collector), "--host-keys", str(world.keys))
    assert f"UNPROVEN: 1 record (seq {world.forged_seq}) claim host {world.web1}" in text.stdout, text.stdout


def test_without_keys_a_chain_shipped_under_another_hosts_name_never_verifies_as_its(
    world: World, tmp_path: Path
) -> None:
    """Issue 44: root on web2 ships a whole, well-formed chain (here web1's own records,
    re-sent) as ``AIRLOCK_HOST`` web1 from a unit it names airlock-journal.service.  A
    collector without keys cannot tell it from web1's: verify says so and exits 1."""
    write_collector(tmp_path / "remote", _shipped(_rows(world.stack.database), world.web1))
    r = world.stack.cli("audit", "verify", "--journal", str(tmp_path / "remote"))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"host {world.web1}: UNPROVEN" in r.stdout and "ok: 1 host" not in r.stdout, r.stdout
    as_json = json.loads(world.stack.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--json").stdout)
    assert not as_json["ok"] and as_json["unproven_hosts"] == [world.web1], as_json
    # control: trusting claimed names (the old default), the shipped chain verifies as web1's
    trusting = world.stack.cli("audit", "verify", "--journal", str(tmp_path / "remote"), "--trust-claimed-hosts")
    assert trusting.returncode == 0 and f"host {world.web1}: ok:" in trusting.stdout, trusting.stdout


def test_a_hosts_compare_holds_nothing_forged_against_its_database(world: World) -> None:
    base = ("audit", "compare", "--journal", str(world.collector), "--database", str(world.stack.database))
    config = ("--config", str(world.stack.runtime_dir / "airlock.yaml"))
    # control: by claimed name, web2's forgeries make web1's database look cut (the forged
    # acknowledgement excuses web1's own records 12-19, and its seq is not in the database)
    plain = world.stack.cli(*base, "--host", world.web1, "--json")
    assert plain.returncode == 1, plain
    assert json.loads(plain.stdout)["first_differing_seq"] in (world.forged_seq, world.ack_seq), plain.stdout
    # by default, compare checks the collector's copy with this host's own key
    own = world.stack.cli(*base, *config)
    assert own.returncode == 0 and own.stdout.startswith("ok:"), own.stdout + own.stderr
    assert "UNPROVEN" in own.stdout
    keyed = world.stack.cli(*base, "--host", world.web1, "--host-keys", str(world.keys))
    assert keyed.returncode == 0, keyed.stdout + keyed.stderr


def test_host_key_prints_the_line_for_the_collector(world: World) -> None:
    r = world.stack.cli("audit", "host-key", "--config", str(world.stack.runtime_dir / "airlock.yaml"))
    assert r.returncode == 0, r.stderr
    line = r.stdout.strip()
    assert line.startswith(f"{world.web1} ssh-ed25519 ") and line.split()[:3] == world.keys.read_text().split()[:3]


def _rewrite_and_rehash(db: Path, seq: int) -> None:
    """Root on the host: change record ``seq`` and recompute every later hash, triggers dropped first."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
            conn.execute(f"DROP TRIGGER {name}")
        rows = [dict(r) for r in conn.execute("SELECT * FROM events WHERE seq >= ? ORDER BY seq", (seq - 1,))]
        prev = rows[0]["hash"]
        for row in rows[1:]:
            payload = json.loads(row["payload"]) | ({"forged": True} if row["seq"] == seq else {})
            text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            digest = chain.compute_hash(row | {"payload": payload, "prev_hash": prev})
            conn.execute(
                "UPDATE events SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?", (text, prev, digest, row["seq"])
            )
            prev = digest
    finally:
        conn.close()


@pytest.mark.parametrize("rewrite", [False, True], ids=["control", "rewritten"])
def test_a_host_that_rewrites_its_shipped_history_is_caught_though_it_holds_its_key(rewrite: bool) -> None:
    """Root on web1 rewrites records it already shipped, removes the anchors that would stop the
    journal, starts it again and ships the new history, signed with web1's own key: the collector
    finds web1's checkpoints do not extend one another.  Control: the same restart, no rewrite."""
    runtime = Path(tempfile.mkdtemp(prefix="alrw", dir="/tmp")) / "rt"
    web1 = journalfiles.local_host()
    anchors_file = runtime / "state" / "journal.anchors"
    try:
        stack = start_stack(runtime)
        try:
            for _ in range(2):
                assert stack.exec({"argv": ["true"], "privileged": False})["ok"]
        finally:
            stop_stack(stack)
        before = _rows(stack.database)
        shipped = _shipped(before, web1) + anchor_entries(anchors_file, web1)
        if rewrite:
            _rewrite_and_rehash(stack.database, 3)
            anchors_file.unlink()
        stack = start_stack(runtime)
        try:
            assert stack.exec({"argv": ["true"], "privileged": False})["ok"]
        finally:
            stop_stack(stack)
        after = _rows(stack.database)
        changed = [r for r in after if r["seq"] > before[-1]["seq"] or r not in before]
        shipped += _shipped(changed, web1) + anchor_entries(anchors_file, web1)[-2:]  # the restart's anchors
        write_collector(runtime.parent / "remote", shipped)
        keys = runtime.parent / "host-keys"
        public = (runtime / "checkpoint_ed25519_key.pub").read_text().split()
        keys.write_text(f"{web1} {public[0]} {public[1]}\n", encoding="ascii")
        r = stack.cli(
            "audit", "verify", "--journal", str(runtime.parent / "remote"), "--host-keys", str(keys), "--json"
        )
        (host,) = json.loads(r.stdout)["hosts"]
        if not rewrite:
            assert r.returncode == 0 and host["ok"] and host["proven_to"] == host["last_seq"], r.stdout
            return
        assert r.returncode == 1 and not host["ok"], r.stdout
        assert any("does not extend this host's earlier one" in p for p in host["problems"]), host["problems"]
        assert 3 in host["conflicts"], host  # both histories carry web1's own signature
    finally:
        shutil.rmtree(runtime.parent, ignore_errors=True)


def test_the_fleet_console_s_collector_verdict_does_not_take_the_forgeries_as_the_host_s(world: World) -> None:
    """Issue 49: the fleet page's collector line is `airlock audit verify --journal --host-keys`'s verdict.

    web1's card says its chain verifies, as far as its own key proves it, and flags the entries web2's
    root wrote under its name; a host the collector holds nothing of is not verified.  Control: without
    keys the same collector files web2's forgeries under web1 (the test above), and the console does not
    verify at all (it needs host keys)."""
    import asyncio
    import time

    from airlock.web import fleetaudit, fleetpanel

    found = asyncio.run(fleetaudit.verify(world.collector, world.keys))
    hostname = world.web1.rpartition("/")[0]
    cards = fleetaudit.for_hosts(found, [f"root@{hostname}", "ghost"], time.time())
    mine = cards[f"root@{hostname}"]
    assert mine["ok"] is True and mine["name"] == world.web1, mine
    assert mine["proven_to"] == mine["last_seq"] < world.ack_seq and mine["unproven"] == 3, mine
    assert cards["ghost"]["ok"] is False and cards["ghost"]["problem"] == "no records of this host"
    line = fleetpanel.collector_line(mine, True)
    assert "verified" in line and "3 entries claim this host that its key does not prove" in line
    assert "NOT VERIFIED" in fleetpanel.collector_line(cards["ghost"], True)
    assert fleetpanel.collector_line(None, False) == ""  # no host keys: no verdict on the page

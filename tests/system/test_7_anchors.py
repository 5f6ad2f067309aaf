"""The audit chain is anchored in journald; `audit verify --anchors journald` catches a cut database.

The attacker here is thorough: the newest records are deleted, the
high-water mark lowered and the anchors file beside the database trimmed to
match, so the journal's own start check passes.  Only journald -- which
whoever holds the database cannot take back -- still says how far the chain
went.
"""

from __future__ import annotations

import json
import uuid

ANCHORED = "d95f3306ee3b4488bba7c5125f73ec62"
DB = "/var/lib/airlock/journal.sqlite"
ANCHORS = "/var/lib/airlock/journal.anchors"

# Run as root inside the container with the journal stopped: cut CUT records off the end.
CUT_TAIL = r"""
import json, sqlite3, sys
cut = int(sys.argv[1])
conn = sqlite3.connect("/var/lib/airlock/journal.sqlite", isolation_level=None)
for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
    conn.execute(f"DROP TRIGGER {name}")
(head,) = conn.execute("SELECT MAX(seq) FROM events").fetchone()
keep = head - cut
conn.execute("DELETE FROM events WHERE seq > ?", (keep,))
conn.execute("UPDATE chain_high SET seq = ?", (keep,))
conn.close()
path = "/var/lib/airlock/journal.anchors"
lines = [l for l in open(path).read().splitlines() if l and json.loads(l)["seq"] <= keep]
with open(path, "w") as f:  # keeps the file's owner
    f.write("".join(l + "\n" for l in lines))
print(keep, head)
"""


def _anchors_in_journald(system) -> list[dict]:
    out = system.c.run(["journalctl", "--no-pager", "-o", "json", f"MESSAGE_ID={ANCHORED}"]).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _run(system) -> None:
    r = system.airlock("run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true")
    assert r.returncode == 0, r


def _verify(system, *extra: str):
    r = system.airlock("audit", "verify", "--json", *extra, user=None)
    return r.returncode, json.loads(r.stdout.strip().splitlines()[-1]), r


def test_anchors_reach_journald_and_catch_a_cut_database(system) -> None:
    _run(system)
    system.c.run(["systemctl", "restart", "airlock-journal.service"])  # a stop and a start anchor
    _run(system)
    entries = _anchors_in_journald(system)
    assert entries, "no anchors in journald"
    last = entries[-1]
    assert last["_SYSTEMD_UNIT"] == "airlock-journal.service"
    assert int(last["AIRLOCK_CHAIN_SEQ"]) > 0 and len(last["AIRLOCK_CHAIN_HASH"]) == 64
    assert {e.get("AIRLOCK_REASON") for e in entries} >= {"start", "stop"}

    # Control: the untouched database matches every anchor in journald.
    code, envelope, r = _verify(system, "--anchors", "journald")
    assert code == 0 and envelope["data"]["ok"] and envelope["data"]["anchors"]["checked"] >= 2, r

    system.c.run(["systemctl", "stop", "airlock-journal.socket", "airlock-journal.service"])
    try:
        keep, head = map(int, system.c.run(["python3", "-c", CUT_TAIL, "3"]).stdout.split())
    finally:
        system.c.run(["systemctl", "start", "airlock-journal.socket"])

    # The journal's own checks cannot tell (its file was trimmed too) ...
    code, envelope, r = _verify(system, "--anchors", ANCHORS)
    assert code == 0 and envelope["data"]["chain"]["ok"], r
    # ... journald can.  (The journal has started on the cut database meanwhile and,
    # the high-water mark lowered, written its service.started at keep + 1 again: the
    # first record journald can prove gone may be a little later than keep + 1.)
    code, envelope, r = _verify(system, "--anchors", "journald")
    assert code == 1 and envelope["data"]["ok"] is False, r
    first_bad = envelope["data"]["first_bad_seq"]
    assert keep < first_bad <= head, (keep, head, r)
    text = system.airlock("audit", "verify", "--anchors", "journald", user=None)
    assert text.returncode == 1 and f"FAILED at record {first_bad}" in text.stdout, text
    # The default under systemd takes journald's anchors too.
    assert _verify(system)[0] == 1

    # Acknowledge (root, journal stopped), then it verifies again with the segment shown.
    system.c.run(["systemctl", "stop", "airlock-journal.socket", "airlock-journal.service"])
    try:
        ack = system.airlock(
            "audit", "acknowledge", "--anchors", "journald", "--reason", "systest: cut on purpose", user=None
        )
        assert ack.returncode == 0, ack
    finally:
        system.c.run(["systemctl", "start", "airlock-journal.socket"])
    _run(system)
    code, envelope, r = _verify(system, "--anchors", "journald")
    assert code == 0 and envelope["data"]["ok"], r
    segments = envelope["data"]["segments"]
    assert len(segments) == 1 and segments[0]["confirmed"] and segments[0]["previous_seq"] >= keep
    owner = system.c.run(["stat", "-c", "%U", DB, ANCHORS]).stdout.split()
    assert owner == ["airlock-journal", "airlock-journal"], owner
    system.audit_verify()  # the operator's plain verify agrees

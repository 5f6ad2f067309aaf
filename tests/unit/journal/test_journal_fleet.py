"""journal/fleet.py: records as journald entries, per-host checks on a collector, compare (issue 19)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airlock.journal import chain, fleet
from airlock.journal.chain import GENESIS
from airlock.journal.collected import compare

MID_A = "0123456789abcdef0123456789abcdef"
MID_B = "fedcba9876543210fedcba9876543210"
HOST_A = fleet.host_identity(MID_A, "web1")
HOST_B = fleet.host_identity(MID_B + "\n", "web2")


def make_chain(n: int, *, start: int = 1, prev: str = GENESIS, kind: str = "request.received") -> list[dict[str, Any]]:
    out = []
    for seq in range(start, start + n):
        record = {
            "seq": seq,
            "time": f"2026-12-03T09:00:{seq % 60:02d}.000Z",
            "kind": kind,
            "request_id": f"r{seq}",
            "operation_id": None,
            "peer_uid": 1000,
            "session": None,
            "writer": "intake",
            "payload": {"argv": ["true"], "n": seq},
            "prev_hash": prev,
        }
        digest = chain.compute_hash(record)
        out.append(record | {"hash": digest})
        prev = digest
    return out


def entry(record: dict[str, Any], host: str = HOST_A, **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = dict(fleet.record_fields(record, record["hash"], host))
    fields |= {"_SYSTEMD_UNIT": "airlock-journal.service", "_UID": 998}
    return fields | extra


def anchor_entry(seq: int, digest: str, host: str = HOST_A, **extra: Any) -> dict[str, Any]:
    return {
        "MESSAGE_ID": fleet.ANCHOR_MESSAGE_ID,
        "AIRLOCK_CHAIN_SEQ": str(seq),
        "AIRLOCK_CHAIN_HASH": digest,
        "AIRLOCK_HOST": host,
        "_SYSTEMD_UNIT": "airlock-journal.service",
        "_UID": 998,
    } | extra


def test_host_identity_is_hostname_and_machine_id() -> None:
    assert HOST_A == f"web1/{MID_A}"
    assert HOST_B == f"web2/{MID_B}"
    with pytest.raises(ValueError, match="machine ID"):
        fleet.host_identity("not-a-machine-id", "web1")
    assert (
        fleet.host_matches(HOST_A, "web1") and fleet.host_matches(HOST_A, MID_A) and fleet.host_matches(HOST_A, HOST_A)
    )
    assert not fleet.host_matches(HOST_A, "web")


def test_the_record_field_holds_exactly_the_hashed_bytes() -> None:
    (record,) = make_chain(1)
    fields = fleet.record_fields(record, record["hash"], HOST_A)
    assert fields["AIRLOCK_RECORD"] == chain.record_bytes(record)
    assert (
        fields["AIRLOCK_SEQ"] == "1"
        and fields["AIRLOCK_PREV_HASH"] == GENESIS
        and fields["AIRLOCK_KIND"] == "request.received"
    )
    assert fields["AIRLOCK_HOST"] == HOST_A and fields["MESSAGE_ID"] == fleet.RECORD_MESSAGE_ID
    # Anyone holding the entry recomputes the hash from the fields alone.
    import hashlib

    assert (
        hashlib.sha256(bytes.fromhex(str(fields["AIRLOCK_PREV_HASH"])) + fields["AIRLOCK_RECORD"]).hexdigest()
        == record["hash"]
    )
    assert "hash" not in json.loads(fields["AIRLOCK_RECORD"])


def test_two_hosts_each_check_out_on_their_own() -> None:
    a, b = make_chain(5), make_chain(3)
    entries = [entry(r) for r in a] + [entry(r, HOST_B) for r in b]
    entries.reverse()  # a collector's order is not the chain's
    report = fleet.verify_hosts([*entries, anchor_entry(5, a[-1]["hash"])], trust_claimed=True)
    assert report.ok, report.to_dict()
    assert set(report.hosts) == {HOST_A, HOST_B}
    ha = report.hosts[HOST_A]
    assert (ha.records, ha.first_seq, ha.last_seq) == (5, 1, 5)
    assert ha.first_time == a[0]["time"] and ha.last_time == a[-1]["time"]
    assert ha.anchors is not None and ha.anchors.checked == 1
    only_b = fleet.verify_hosts(entries, host="web2", trust_claimed=True)
    assert list(only_b.hosts) == [HOST_B]


def test_missing_records_are_reported_as_ranges() -> None:
    records = make_chain(12)
    kept = [r for r in records if r["seq"] not in (4, 5, 6, 9)]
    report = fleet.verify_hosts([entry(r) for r in kept], trust_claimed=True)
    host = report.hosts[HOST_A]
    assert not report.ok
    assert host.gaps == [(4, 6), (9, 9)]
    assert host.first_bad_seq == 4
    assert "seqs 4-6 missing on the collector" in host.problems and "seq 9 missing on the collector" in host.problems
    # the runs between the gaps still check out
    assert all(r.ok for r in host.runs) and len(host.runs) == 3


def test_a_collector_without_the_oldest_records_checks_from_its_first() -> None:
    records = make_chain(10)
    report = fleet.verify_hosts([entry(r) for r in records[4:]], trust_claimed=True)
    assert report.ok and report.hosts[HOST_A].first_seq == 5


def test_a_rewritten_record_fails_at_its_seq() -> None:
    records = make_chain(6)
    forged = dict(records[2], payload={"argv": ["rm", "-rf", "/"], "n": 3})
    entries = [entry(r) for r in records]
    entries[2] = entry(records[2]) | {"AIRLOCK_RECORD": chain.record_bytes(forged)}
    host = fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A]
    assert not host.ok and host.first_bad_seq == 3
    assert any("hash does not match" in p for p in host.problems), host.problems


def test_a_rewritten_tail_with_recomputed_hashes_fails_against_an_anchor() -> None:
    records = make_chain(6)
    rewritten = records[:3] + make_chain(3, start=4, prev=records[2]["hash"], kind="request.rejected")
    entries = [entry(r) for r in rewritten] + [anchor_entry(6, records[5]["hash"])]
    host = fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A]
    assert not host.ok and host.anchors is not None and host.anchors.first_bad_seq == 6


def test_an_anchor_beyond_the_collected_records_says_records_did_not_arrive() -> None:
    records = make_chain(8)
    entries = [entry(r) for r in records[:5]] + [anchor_entry(8, records[7]["hash"])]
    host = fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A]
    assert not host.ok and host.first_bad_seq == 6


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"AIRLOCK_SEQ": "2"}, "AIRLOCK_SEQ disagrees"),
        ({"AIRLOCK_KIND": "exec.finished"}, "AIRLOCK_KIND disagrees"),
        ({"AIRLOCK_PREV_HASH": "1" * 64}, "AIRLOCK_PREV_HASH disagrees"),
        ({"AIRLOCK_HASH": "XYZ"}, "not 64 lowercase hex"),
        ({"AIRLOCK_RECORD": b"not json"}, "not JSON"),
        ({"AIRLOCK_RECORD": b'{"seq": 1}'}, "exactly the record's fields"),
        ({"_SYSTEMD_UNIT": "evil.service"}, "not written by airlock-journal.service"),
    ],
)
def test_entries_that_are_not_true_records_are_ignored_and_say_why(change: dict[str, Any], reason: str) -> None:
    records = make_chain(3)
    entries = [entry(records[0]) | change, entry(records[1]), entry(records[2])]
    report = fleet.verify_hosts(entries, trust_claimed=True)
    assert any(reason in why for why in report.ignored), report.ignored
    # seq 1 is not taken from that entry: the chain starts at 2 on trust only if nothing else is there
    assert report.hosts[HOST_A].first_seq == 2


def test_a_non_canonical_record_is_refused_even_when_it_means_the_same() -> None:
    (record,) = make_chain(1)
    spaced = json.dumps({k: record[k] for k in chain.RECORD_FIELDS}, sort_keys=True).encode()
    report = fleet.verify_hosts([entry(record) | {"AIRLOCK_RECORD": spaced}], trust_claimed=True)
    assert not report.ok and any("canonical" in why for why in report.ignored)


def test_forged_records_from_another_sender_do_not_count() -> None:
    records = make_chain(3)
    forged = make_chain(4)  # a whole other chain, sent by some user with journal.send
    entries = [entry(r) for r in records] + [entry(r, _SYSTEMD_UNIT="user@1000.service", _UID=1000) for r in forged]
    report = fleet.verify_hosts(entries, trust_claimed=True)
    assert report.ok and report.hosts[HOST_A].records == 3 and len(report.ignored) == 4


def test_an_acknowledgement_counts_only_from_root() -> None:
    records = make_chain(4)
    ack = make_chain(1, start=9, prev=records[-1]["hash"], kind=chain.ACK_KIND)[0]
    as_root = entry(ack, _SYSTEMD_UNIT="session-3.scope", _UID=0)
    report = fleet.verify_hosts([entry(r) for r in records] + [as_root], trust_claimed=True)
    assert report.ok, report.to_dict()  # the seq jump before an acknowledgement is no gap
    by_journal_user = entry(ack)  # the journal's own user cannot excuse anything
    report = fleet.verify_hosts([entry(r) for r in records] + [by_journal_user], trust_claimed=True)
    assert report.hosts[HOST_A].last_seq == 4 and report.ignored


def test_duplicates_are_counted_and_conflicts_fail() -> None:
    records = make_chain(3)
    entries = [entry(r) for r in records] + [entry(records[1])]
    assert fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A].duplicates == 1
    other = make_chain(3, kind="request.rejected")
    host = fleet.verify_hosts([*entries, entry(other[0])], trust_claimed=True).hosts[HOST_A]
    assert not host.ok and host.conflicts == [1]


def test_compare_names_the_first_seq_of_a_cut_or_a_rewrite() -> None:
    records = make_chain(10)
    collected = {r["seq"]: r["hash"] for r in records[:8]}
    local = {r["seq"]: r["hash"] for r in records}
    same = compare(local, collected)
    assert same.ok and same.compared == 8 and same.not_collected == [(9, 10)]

    cut = compare({s: h for s, h in local.items() if s <= 5}, collected)
    assert not cut.ok and cut.first_differing_seq == 6 and "cut short after seq 5" in (cut.reason or "")

    rewritten = dict(local) | {4: "0" * 64}
    result = compare(rewritten, collected)
    assert not result.ok and result.first_differing_seq == 4 and "rewritten" in (result.reason or "")

    deleted = {s: h for s, h in local.items() if s != 3}
    result = compare(deleted, collected)
    assert not result.ok and result.first_differing_seq == 3 and "deleted" in (result.reason or "")


def test_a_record_at_the_payload_cap_keeps_its_bytes() -> None:
    from airlock.journal.store import MAX_PAYLOAD_BYTES

    record = make_chain(1)[0]
    record["payload"] = {"blob": "x" * (MAX_PAYLOAD_BYTES - 20)}
    record["hash"] = chain.compute_hash(record)
    fields = fleet.record_fields(record, record["hash"], HOST_A)
    assert len(fields["AIRLOCK_RECORD"]) > MAX_PAYLOAD_BYTES - 20
    assert fleet.verify_hosts([entry(record)], trust_claimed=True).ok


def test_the_store_hands_every_committed_record_to_the_shipper_in_order(tmp_path: Any) -> None:
    """What the journal service sends to journald (Store.on_records): each committed record once, in
    seq order, after its commit -- and the fields built from it verify as a chain."""
    import asyncio

    from journal_support import with_store

    from airlock.journal.store import Store

    shipped: list[Any] = []

    async def body(store: Store) -> None:
        store.on_records = lambda events: shipped.extend((e, store.head()[0]) for e in events)
        await asyncio.gather(
            *(
                store.append(writer="intake", kind="request.received", request_id=f"r{i}", payload={"i": i})
                for i in range(20)
            )
        )

    with_store(tmp_path / "journal.db", body)
    assert [e.seq for e, _ in shipped] == list(range(1, 21))
    assert all(head >= e.seq for e, head in shipped)  # never ahead of the commit
    entries = [entry(e.to_dict()) for e, _ in shipped]
    report = fleet.verify_hosts(entries, trust_claimed=True)
    assert report.ok and report.hosts[HOST_A].records == 20


def test_journald_failing_never_breaks_the_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipper runs inside the commit: journald gone (send raises) must not raise into it."""
    from airlock.common import log
    from airlock.journal import anchoring, journalfiles

    calls: list[int] = []

    class Gone:
        host = HOST_A

        def __init__(self, _host: str) -> None:
            pass

        def __call__(self, events: Any) -> None:
            calls.append(len(events))
            raise OSError(2, "No such file or directory")

    monkeypatch.setattr(log, "_journald_in_use", True)
    monkeypatch.setattr(journalfiles, "RecordSender", Gone)
    monkeypatch.setattr(journalfiles, "local_host", lambda: HOST_A)
    ship, host = anchoring.shipping()
    assert ship is not None and host == HOST_A
    ship([object(), object()])  # no exception
    assert calls == [2]
    monkeypatch.setattr(log, "_journald_in_use", False)
    assert anchoring.shipping() == (None, None)  # dev mode: nothing goes to journald


def test_an_acknowledged_cut_is_a_new_segment_and_the_cut_records_stay_as_evidence() -> None:
    records = make_chain(10)
    # the host cut 7..10 and acknowledged: its ack links to seq 6 and takes seq 11
    ack = make_chain(1, start=11, prev=records[5]["hash"], kind=chain.ACK_KIND)[0]
    after = make_chain(2, start=12, prev=ack["hash"])
    entries = [entry(r) for r in records + after] + [entry(ack, _SYSTEMD_UNIT="session-1.scope", _UID=0)]
    host = fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A]
    assert host.ok, host.to_dict()
    assert host.segments == [{"seq": 11, "after": 6, "cut": [7, 10]}]
    # the database after the acknowledgement: 1..6, 11..13 -- compare accepts the acknowledged cut
    local = {r["seq"]: r["hash"] for r in [*records[:6], ack, *after]}
    collected = {r["seq"]: r["hash"] for r in [*records, ack, *after]}
    assert not compare(local, collected).ok
    accepted = compare(local, collected, [(7, 10)])
    assert accepted.ok and accepted.acknowledged == [(7, 10)] and accepted.compared == 9


def test_an_acknowledgement_linking_to_nothing_held_fails() -> None:
    records = make_chain(5)
    ack = make_chain(1, start=9, prev="e" * 64, kind=chain.ACK_KIND)[0]
    host = fleet.verify_hosts([entry(r) for r in records] + [entry(ack, _UID=0)], trust_claimed=True).hosts[HOST_A]
    assert not host.ok and host.first_bad_seq == 9


# --- issue 29: chains keyed by the hosts' own checkpoint keys ---------------------------


def _checkpoint(record: dict[str, Any], host: str = HOST_A, prev: tuple[int, str] | None = None) -> dict[str, Any]:
    from airlock.common import checkpoint

    made = checkpoint.Checkpoint(host, record["seq"], record["hash"], "2026-12-03T09:01:00.000Z", prev)
    return anchor_entry(
        record["seq"], record["hash"], host, AIRLOCK_CHECKPOINT=made.statement(), AIRLOCK_SIGNATURE=f"sig-{host}"
    )


def _verified(entries: list[dict[str, Any]], good: set[str]) -> dict[tuple[bytes, str], str]:
    """Stand-in for ssh-keygen: the signatures ``good`` names check out."""
    return {(s.statement, s.signature): "SHA256:k" for s in fleet.checkpoints_in(entries) if s.signature in good}


def test_with_keys_only_the_chain_a_hosts_checkpoint_signs_is_its_own() -> None:
    records = make_chain(6)
    forged = make_chain(1, start=4, prev=records[2]["hash"], kind="exec.finished")[0]
    entries = [entry(r) for r in records[:3]] + [entry(forged)] + [entry(r) for r in records[3:]]
    entries += [_checkpoint(records[4])]
    report = fleet.verify_hosts(entries, verified=_verified(entries, {f"sig-{HOST_A}"}))
    host = report.hosts[HOST_A]
    assert host.ok and host.proven_to == 5 and host.unproven_tail == [(6, 6)] and host.records == 6
    assert report.unproven == [
        {"host": HOST_A, "what": "record", "seq": 4, "why": "not on the chain this host's signed checkpoints cover"}
    ]
    assert not report.ok  # a forgery is on the collector
    # control: by claimed name, the forged record is web1's, and web1's chain fails
    plain = fleet.verify_hosts(entries, trust_claimed=True).hosts[HOST_A]
    assert not plain.ok and plain.conflicts == [4]


def test_a_checkpoint_not_signed_by_the_hosts_key_proves_nothing() -> None:
    records = make_chain(3)
    entries = [entry(r) for r in records] + [_checkpoint(records[2])]
    report = fleet.verify_hosts(entries, verified=_verified(entries, set()))
    assert not report.hosts[HOST_A].ok
    assert {u["what"] for u in report.unproven} == {"checkpoint"}


def test_a_host_that_rewrites_its_shipped_history_is_caught_by_its_own_checkpoints() -> None:
    first = make_chain(5)
    rewritten = make_chain(4, start=3, prev=first[1]["hash"], kind="exec.started")  # seqs 3-6, another history
    entries = [entry(r) for r in first] + [_checkpoint(first[4])]
    entries += [entry(r) for r in rewritten] + [_checkpoint(rewritten[-1], prev=(5, rewritten[2]["hash"]))]
    report = fleet.verify_hosts(entries, verified=_verified(entries, {f"sig-{HOST_A}"}))
    host = report.hosts[HOST_A]
    assert not host.ok
    assert any("does not extend this host's earlier one at seq 5" in p for p in host.problems), host.problems
    assert host.conflicts == [3, 4, 5]  # both histories are signed by the host itself


def test_without_keys_every_host_is_unproven_unless_the_caller_trusts_claimed_names() -> None:
    """Issue 44: web2's root ships a whole chain under web1's name; without keys it never
    verifies as web1's.  Only a caller that chose to trust claimed names gets ok."""
    a, b = make_chain(4), make_chain(3, kind="exec.started")
    genuine = [entry(r) for r in a]
    forged = [entry(r, HOST_A) for r in b]  # web2's own chain, claiming web1
    for entries in (genuine, forged, genuine + [entry(r, HOST_B) for r in b]):
        report = fleet.verify_hosts(entries)
        assert not report.ok and not report.keyed, report.to_dict()
        assert report.claimed_only == sorted({e["AIRLOCK_HOST"] for e in entries})
        assert report.to_dict()["unproven_hosts"] == report.claimed_only and not report.to_dict()["ok"]
    # control: the chains themselves check out, and trusting the names says so
    trusted = fleet.verify_hosts(forged, trust_claimed=True)
    assert trusted.ok and trusted.claimed_only == [] and trusted.hosts[HOST_A].ok
    # a host that fails its chain fails either way
    assert not fleet.verify_hosts([entry(r) for r in a[1:3]] + [entry(a[0] | {"kind": "x"})]).ok

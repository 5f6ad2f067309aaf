"""Audit records in journald, as a collector holds them: the fields, per-host checks, compare.

The journal sends every record it commits to journald as one entry
(`record_fields`): ``MESSAGE_ID`` `RECORD_MESSAGE_ID`, ``AIRLOCK_SEQ``,
``AIRLOCK_HASH``, ``AIRLOCK_PREV_HASH``, ``AIRLOCK_KIND``, ``AIRLOCK_HOST``
and ``AIRLOCK_RECORD`` -- the canonical record, the exact bytes that were
hashed (`airlock.journal.chain.record_bytes`).  With the previous hash those
bytes are all one needs to recompute the record's hash, so a collector that
received the entries through ``systemd-journal-upload`` checks every host's
chain with no database (`verify_hosts`), and a host compares its database with
what the collector holds (`compare`).

``AIRLOCK_HOST`` is ``<hostname>/<machine-id>``: the machine ID is stable and
unique per installation, the hostname is for people.  Each distinct value is
one chain.

What counts: journald itself sets ``_SYSTEMD_UNIT`` and ``_UID`` (a sender
cannot choose them), so a record counts only from ``airlock-journal.service``,
or -- an acknowledgement written by ``airlock audit acknowledge`` -- from
root.  The same holds for anchors (`airlock.journal.anchors.read_journald`).
Anything else carrying these MESSAGE_IDs is counted as ignored, never used.

Pure: no I/O.  Reading journal files is `airlock.journal.journalfiles`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.journal import chain
from airlock.journal.chain import ACK_KIND, Anchor, AnchorCheck, VerifyResult

# A record as a journald entry and back is journal/entries.py; its names are fleet's too (re-exported).
from airlock.journal.entries import (
    ANCHOR_MESSAGE_ID as ANCHOR_MESSAGE_ID,
)
from airlock.journal.entries import (
    JOURNAL_UNIT as JOURNAL_UNIT,
)
from airlock.journal.entries import (
    RECORD_EVENT as RECORD_EVENT,
)
from airlock.journal.entries import (
    RECORD_MESSAGE_ID as RECORD_MESSAGE_ID,
)
from airlock.journal.entries import (
    Shipped as Shipped,
)
from airlock.journal.entries import (
    Signed as Signed,
)
from airlock.journal.entries import (
    Unusable as Unusable,
)
from airlock.journal.entries import (
    _text_or_none as _text_or_none,
)
from airlock.journal.entries import (
    checkpoints_in as checkpoints_in,
)
from airlock.journal.entries import (
    host_identity as host_identity,
)
from airlock.journal.entries import (
    host_matches as host_matches,
)
from airlock.journal.entries import (
    parse_anchor as parse_anchor,
)
from airlock.journal.entries import (
    parse_record as parse_record,
)
from airlock.journal.entries import (
    parse_signed as parse_signed,
)
from airlock.journal.entries import (
    record_fields as record_fields,
)
from airlock.journal.entries import (
    record_message as record_message,
)
from airlock.journal.entries import (
    trusted as trusted,
)

# -- per-host verification -----------------------------------------------------


@dataclass(slots=True)
class HostReport:
    """What the collector holds of one host's chain, and whether it checks out."""

    host: str
    records: int = 0
    duplicates: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    first_time: str | None = None
    last_time: str | None = None
    gaps: list[tuple[int, int]] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)
    runs: list[VerifyResult] = field(default_factory=list)
    anchors: AnchorCheck | None = None
    problems: list[str] = field(default_factory=list)
    # Acknowledged cuts: {"seq": the acknowledgement, "after": the record it links to,
    # "cut": [first, last] seq the host cut and the collector still holds, or None}.
    segments: list[dict[str, Any]] = field(default_factory=list)
    unlinked: list[int] = field(default_factory=list)  # acknowledgements that link to nothing held
    # With host keys (issue 29): the key its checkpoints are signed with, how many
    # verify, and the records past the newest one (not proven yet, not held against it).
    key: str | None = None
    checkpoints: int = 0
    proven_to: int | None = None
    unproven_tail: list[tuple[int, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first_bad_seq(self) -> int | None:
        bad = [lo for lo, _ in self.gaps] + self.conflicts + self.unlinked
        bad += [r.first_bad_seq for r in self.runs if r.first_bad_seq]
        if self.anchors is not None and self.anchors.first_bad_seq is not None:
            bad.append(self.anchors.first_bad_seq)
        return min(bad, default=None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "ok": self.ok,
            "records": self.records,
            "duplicates": self.duplicates,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "first_time": self.first_time,
            "last_time": self.last_time,
            "gaps": [{"from": lo, "to": hi} for lo, hi in self.gaps],
            "conflicts": self.conflicts,
            "first_bad_seq": self.first_bad_seq,
            "anchors": self.anchors.to_dict() if self.anchors is not None else None,
            "segments": self.segments,
            "problems": self.problems,
            "key": self.key,
            "checkpoints": self.checkpoints,
            "proven_to": self.proven_to,
            "unproven_tail": [{"from": lo, "to": hi} for lo, hi in self.unproven_tail],
        }


@dataclass(slots=True)
class FleetReport:
    hosts: dict[str, HostReport]
    ignored: list[str]  # entries not used, and why
    # With host keys: True; records, acknowledgements and checkpoints that claim a
    # host they cannot prove (forged elsewhere, or the host's own history rewritten).
    keyed: bool = False
    unproven: list[dict[str, Any]] = field(default_factory=list)
    # Without keys, a host is only the name its records claim (any host's root can write
    # any AIRLOCK_HOST): such a report is not ok unless the caller chose to trust the names.
    trust_claimed: bool = False

    @property
    def claimed_only(self) -> list[str]:
        """The hosts known only by the name their records claim, untrusted (issue 44)."""
        return [] if self.keyed or self.trust_claimed else list(self.hosts)

    @property
    def ok(self) -> bool:
        healthy = bool(self.hosts) and all(h.ok for h in self.hosts.values()) and not self.unproven
        return healthy and not self.claimed_only

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "hosts": [h.to_dict() for h in self.hosts.values()],
            "ignored": len(self.ignored),
            "ignored_reasons": self.ignored[:20],
            "keyed": self.keyed,
            "unproven": self.unproven,
            "trust_claimed": self.trust_claimed,
            "unproven_hosts": self.claimed_only,
        }


def _ranges(seqs: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] == s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _span(lo: int, hi: int) -> str:
    return f"seq {lo}" if lo == hi else f"seqs {lo}-{hi}"


def verify_host(host: str, shipped: Iterable[Shipped], anchors: Iterable[Anchor] = ()) -> HostReport:
    """Check one host's records: content and hashes, seq continuity (gaps as ranges), anchors.

    The chain is checked with `chain.verify_rows` run by run: a gap ends a
    run (and is reported), except the seq jump right before an
    acknowledgement, which `verify_rows` accepts when it links.  A collector
    that holds no records before seq N (older ones vacuumed, or the host
    shipped only from then on) is not an error: the first run starts at N
    and its first ``prev_hash`` is taken on trust; ``first_seq`` says so.
    """
    report = HostReport(host)
    by_seq: dict[int, Shipped] = {}
    for item in shipped:
        seen = by_seq.get(item.seq)
        if seen is None:
            by_seq[item.seq] = item
        elif seen.row == item.row:
            report.duplicates += 1
        elif item.seq not in report.conflicts:
            report.conflicts.append(item.seq)
    report.conflicts.sort()
    for seq in report.conflicts:
        report.problems.append(f"seq {seq}: the collector holds two different records")
    seqs = sorted(by_seq)
    report.records = len(seqs)
    if not seqs:
        report.problems.append("no records from this host")
        return report
    report.first_seq, report.last_seq = seqs[0], seqs[-1]
    report.first_time, report.last_time = by_seq[seqs[0]].row["time"], by_seq[seqs[-1]].row["time"]

    # Runs of consecutive seqs.  An acknowledgement starts a run of its own: it links
    # to the last record its host kept, which may be older than records the collector
    # still holds (the cut it acknowledged) -- those stay here, as evidence.
    runs: list[list[Shipped]] = []
    missing: list[int] = []
    seq_of = {item.hash: seq for seq, item in by_seq.items()}
    for seq in seqs:
        item = by_seq[seq]
        if item.row["kind"] == ACK_KIND and runs:
            link = seq_of.get(item.row["prev_hash"])
            if link is None or link >= seq:
                report.unlinked.append(seq)
                report.problems.append(
                    f"seq {seq}: an acknowledgement that links to no earlier record on the collector"
                )
            else:
                end = runs[-1][-1].seq
                report.segments.append({"seq": seq, "after": link, "cut": [link + 1, end] if end > link else None})
            runs.append([item])
            continue
        if runs and seq == runs[-1][-1].seq + 1:
            runs[-1].append(item)
            continue
        if runs:
            missing.extend(range(runs[-1][-1].seq + 1, seq))
        runs.append([item])
    report.gaps = _ranges(missing)
    for lo, hi in report.gaps:
        report.problems.append(f"{_span(lo, hi)} missing on the collector")
    for run in runs:
        start = run[0].seq
        result = chain.verify_rows((s.row for s in run), from_seq=None if start == 1 else start)
        report.runs.append(result)
        if not result.ok:
            report.problems.append(result.reason or f"seq {result.first_bad_seq}: bad record")

    wanted = list(anchors)
    if wanted:
        stored = {seq: item.hash for seq, item in by_seq.items()}
        before = {a.seq: max((s for s in seqs if s < a.seq), default=0) for a in wanted if a.seq not in stored}
        acks = {seq: item.hash for seq, item in by_seq.items() if item.row["kind"] == ACK_KIND}
        check = chain.check_anchors(
            wanted, stored=stored, head_seq=seqs[-1], high_water=seqs[-1], acks=acks, before=before
        )
        report.anchors = check
        if not check.ok:
            report.problems.append(f"anchors: {check.reason}")
    return report


def verify_hosts(
    entries: Iterable[Mapping[str, Any]],
    *,
    host: str | None = None,
    verified: Mapping[tuple[bytes, str], str] | None = None,
    trust_claimed: bool = False,
) -> FleetReport:
    """Sort a collector's entries by host and check each host's chain on its own.

    ``entries`` are journald entries (field -> value) with the record or the
    anchor MESSAGE_ID; ``host`` keeps only the hosts it names (`host_matches`).

    ``verified`` (issue 29): the signed checkpoints (statement, signature) whose
    signature checked out against the key the host-keys file lists for the host
    they name, each with that key's fingerprint (`checkpoints_in` finds them;
    the caller runs ssh-keygen).  With it, a host's chain is what its own key
    vouches for (`prove`): only records on the hash chain a verified checkpoint
    signs count as the host's (and records past the newest one, not signed
    yet, except an acknowledgement), the checkpoints must extend one another,
    and everything else that claims the host is reported in ``unproven``.  Without
    it, ``AIRLOCK_HOST`` is taken as it comes (any host's root can write it), so
    every host is unproven and the report is not ok unless ``trust_claimed``
    (issue 44: a collector proves or says it cannot).
    """
    records: dict[str, list[Shipped]] = {}
    anchors: dict[str, list[Anchor]] = {}
    signed: dict[str, list[Signed]] = {}
    ignored: list[str] = []
    for entry in entries:
        message_id = _text_or_none(entry, "MESSAGE_ID")
        try:
            if message_id == RECORD_MESSAGE_ID:
                item = parse_record(entry)
                if not trusted(entry, root_only=item.row["kind"] == ACK_KIND):
                    raise Unusable(f"seq {item.seq}: not written by {JOURNAL_UNIT} (or, an acknowledgement, root)")
                if host is None or host_matches(item.host, host):
                    records.setdefault(item.host, []).append(item)
            elif message_id == ANCHOR_MESSAGE_ID:
                name, anchor = parse_anchor(entry)
                if not trusted(entry, root_only=anchor.ack):
                    raise Unusable(f"anchor at seq {anchor.seq}: not written by {JOURNAL_UNIT}")
                cp = parse_signed(entry) if verified is not None else None
                if cp is not None:
                    signed.setdefault(cp.checkpoint.host, []).append(cp)
                elif name is not None:
                    anchors.setdefault(name, []).append(anchor)
        except Unusable as exc:
            ignored.append(str(exc))
    if verified is None:
        reports = {name: verify_host(name, items, anchors.get(name, ())) for name, items in sorted(records.items())}
        return FleetReport(reports, ignored, trust_claimed=trust_claimed)
    report = FleetReport({}, ignored, keyed=True)
    for name in sorted(set(records) | {h for h in signed if host is None or host_matches(h, host)}):
        kept, proofs = prove(name, records.get(name, []), signed.get(name, []), anchors.get(name, []), verified, report)
        result = verify_host(name, kept, proofs)
        result.key, result.checkpoints = (
            _key_of(name, signed.get(name, []), verified),
            len([p for p in proofs if not p.ack]),
        )
        if not kept:
            result.problems[:] = ["no record of this host is proven by a checkpoint signed by its key"]
        result.proven_to = max((p.seq for p in proofs if not p.ack), default=None)
        if result.proven_to is not None:
            result.unproven_tail = _ranges(sorted(i.seq for i in kept if i.seq > result.proven_to))
        elif kept:
            result.problems.append("no checkpoint signed by this host's key: none of its records is proven")
        result.problems.extend(_disagreements(name, signed.get(name, []), verified, kept))
        report.hosts[name] = result
    return report


def _key_of(name: str, signed: list[Signed], verified: Mapping[tuple[bytes, str], str]) -> str | None:
    return next((verified[(s.statement, s.signature)] for s in signed if (s.statement, s.signature) in verified), None)


def prove(
    name: str,
    shipped: list[Shipped],
    signed: list[Signed],
    unsigned: list[Anchor],
    verified: Mapping[tuple[bytes, str], str],
    report: FleetReport,
) -> tuple[list[Shipped], list[Anchor]]:
    """Which of the records claiming host ``name`` its own key vouches for.

    A record is proven when it lies on the hash chain that a checkpoint signed
    by the host's key names: walk back from each verified checkpoint's hash
    through ``prev_hash``.  Records past the newest verified checkpoint (not
    signed yet) are kept too, unless they contradict a proven record at the
    same seq.  Everything else -- a record at a seq the host's checkpoints cover
    that is not on their chain, a checkpoint whose signature is not the host's
    key's, an acknowledgement nobody's key vouches for -- goes to
    ``report.unproven``.  Returns the records to check as the host's chain and
    the anchors to check it against (the verified checkpoints, and the ack
    anchors of proven acknowledgements).
    """
    good = [s for s in signed if (s.statement, s.signature) in verified]
    for bad in (s for s in signed if (s.statement, s.signature) not in verified):
        report.unproven.append(
            {
                "host": name,
                "what": "checkpoint",
                "seq": bad.checkpoint.seq,
                "why": "its signature is not by the key the host-keys file lists for this host",
            }
        )
    by_hash: dict[str, Shipped] = {}
    for item in shipped:
        by_hash.setdefault(item.hash, item)
    proven: set[str] = set()
    for cp in sorted(good, key=lambda s: -s.checkpoint.seq):
        digest: str | None = cp.checkpoint.hash
        while digest is not None and digest in by_hash and digest not in proven:
            proven.add(digest)
            digest = by_hash[digest].row["prev_hash"]
    top = max((s.checkpoint.seq for s in good), default=0)
    proven_seqs = {by_hash[h].seq for h in proven}
    kept: list[Shipped] = []
    for item in shipped:
        tail = item.seq > top and item.seq not in proven_seqs and item.row["kind"] != ACK_KIND
        if item.hash in proven or tail:  # an acknowledgement rewrites history: it counts only once signed for
            kept.append(item)
            continue
        what = "acknowledgement" if item.row["kind"] == ACK_KIND else "record"
        report.unproven.append(
            {
                "host": name,
                "what": what,
                "seq": item.seq,
                "why": "not on the chain this host's signed checkpoints cover",
            }
        )
    proofs = [Anchor(s.checkpoint.seq, s.checkpoint.hash) for s in good]
    proofs += [a for a in unsigned if a.ack and a.hash in proven]
    return kept, proofs


def _disagreements(
    name: str, signed: list[Signed], verified: Mapping[tuple[bytes, str], str], kept: list[Shipped]
) -> list[str]:
    """The host's own signed checkpoints that do not extend one another (history rewritten after shipping).

    Two verified checkpoints for one seq with different hashes, or a checkpoint
    whose ``prev`` names a seq another verified checkpoint (or a proven record)
    gives another hash.  Where the records between two checkpoints are held,
    `prove` and the chain check find the same thing from the records.
    """
    good = sorted({s.checkpoint for s in signed if (s.statement, s.signature) in verified}, key=lambda c: c.seq)
    known: dict[int, set[str]] = {}
    for cp in good:
        known.setdefault(cp.seq, set()).add(cp.hash)
    by_hash = {item.hash: item for item in kept}
    problems = []
    for seq, hashes in sorted(known.items()):
        if len(hashes) > 1:
            problems.append(f"seq {seq}: this host signed two different heads (its history was rewritten)")
    found: set[tuple[int, int]] = set()
    for later in good:
        # The chain this checkpoint signs, walked back through the records held (to an acknowledgement:
        # a cut the host declared, reported as a segment).
        path: dict[int, str] = {}
        digest: str | None = later.hash
        while digest is not None and digest in by_hash:
            item = by_hash[digest]
            path[item.seq] = item.hash
            if item.row["kind"] == ACK_KIND:
                break
            digest = item.row["prev_hash"]
        claims = [(earlier.seq, earlier.hash) for earlier in good if earlier.seq < later.seq]
        if later.prev is not None:
            claims.append(later.prev)
        for seq, digest_at in claims:
            other = known.get(seq, set())
            wrong = (seq in path and path[seq] != digest_at) or (
                (seq, digest_at) == later.prev and other and digest_at not in other
            )
            if wrong and (seq, later.seq) not in found:
                found.add((seq, later.seq))
                problems.append(
                    f"seq {later.seq}: the checkpoint does not extend this host's earlier one at seq {seq} "
                    "(its history was rewritten after it was shipped)"
                )
    return problems

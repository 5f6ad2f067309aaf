"""A host's own database compared with the collector's copy of its records (`airlock audit verify
--journal` on the host, cli/fleet.py).

Every record the collector holds must be in the database with the same hash;
records the collector lacks are listed (not uploaded yet), not held against it.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airlock.journal.fleet import _ranges


@dataclass(frozen=True, slots=True)
class Comparison:
    """A host's database compared with the collector's copy of its records."""

    ok: bool
    first_differing_seq: int | None
    reason: str | None
    local_head: int
    collected_last: int | None
    compared: int
    not_collected: list[tuple[int, int]]  # local records the collector lacks (not yet uploaded, or lost)
    acknowledged: list[tuple[int, int]] = field(default_factory=list)  # cut, acknowledged, held by the collector

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "first_differing_seq": self.first_differing_seq,
            "reason": self.reason,
            "local_head": self.local_head,
            "collected_last": self.collected_last,
            "compared": self.compared,
            "not_collected": [{"from": lo, "to": hi} for lo, hi in self.not_collected],
            "acknowledged": [{"from": lo, "to": hi} for lo, hi in self.acknowledged],
        }


def compare(
    local: Mapping[int, str], collected: Mapping[int, str], acknowledged: Iterable[tuple[int, int]] = ()
) -> Comparison:
    """Compare seq -> hash of the local database with seq -> hash on the collector.

    Every record the collector holds must be in the database with the same
    hash: a record missing there was deleted (past the local head: the
    database was cut short), one with another hash was rewritten.  Reported
    with the first seq that differs.  Local records the collector does not
    hold are listed, not held against the database (not uploaded yet).
    ``acknowledged``: seq ranges an acknowledgement on the collector says the
    host cut (`HostReport.segments`); the database need not hold those.
    """
    cuts = sorted(acknowledged)
    local_head = max(local, default=0)
    collected_last = max(collected, default=None)
    problems: list[tuple[int, str]] = []
    compared = 0
    for seq in sorted(collected):
        if any(lo <= seq <= hi for lo, hi in cuts):
            continue
        have = local.get(seq)
        if have is None:
            if seq > local_head:
                problems.append(
                    (
                        seq,
                        f"the database ends at seq {local_head} but the collector holds records "
                        f"up to seq {collected_last}: the database was cut short after seq {local_head}",
                    )
                )
            else:
                problems.append((seq, f"seq {seq} is on the collector but not in the database (deleted)"))
            break
        compared += 1
        if have != collected[seq]:
            problems.append((seq, f"seq {seq}: the database's record differs from the collector's (rewritten)"))
            break
    not_collected = _ranges(sorted(s for s in local if s not in collected))
    if problems:
        seq, reason = problems[0]
        return Comparison(False, seq, reason, local_head, collected_last, compared, not_collected, cuts)
    return Comparison(True, None, None, local_head, collected_last, compared, not_collected, cuts)

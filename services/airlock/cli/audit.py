"""`airlock audit verify` against anchors, and `airlock audit acknowledge`.

verify walks the chain from the last verified point the journal recorded
(a ``chain.verified`` record, anchored) to the head; ``--full`` walks all of
it.  The anchors are compared in full every time.

verify asks the journal through the operator door (approval passes
``audit.verify`` on as the journal's ``verify``).  Anchors: the journal reads
its own anchors file (``own_anchors``: only it may read it); journald's are
read here with python3-systemd (the system journal: root or the
``adm``/``systemd-journal`` groups) and sent along, as is a given file's.
By default both the journal's file and -- when that journal writes its
anchors to journald, i.e. runs under systemd -- journald's.  Many anchors go
in several calls; the chain is walked once.

acknowledge writes the database directly (the journal stopped, as root under
systemd) against the anchors file beside it plus any ``--anchors`` named:
see `airlock.journal.store.acknowledge`.

``--lifecycle`` then reads every event through the operator door's events
feed (paged, oldest first) and folds each request's events through the
lifecycle table (`airlock.common.lifecycle`): a request whose story the table
forbids -- a start without an approval, two starts, any record after intake's
reply -- is a violation, named by request ID, seq, kind and the state it met.
A story that merely stops (a service killed before its next record) is not.
The whole journal is folded, whatever ``--from`` says.

Exit codes: 0 the journal checks out (acknowledged segments included) and,
with ``--lifecycle``, no request breaks the table; 1 a mismatch, a violation
or a daemon error, 2 usage or anchors that cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from airlock.common import client
from airlock.common.render import sanitise

# Anchors per verify call (the journal takes up to 4096; leave room).
BATCH = 4000


def _err(message: str) -> None:
    print(f"airlock: {message}", file=sys.stderr)


def _config(ns: argparse.Namespace) -> Any:
    from airlock.common import config as configuration

    return configuration.load(Path(ns.config) if getattr(ns, "config", None) else None)


def _writer_uids(ns: argparse.Namespace) -> set[int]:
    """Whose journald anchors count: the journal's user (from the config) and root."""
    from airlock.common.peer import uid_of

    uids = {0}
    try:
        uid = uid_of(_config(ns).services.journal_user)
    except Exception:  # a bad config must not hide the anchors root wrote
        uid = None
    if uid is not None:
        uids.add(uid)
    return uids


def _journald(ns: argparse.Namespace, *, required: bool) -> list[Any] | int:
    from airlock.journal import anchors

    try:
        found = anchors.read_journald(_writer_uids(ns))
    except anchors.JournaldUnavailable as exc:
        if required:
            _err(f"cannot read anchors from journald: {exc}")
            return 2
        return []
    if required and not found:
        _err(
            "no anchors in journald (is airlock-journal running under systemd here, "
            "and may you read the system journal?)"
        )
        return 2
    return found


def _file(source: str) -> list[Any] | int:
    from airlock.journal import anchors

    path = Path(source)
    if not path.is_file():
        _err(f"--anchors: no such file {source!r} (give journald, none or an anchors file)")
        return 2
    try:
        found, unreadable = anchors.read_file(path)
    except OSError as exc:
        _err(f"--anchors: cannot read {source}: {exc.strerror}")
        return 2
    if unreadable:
        _err(f"{unreadable} unreadable line(s) in {source}")
    return found


def _call(ns: argparse.Namespace, args: dict[str, Any]) -> tuple[str | None, dict[str, Any]] | int:
    try:
        _raw, reply = client.call(client.operator_socket(ns.socket), "audit.verify", args)
    except client.ClientError as exc:
        _err(str(exc))
        return 1
    if not reply.get("ok"):
        error = reply.get("error") or {}
        if ns.json:
            print(json.dumps(reply, separators=(",", ":")))
        else:
            _err(f"{error.get('code')}: {error.get('message')}")
        return 1
    return reply.get("id"), reply.get("data") or {}


def verify(ns: argparse.Namespace) -> int:
    """The chain and the anchors.  Default: the journal's own anchors file, and journald's
    anchors too when that journal writes them there (it runs under systemd)."""
    source = ns.anchors
    found: list[Any] = []
    if source == "journald":
        got = _journald(ns, required=True)
        label = "journald"
    elif source not in (None, "none"):
        got = _file(source)
        label = source
    else:
        got, label = [], "none" if source == "none" else "the anchors file"
    if isinstance(got, int):
        return got
    found = got
    base: dict[str, Any] = {}
    if ns.from_seq is not None:
        base["from"] = ns.from_seq
    if ns.anchor:
        base["anchor"] = ns.anchor
    full = {"full": True} if getattr(ns, "full", False) else {}
    first = _call(ns, base | full | {"anchors": _batch(found, 0), "own_anchors": source is None})
    if isinstance(first, int):
        return first
    envelope_id, data = first
    results = [data]
    if source is None and data.get("anchors_in_journald"):
        more = _journald(ns, required=False)
        found = more if isinstance(more, list) else []
        label = "the anchors file and journald" if found else "the anchors file (none readable in journald)"
    if source is None:
        numbers = range(_batches(found)) if found else range(0)
    else:
        numbers = range(1, _batches(found))  # the first batch went with the first call
    base.pop("full", None)  # the segments are walked once
    for number in numbers:
        later = _call(ns, base | {"anchors": _batch(found, number), "chain": False})
        if isinstance(later, int):
            return later
        results.append(later[1])
    data = merge(results)
    data["anchors"]["source"] = label
    if getattr(ns, "lifecycle", False):
        checked = lifecycle_check(ns)
        if isinstance(checked, int):
            return checked
        data["lifecycle"] = checked
        data["chain_ok"] = bool(data.get("ok"))
        data["ok"] = data["chain_ok"] and checked["ok"]
    if ns.json:  # the daemon's envelope, its data merged over the calls
        print(json.dumps({"id": envelope_id, "ok": True, "data": data}, separators=(",", ":")))
    else:
        print(render(data))
    return 0 if data.get("ok") else 1


# Violations listed in full; beyond this only counted.
MAX_VIOLATIONS = 1000


def lifecycle_check(ns: argparse.Namespace) -> dict[str, Any] | int:
    """Fold every request in the journal through the lifecycle table (the events feed, paged)."""
    from airlock.common import lifecycle

    def events() -> Iterator[dict[str, Any]]:
        for page in client.event_pages(client.operator_socket(ns.socket)):
            yield from page

    try:
        return lifecycle.check_journal(events(), listed=MAX_VIOLATIONS)
    except client.ClientError as exc:
        _err(str(exc))
        return 1


def render_lifecycle(checked: dict[str, Any]) -> list[str]:
    states = ", ".join(f"{state} {n}" for state, n in (checked.get("states") or {}).items()) or "none"
    head = "ok" if checked.get("ok") else f"FAILED, {checked.get('violation_count')} request(s) break the table"
    lines = [f"lifecycle: {head}; {checked.get('requests')} request(s) in {checked.get('events')} event(s) ({states})"]
    for u in checked.get("unrecorded_ends") or []:
        lines.append(
            f"lifecycle note: request {sanitise(str(u.get('request_id')))} was answered ok at seq {u.get('seq')} "
            f"with no end record; the journal restarted in between (seq {u.get('restart')}), which may have lost it"
        )
    for v in checked.get("violations") or []:
        lines.append(
            f"lifecycle violation: request {sanitise(str(v.get('request_id')))} "
            f"(operation {sanitise(str(v.get('operation_id')))}) at seq {v.get('seq')}: "
            f"{sanitise(str(v.get('kind')))} in state {v.get('state')}: {sanitise(str(v.get('reason')))}"
        )
    return lines


def _batches(found: list[Any]) -> int:
    rest = sum(1 for a in found if not a.ack)
    return max(1, -(-rest // BATCH))


def _batch(found: list[Any], number: int) -> list[dict[str, Any]]:
    """Batch ``number`` of the anchors; every batch carries the ack anchors (they confirm acknowledgements)."""
    acks = [a.to_dict() for a in found if a.ack]
    rest = [a.to_dict() for a in found if not a.ack]
    return acks + rest[number * BATCH : (number + 1) * BATCH]


def merge(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One answer from the answers to several batches of anchors (the first walked the chain)."""
    out = dict(results[0])
    anchors = dict(out.get("anchors") or {})
    bad = [(r["first_bad_seq"], r.get("reason")) for r in results if not r.get("ok")]
    for later in results[1:]:
        extra = later.get("anchors") or {}
        for key in ("checked", "acknowledged", "given"):
            anchors[key] = int(anchors.get(key) or 0) + int(extra.get(key) or 0)
    if bad:
        first = min(bad, key=lambda b: b[0] or 0)
        out |= {"ok": False, "first_bad_seq": first[0], "reason": first[1]}
    out["anchors"] = anchors
    return out


def render(data: dict[str, Any]) -> str:
    lines = []
    point = data.get("verified") or {}
    if data.get("chain_ok", data.get("ok")):
        if data.get("mode") == "incremental":
            lines.append(
                f"ok: {data.get('checked')} record(s) verified from the last verified point (seq {point.get('seq')}, "
                f"verified {sanitise(str(point.get('time')))}; --full walks all); "
                f"head {data.get('head_seq')} {data.get('head_hash')}"
            )
        else:
            lines.append(f"ok: {_counted(data)}; head {data.get('head_seq')} {data.get('head_hash')}")
    else:
        lines.append(f"FAILED at record {data.get('first_bad_seq')}: {sanitise(str(data.get('reason')))}")
    anchors = data.get("anchors") or {}
    lines.append(
        f"anchors: {anchors.get('checked', 0)} checked, {anchors.get('acknowledged', 0)} acknowledged "
        f"(from {anchors.get('source')})"
    )
    for seg in data.get("segments") or []:
        confirmed = "" if seg.get("confirmed") else " [no ack anchor in this source]"
        lines.append(
            f"segment: from seq {seg.get('seq')}, acknowledged by {sanitise(str(seg.get('operator')))}: "
            f"{sanitise(str(seg.get('reason')))} (previous head {seg.get('previous_seq')}){confirmed}"
        )
    full = data.get("full")
    if full:
        lines.append(
            f"segments: {full.get('segments')} sealed file(s), {len(full.get('deleted') or [])} deleted by retention; "
            + ("linked into one chain" if full.get("ok") else f"FAILED: {sanitise(str(full.get('reason')))}")
        )
    if data.get("lifecycle"):
        lines.extend(render_lifecycle(data["lifecycle"]))
    return "\n".join(lines)


def _counted(data: dict[str, Any]) -> str:
    """How many records were verified: with ``--full``, the sealed segments' and the live one's, and the total
    (issue 44: the live segment's count alone read as if it were all)."""
    full = data.get("full") or {}
    live = (full.get("live") or {}).get("checked") if isinstance(full.get("live"), dict) else None
    if not full or not isinstance(live, int) or not isinstance(full.get("checked"), int):
        return f"{data.get('checked')} record(s) verified"
    sealed = int(full["checked"]) - live
    return (
        f"{full['checked']} record(s) verified in all: {sealed} in {full.get('segments')} sealed segment file(s) "
        f"+ {live} in the live segment"
    )


def verify_segment(ns: argparse.Namespace) -> int:
    """`airlock audit verify --segment FILE`: one sealed segment on its own, read here (no daemon)."""
    from airlock.journal import segments

    path = Path(ns.segment)
    if not path.is_file():
        _err(f"--segment: no such file {ns.segment!r}")
        return 2
    result = segments.verify_file(path)
    if ns.json:
        print(json.dumps({"ok": True, "data": result}, separators=(",", ":")))
    elif result["ok"]:
        print(
            f"ok: segment {result['segment']} ({sanitise(str(path))}): {result['checked']} record(s), seqs "
            f"{result['first_seq']}-{result['last_seq']}, sealed {result['sealed_at']}; final hash "
            f"{result['final_hash']}; links to {result['first_prev_hash']}"
        )
    else:
        print(f"FAILED at record {result.get('first_bad_seq')}: {sanitise(str(result.get('reason')))}")
    return 0 if result["ok"] else 1


def archive(ns: argparse.Namespace) -> int:
    """`airlock audit archive`: the segments, the archive and, with --confirm, deleting past the limits."""
    args: dict[str, Any] = {"confirm": bool(ns.confirm)}
    if ns.shipped:
        args["shipped"] = ns.shipped
    try:
        _raw, reply = client.call(client.operator_socket(ns.socket), "audit.archive", args, timeout=600)
    except client.ClientError as exc:
        _err(str(exc))
        return 1
    if ns.json:
        print(json.dumps(reply, separators=(",", ":")))
        return 0 if reply.get("ok") else 1
    if not reply.get("ok"):
        error = reply.get("error") or {}
        _err(f"{error.get('code')}: {sanitise(str(error.get('message')))}")
        return 1
    data = reply.get("data") or {}
    for label, key in (("sealed", "segments"), ("archived", "archive")):
        for seg in data.get(key) or []:
            print(
                f"{label}: segment {seg['segment']} seqs {seg['first_seq']}-{seg['last_seq']} "
                f"{seg['bytes']} bytes, sealed {seg['sealed_at']} ({sanitise(str(seg['file']))})"
            )
    for seg in data.get("archived") or []:
        print(f"moved to the archive: segment {seg['segment']}")
    for seg in data.get("deleted") or []:
        print(f"deleted ({seg['reason']}): segment {seg['segment']} seqs {seg['first_seq']}-{seg['last_seq']}")
    for seg in data.get("kept") or []:
        print(f"past the archive's limits, kept: segment {seg['segment']}: {sanitise(str(seg['why']))}")
    print(
        f"{len(data.get('segments') or [])} sealed segment(s), {len(data.get('archive') or [])} archived in "
        f"{sanitise(str(data.get('archive_dir')))}; deleting past the archive's limits: {data.get('delete_when')}"
    )
    return 0


def acknowledge(ns: argparse.Namespace) -> int:
    from airlock.common.errors import AirlockError
    from airlock.journal import anchors, store
    from airlock.journal.chain import Anchor

    try:
        database = Path(ns.database) if ns.database else _config(ns).paths.state_dir / "journal.sqlite"
    except Exception as exc:  # ConfigError: its text is the message
        _err(str(exc))
        return 2
    own, unreadable = anchors.read_file(anchors.path_beside(database))
    if unreadable:
        _err(f"{unreadable} unreadable line(s) in {anchors.path_beside(database)}")
    label = str(anchors.path_beside(database))
    extra: list[Any] | int = []
    if ns.anchors == "journald":
        extra, label = _journald(ns, required=True), f"{label} and journald"
    elif ns.anchors not in (None, "none"):
        extra, label = _file(ns.anchors), f"{label} and {ns.anchors}"
    if isinstance(extra, int):
        return extra
    found = own + extra
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    sudo = os.environ.get("SUDO_USER")
    operator = f"{sudo} (as {name})" if sudo and sudo != name else name
    try:
        done = store.acknowledge(database, found, operator=operator, uid=uid, reason=ns.reason)
    except AirlockError as exc:
        _err(f"{exc.code.value}: {exc.message}")
        return 1
    event = done.event
    mark = Anchor(event.seq, event.hash, ack=True)
    st = os.stat(database)
    try:
        anchors.append(anchors.path_beside(database), mark, "acknowledged", time.time(), owner=(st.st_uid, st.st_gid))
    except OSError as exc:
        _err(f"the acknowledgement is in the database, but its anchor could not be written: {exc}")
        return 1
    host = _ship_acknowledgement(event)
    sent = anchors.send_journald(mark, "acknowledged", host=host)
    previous = event.payload.get("previous") or {}
    result = {
        "seq": event.seq,
        "hash": event.hash,
        "previous": event.payload.get("previous"),
        "contradicted": event.payload.get("contradicted"),
        "operator": operator,
        "anchors": label,
        "journald": sent,
    }
    if ns.json:
        print(json.dumps(result, separators=(",", ":")))
    else:
        print(
            f"acknowledged: a new chain segment begins at seq {event.seq} "
            f"(previous head {previous.get('seq')}; first contradiction at seq "
            f"{done.mismatch.first_bad_seq}: {done.mismatch.reason})"
        )
        print("now start the journal again: systemctl start airlock-journal.socket (or airlock dev up)")
    return 0


def _ship_acknowledgement(event: Any) -> str | None:
    """The acknowledgement record to journald as the journal ships every record (for a collector);
    this host's identity, or None when there is no journald here."""
    from airlock.journal import journalfiles

    try:
        sender = journalfiles.RecordSender(journalfiles.local_host())
        sender([event])
    except (ImportError, OSError, ValueError):
        return None
    return sender.host

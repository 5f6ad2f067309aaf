"""`airlock audit verify --journal` and `airlock audit compare`: the audit as a collector holds it.

verify reads journal files or directories (what ``systemd-journal-remote``
writes on a collector) with python3-systemd and checks every host's chain on
its own (`airlock.journal.fleet.verify_hosts`): no airlock service and no root
needed, only read access to the files.

compare runs on a host: it reads the host's own database (read-only, straight
from the file: it works while the journal refuses to serve, which is exactly
when it is wanted) and compares it with the host's records in the collector's
files (`airlock.journal.collected.compare`).

Exit codes: 0 everything checks out; 1 a mismatch; 2 usage, or files that
cannot be read.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from airlock.common.render import sanitise


def _err(message: str) -> None:
    print(f"airlock: {message}", file=sys.stderr)


def add_verify_arguments(sp: argparse.ArgumentParser) -> None:
    """`airlock audit verify`'s options for a collector's journal files."""
    sp.add_argument(
        "--journal",
        action="append",
        metavar="PATH",
        help="check the records in these journal files or directories (a collector's "
        "systemd-journal-remote output) instead of the local journal; repeatable",
    )
    sp.add_argument(
        "--host",
        dest="journal_host",
        metavar="H",
        help="with --journal: only this host (its AIRLOCK_HOST, hostname or machine ID)",
    )
    sp.add_argument(
        "--host-keys",
        metavar="FILE",
        help="with --journal: the hosts' checkpoint keys (allowed_signers format, one `airlock audit host-key` "
        "line per host): a host's records count only on the chain its own key's checkpoints sign",
    )
    sp.add_argument(
        "--trust-claimed-hosts",
        action="store_true",
        help="with --journal and no --host-keys: accept the host each record claims (any host's root can "
        "claim any name); without it, hosts that no key proves are UNPROVEN and verify exits 1",
    )


def add_global_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--host",
        dest="remote_hosts",
        action="append",
        metavar="[USER@]HOST",
        help="run the command on this host through OpenSSH (its own airlock and peer checks decide); "
        "with watch, repeat it to watch several hosts",
    )
    p.add_argument("--ssh-config", metavar="FILE", help="with --host: the ssh_config(5) file to use (ssh -F)")


def add_watch_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument(
        "--host",
        dest="watch_hosts",
        action="append",
        metavar="[USER@]HOST",
        help="watch this host over SSH; repeat for several (each request is labelled with its host)",
    )
    sp.add_argument(
        "--ssh-config", dest="watch_ssh_config", metavar="FILE", help="ssh_config(5) file for --host (ssh -F)"
    )


def register_audit(audit_sub: Any) -> None:
    """`airlock audit compare`."""
    text = "compare this host's audit database with its records on a collector (journal files)"
    sp = audit_sub.add_parser("compare", help=text, description=text)
    sp.add_argument(
        "--journal",
        action="append",
        required=True,
        metavar="PATH",
        help="the collector's journal files or directories (copied here, or mounted)",
    )
    sp.add_argument(
        "--host",
        dest="journal_host",
        metavar="H",
        help="whose records to compare with (default: this host's AIRLOCK_HOST)",
    )
    sp.add_argument("--database", help="the journal database (default: the configured state_dir's)")
    sp.add_argument(
        "--host-keys",
        metavar="FILE",
        help="the hosts' checkpoint keys (default: this host's own, from journal.checkpoint_key's .pub): only "
        "records this host's key vouches for are held against the database",
    )
    sp.add_argument("--config", help="airlock.yaml to read (default /etc/airlock/airlock.yaml)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=compare)

    text = "print this host's checkpoint key as a line for a collector's host-keys file"
    sp = audit_sub.add_parser("host-key", help=text, description=text)
    sp.add_argument("--config", help="airlock.yaml to read (default /etc/airlock/airlock.yaml)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=host_key)


def _key_path(ns: argparse.Namespace) -> Path:
    from airlock.common import config as configuration

    return configuration.load(Path(ns.config) if getattr(ns, "config", None) else None).journal.checkpoint_key


def host_key(ns: argparse.Namespace) -> int:
    """`airlock audit host-key`: ``<host identity> <key type> <base64> [comment]``, for the collector's file."""
    from airlock.common import checkpoint, sshsig
    from airlock.journal import journalfiles

    try:
        key = _key_path(ns)
        host = journalfiles.local_host()
        public = sshsig.public_line(key)
    except sshsig.SigningError as exc:
        _err(f"{exc} (the package makes the key at install: see docs/fleet.md)")
        return 1
    except Exception as exc:  # a bad config or no machine ID: the message says which
        _err(str(exc))
        return 2
    line = checkpoint.host_key_line(host, public)
    if ns.json:
        print(json.dumps({"host": host, "key": public, "line": line, "path": f"{key}.pub"}, separators=(",", ":")))
    else:
        print(line)
    return 0


# Signatures checked at once (each one is an ssh-keygen process).
_PARALLEL = 4


def check_signatures(entries: list[dict[str, Any]], host_keys: Path) -> dict[tuple[bytes, str], str]:
    """(statement, signature) -> key fingerprint of every checkpoint whose signature is by the key
    ``host_keys`` lists for the host it names (ssh-keygen -Y verify, namespace airlock-checkpoint)."""
    import asyncio

    from airlock.common import checkpoint, sshsig
    from airlock.journal import fleet

    found = fleet.checkpoints_in(entries)

    async def run() -> dict[tuple[bytes, str], str]:
        slots = asyncio.Semaphore(_PARALLEL)
        good: dict[tuple[bytes, str], str] = {}

        async def one(item: fleet.Signed) -> None:
            async with slots:
                key = await sshsig.verify(
                    host_keys, item.checkpoint.host, checkpoint.NAMESPACE, item.statement, item.signature
                )
            if key is not None:
                good[(item.statement, item.signature)] = key

        await asyncio.gather(*(one(item) for item in found))
        return good

    return asyncio.run(run())


def _host_keys(ns: argparse.Namespace) -> Path | int | None:
    if not getattr(ns, "host_keys", None):
        return None
    path = Path(ns.host_keys)
    if not path.is_file() or not os.access(path, os.R_OK):
        _err(f"--host-keys: cannot read {str(path)!r}")
        return 2
    return path


def _entries(ns: argparse.Namespace) -> list[dict[str, Any]] | int:
    from airlock.journal import journalfiles

    paths = [Path(p) for p in ns.journal]
    for path in paths:
        if not path.exists():
            _err(f"--journal: no such file or directory {str(path)!r}")
            return 2
        files = sorted(path.rglob("*.journal")) if path.is_dir() else [path]
        if files and not any(os.access(f, os.R_OK) for f in files):
            _err(
                f"--journal: cannot read the journal files in {path} (on a collector: be root, or in the "
                "group that owns them, e.g. systemd-journal-remote)"
            )
            return 2
    try:
        return list(journalfiles.read_entries(paths))
    except journalfiles.Unreadable as exc:
        _err(f"--journal: {exc}")
        return 2


def _range(lo: Any, hi: Any) -> str:
    return f"seq {lo}" if lo == hi else f"seqs {lo}-{hi}"


def verify_journal(ns: argparse.Namespace) -> int:
    """`airlock audit verify --journal PATH [--host H]`."""
    from airlock.journal import fleet

    if ns.from_seq is not None or ns.anchor or ns.lifecycle or getattr(ns, "anchors", None):
        _err(
            "--journal checks the collector's copy as it is: --from, --anchor, --anchors and --lifecycle "
            "are for the local journal"
        )
        return 2
    trust = bool(getattr(ns, "trust_claimed_hosts", False))
    if trust and getattr(ns, "host_keys", None):
        _err("--trust-claimed-hosts is for a collector without keys: with --host-keys, the keys decide")
        return 2
    keys = _host_keys(ns)
    if isinstance(keys, int):
        return keys
    entries = _entries(ns)
    if isinstance(entries, int):
        return entries
    verified = check_signatures(entries, keys) if keys is not None else None
    report = fleet.verify_hosts(entries, host=ns.journal_host, verified=verified, trust_claimed=trust)
    if ns.json:
        print(json.dumps(report.to_dict(), separators=(",", ":")))
    else:
        for host in report.hosts.values():
            print(_host_line(host, claimed=host.host in report.claimed_only))
        for line in _unproven_lines(report):
            print(line)
        if report.trust_claimed:
            print("note: hosts as their records claim them (--trust-claimed-hosts: any host's root can claim any name)")
        if report.ignored:
            print(
                f"ignored: {len(report.ignored)} entr{'y' if len(report.ignored) == 1 else 'ies'} "
                f"not usable as records or anchors (first: {sanitise(report.ignored[0])})"
            )
        if not report.hosts:
            wanted = f" of host {ns.journal_host!r}" if ns.journal_host else ""
            print(f"FAILED: no airlock records{wanted} in {', '.join(ns.journal)}")
        elif report.claimed_only and all(h.ok for h in report.hosts.values()):
            n = len(report.claimed_only)
            print(
                f"UNPROVEN: {n} host{'s' if n != 1 else ''} known only by the name {'their' if n != 1 else 'its'} "
                "records claim (any host's root can claim any name): give --host-keys FILE (docs/fleet.md), "
                "or --trust-claimed-hosts to accept the claimed names"
            )
        elif report.ok:
            n = len(report.hosts)
            print(f"ok: {n} host{'s' if n != 1 else ''} check out")
        else:
            bad = sum(not h.ok for h in report.hosts.values())
            print(f"FAILED: {bad} of {len(report.hosts)} host{'s' if len(report.hosts) != 1 else ''} do not check out")
    return 0 if report.ok else 1


def _unproven_lines(report: Any) -> list[str]:
    """What claims a host it cannot prove, grouped: ``UNPROVEN: 3 records (seqs 5-7) claim host web1/…: why``."""
    groups: dict[tuple[str, str, str], list[int]] = {}
    for item in report.unproven:
        groups.setdefault((item["host"], item["what"], item["why"]), []).append(int(item["seq"]))
    lines = []
    for (host, what, why), seqs in sorted(groups.items()):
        spans = ", ".join(_range(lo, hi) for lo, hi in _spans(sorted(seqs)))
        plural = "s" if len(seqs) != 1 else ""
        lines.append(f"UNPROVEN: {len(seqs)} {what}{plural} ({spans}) claim host {sanitise(host)}: {why}")
    return lines


def _spans(seqs: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in seqs:
        if out and out[-1][1] >= s - 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _host_line(host: Any, *, claimed: bool = False) -> str:
    summary = (
        (f"{host.records} records, {_range(host.first_seq, host.last_seq)}, {host.first_time} to {host.last_time}")
        if host.records
        else "no records"
    )
    if host.duplicates:
        summary += f", {host.duplicates} duplicate entries"
    if host.key is not None:
        summary += f"; proven by {host.checkpoints} checkpoints signed by its key {host.key}"
        if host.proven_to is not None:
            summary += f" (up to seq {host.proven_to})"
        for lo, hi in host.unproven_tail:
            summary += f"; {_range(lo, hi)} not covered by a checkpoint yet"
    elif host.anchors is not None:
        summary += f"; anchors: {host.anchors.checked} checked"
    if host.first_seq is not None and host.first_seq > 1:
        summary += f"; records before seq {host.first_seq} are not on the collector (chain checked from there)"
    for seg in host.segments:
        cut = f" (the host cut {_range(*seg['cut'])}; the collector keeps them)" if seg.get("cut") else ""
        summary += f"; new segment at seq {seg['seq']}: acknowledged after seq {seg['after']}{cut}"
    if host.ok and claimed:
        return f"host {sanitise(host.host)}: UNPROVEN (its chain checks out under the name it claims): {summary}"
    if host.ok:
        return f"host {sanitise(host.host)}: ok: {summary}"
    problems = "; ".join(sanitise(p) for p in host.problems[:10])
    more = f" (and {len(host.problems) - 10} more)" if len(host.problems) > 10 else ""
    return f"host {sanitise(host.host)}: FAILED at seq {host.first_bad_seq}: {problems}{more}; {summary}"


def _database(ns: argparse.Namespace) -> Path:
    if ns.database:
        return Path(ns.database)
    from airlock.common import config as configuration

    return configuration.load(Path(ns.config) if ns.config else None).paths.state_dir / "journal.sqlite"


def local_hashes(database: Path) -> dict[int, str]:
    """seq -> hash of every record in the database and its sealed segments, read-only."""
    import sqlite3

    fd = os.open(database, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # no symlink, and it exists
    os.close(fd)
    found: dict[int, str] = {}
    # The live database, then the sealed segments beside it and in the default archive (journal/segments.py).
    sealed = sorted(database.with_name("segments").glob("journal-*.db"))
    sealed += sorted(database.with_name("journal-archive").glob("journal-*.db"))
    for path, query in [(database, "?mode=ro"), *((p, "?mode=ro&immutable=1") for p in sealed)]:
        conn = sqlite3.connect(path.resolve().as_uri() + query, uri=True, timeout=10)
        try:
            found.update((int(seq), str(digest)) for seq, digest in conn.execute("SELECT seq, hash FROM events"))
        finally:
            conn.close()
    return found


def compare(ns: argparse.Namespace) -> int:
    """`airlock audit compare --journal PATH`."""
    from airlock.journal import fleet, journalfiles
    from airlock.journal.collected import compare as compare_with

    try:
        host = ns.journal_host or journalfiles.local_host()
    except (OSError, ValueError) as exc:
        _err(f"cannot tell this host's identity from /etc/machine-id ({exc}): give --host")
        return 2
    import sqlite3

    try:
        database = _database(ns)
        local = local_hashes(database)
    except (OSError, sqlite3.Error) as exc:
        _err(f"cannot read the audit database: {exc} (root, or the journal's user, may read it)")
        return 2
    except Exception as exc:  # a bad config: say so, no traceback
        _err(f"cannot read the configuration: {exc}")
        return 2
    keys = _host_keys(ns)
    if isinstance(keys, int):
        return keys
    entries = _entries(ns)
    if isinstance(entries, int):
        return entries
    own = None
    if keys is None and ns.journal_host is None:
        own = _own_host_keys(ns, host)  # this host's own key: the records it signed are its own
        keys = own
    try:
        verified = check_signatures(entries, keys) if keys is not None else None
    finally:
        if own is not None:
            own.unlink(missing_ok=True)
    report = fleet.verify_hosts(entries, host=host, verified=verified)
    if not report.hosts:
        _err(f"the collector's files hold no records of host {host!r}")
        return 1
    if len(report.hosts) > 1:
        _err(f"--host {host!r} names {len(report.hosts)} hosts: {', '.join(report.hosts)}; give the whole AIRLOCK_HOST")
        return 2
    ((name, held),) = report.hosts.items()
    collected = _collected(entries, name)
    unproven = {int(u["seq"]) for u in report.unproven if u["host"] == name and u["what"] != "checkpoint"}
    if report.keyed:
        # Only what this host's key vouches for is held against its database (issue 29): a
        # record another host shipped under this name never makes the database look cut.
        collected = {seq: digest for seq, digest in collected.items() if seq not in unproven}
    cuts = [(seg["cut"][0], seg["cut"][1]) for seg in held.segments if seg.get("cut")]
    result = compare_with(local, collected, cuts)
    if ns.json:
        print(
            json.dumps(
                result.to_dict() | {"host": name, "database": str(database), "collector": held.to_dict()},
                separators=(",", ":"),
            )
        )
    else:
        tail = "".join(f"; not on the collector yet: {_range(lo, hi)}" for lo, hi in result.not_collected[-3:])
        tail += "".join(
            f"; {_range(lo, hi)} cut and acknowledged (kept on the collector)" for lo, hi in result.acknowledged
        )
        if result.ok:
            print(
                f"ok: the database ({result.local_head} as head) holds the {result.compared} records the "
                f"collector has of {name}{tail}"
            )
        else:
            print(f"DIFFERS at seq {result.first_differing_seq}: {result.reason}")
        if not held.ok:
            print(f"note: the collector's own copy does not check out: {'; '.join(held.problems[:3])}")
        for line in _unproven_lines(report):
            print(f"note: {line} (not held against the database)")
    return 0 if result.ok else 1


def _own_host_keys(ns: argparse.Namespace, host: str) -> Path | None:
    """A host-keys file naming this host's own checkpoint key, or None when it has none."""
    import tempfile

    from airlock.common import checkpoint, sshsig

    try:
        public = sshsig.public_line(_key_path(ns))
    except Exception:  # no key (an older install, or dev): compare as before, by claimed name
        return None
    fd, name = tempfile.mkstemp(prefix="airlock-host-keys-")
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(checkpoint.host_key_line(host, public) + "\n")
    return Path(name)


def _collected(entries: list[dict[str, Any]], host: str) -> dict[int, str]:
    from airlock.journal import chain, fleet

    found: dict[int, str] = {}
    for entry in entries:
        try:
            item = fleet.parse_record(entry)
        except fleet.Unusable:
            continue
        if item.host == host and fleet.trusted(entry, root_only=item.row["kind"] == chain.ACK_KIND):
            found.setdefault(item.seq, item.hash)
    return found

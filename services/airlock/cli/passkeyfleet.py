"""`airlock passkey carry|export|import`: a host's side of the fleet console (issue 49).

- ``carry`` reads one passkey decision as JSON on stdin (what the fleet
  console sends over SSH: the request, the statement it saw, the group, the
  browser's assertion) and hands it to this host's approval
  (``passkey.decide``), which verifies it itself; ``--verb login_begin`` /
  ``login_finish`` carry a sign-in to the console the same way.  The SSH login that runs it
  should be an observer here (``operators.observers``): it then carries
  assertions and can decide nothing on its own.
- ``export`` prints this host's passkeys (revoked ones marked) as lines of the passkeys file
  (public keys only: nothing secret), for config management to bring to the
  other hosts.
- ``import FILE`` (root) lists those credentials here through approval,
  which journals each one before it is usable; a line marked revoked revokes
  it here too, so a revocation reaches every host through the same file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Final

from airlock.cli.base import _err, _operator
from airlock.common.errors import AirlockError
from airlock.common.render import sanitise
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk

MAX_CARRIED: Final = 4 * 1024 * 1024  # a group of 10,000 hosts' digests is 650 KB
MAX_IMPORT: Final = 4 * 1024 * 1024  # passkeyfile.MAX_BYTES: a whole passkeys file


def cmd_carry(ns: argparse.Namespace) -> int:
    raw = sys.stdin.buffer.read(MAX_CARRIED + 1)
    if len(raw) > MAX_CARRIED:
        _err(f"passkey carry: at most {MAX_CARRIED} bytes on stdin")
        return 2
    try:
        args = json.loads(raw)
    except ValueError:
        _err("passkey carry: stdin is not JSON")
        return 2
    verb = op.CARRIED[ns.verb]  # a declared verb: its message checks what the console carried
    takes = {f.name for f in dataclasses.fields(verb.args)}
    if not isinstance(args, dict) or not set(args) <= takes:
        _err(f"passkey carry: stdin must be one object with only {', '.join(sorted(takes))}")
        return 2
    try:
        message = verb.args.from_dict(args)
    except AirlockError as exc:  # refused as approval's door refuses it (the console reads the envelope)
        return _refused(ns, exc)
    rc, data = _operator(ns, verb, message)
    if rc == 0 and not ns.json and ns.verb == "decide":
        by = data.get("by") or {}
        who = f"{sanitise(by.get('user'))} (passkey {sanitise(by.get('credential_id'))})"
        print(f"{sanitise(data.get('decision'))} by {who}")
    return rc


def cmd_export(ns: argparse.Namespace) -> int:
    # Imported here: `airlock run` shares main.py's imports (an agent's hot path).
    from airlock.common import passkeyfile
    from airlock.common.config import ConfigError, load
    from airlock.common.passkeyfile import PasskeyFileError

    try:
        path = Path(ns.file) if ns.file else load(Path(ns.config) if ns.config else None).approval.passkeys
        found, _bad = passkeyfile.read(path)
    except (ConfigError, PasskeyFileError, OSError) as exc:
        _err(f"passkey export: {exc}")
        return 1
    for credential in found:  # revoked ones too: a revocation travels with the file
        if ns.user is None or credential.account == ns.user:
            print(credential.to_line())
    return 0


def cmd_import(ns: argparse.Namespace) -> int:
    try:
        text = sys.stdin.read(MAX_IMPORT + 1) if ns.file == "-" else _read(ns.file)
        lines = [json.loads(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]
    except (OSError, ValueError) as exc:
        _err(f"passkey import: {ns.file}: {exc}")
        return 1
    try:
        args = pk.PasskeyImport.from_dict({"credentials": lines, "source": ns.source})
    except AirlockError as exc:
        return _refused(ns, exc)
    rc, data = _operator(ns, op.PASSKEY_IMPORT, args)
    if rc == 0 and not ns.json:
        for done in data.get("results") or []:
            cid, account = sanitise(done.get("credential_id")), sanitise(done.get("account"))
            print(f"{cid} {account}: {sanitise(done.get('result'))}")
    return rc


def _refused(ns: argparse.Namespace, exc: AirlockError) -> int:
    """Arguments the declared message refuses: said as approval's door would say it (with --json, its envelope)."""
    _err(f"{exc.code.value}: {exc.message}")
    if ns.json:
        sys.stdout.write(json.dumps({"id": None, "ok": False, "error": exc.to_dict()}, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    return 1


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read(MAX_IMPORT + 1)


def add_parsers(pk_sub: Any) -> None:
    """The three subcommands under ``airlock passkey`` (main.py's parser)."""
    sp = pk_sub.add_parser("carry", help="carry one passkey decision (JSON on stdin) to approval: the fleet console's")
    sp.add_argument("--verb", choices=sorted(op.CARRIED), default="decide", help="what to carry (default decide)")
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
    sp.set_defaults(func=cmd_carry)
    sp = pk_sub.add_parser("export", help="print this host's passkeys as lines of the passkeys file (revoked marked)")
    sp.add_argument("user", nargs="?", help="only this account's passkeys")
    sp.add_argument("--config", help="airlock.yaml (default /etc/airlock/airlock.yaml)")
    sp.add_argument("--file", help="the passkeys file to read (default: approval.passkeys)")
    sp.set_defaults(func=cmd_export)
    sp = pk_sub.add_parser("import", help="list exported passkeys here, each journaled (root); revoked lines revoke")
    sp.add_argument("file", help="lines of `airlock passkey export` ('-': stdin)")
    sp.add_argument("--source", help="where they came from (recorded in the audit journal)")
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
    sp.set_defaults(func=cmd_import)

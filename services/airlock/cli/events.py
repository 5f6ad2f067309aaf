"""`airlock events` (the audit feed) and the `airlock audit` subcommands' dispatch (export, head; verify and
acknowledge are in cli/audit.py)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from airlock.cli import fleet
from airlock.cli.base import _err, _operator, _unreachable
from airlock.common import client
from airlock.common.peer import user_name
from airlock.common.render import sanitise
from airlock.common.sentence import sentence
from airlock.common.wire import operator as op
from airlock.common.wire.verb import Empty

# Requests whose command `_event_line` remembers from request.received (for their exec.started line).
ASKED_KEPT = 4096


def _event_line(e: dict[str, Any], asked: dict[tuple[Any, Any], Any] | None = None) -> str:
    """One event: seq, time, kind, request, who asked, and what (issue 32: the journald sentence's words).

    ``asked``: each request's stages from its ``request.received`` (filled
    here, oldest dropped past `ASKED_KEPT`): ``exec.started`` names the spec by
    digest only (issue 50), so its line spells the command from the request's
    first record when the listing holds it.
    """
    payload = e.get("payload") or {}
    key = (e.get("peer_uid"), e.get("request_id"))
    if asked is not None and isinstance(payload, dict) and e.get("request_id"):
        request = payload.get("request")
        if e.get("kind") == "request.received" and isinstance(request, dict) and request.get("stages"):
            asked[key] = request["stages"]
            while len(asked) > ASKED_KEPT:
                del asked[next(iter(asked))]
        elif e.get("kind") == "exec.started" and "spec" not in payload and key in asked:
            payload = payload | {"request": {"stages": asked[key]}}
    peer_uid = e.get("peer_uid")
    uid = peer_uid if isinstance(peer_uid, int) and not isinstance(peer_uid, bool) else None
    said = sentence(str(e.get("kind")), payload, e.get("request_id"), uid, user_name)
    if said is not None:
        what = said.partition(" : ")[2]  # the sentence without its "who : " (the WHO column has it)
    else:
        what = sanitise(payload.get("action") or payload.get("decision") or payload.get("status") or "")
    who = user_name(uid) if uid is not None else "-"
    return "  ".join(
        [
            f"{e.get('seq'):>6}",
            sanitise(e.get("time")),
            f"{sanitise(e.get('kind')):<17}",
            f"{sanitise(e.get('request_id') or '-', strict=True):<36}",
            f"{sanitise(who):<10}",
            what,
        ]
    ).rstrip()


def cmd_events(ns: argparse.Namespace) -> int:
    args: dict[str, Any] = {}
    if ns.after is not None:
        args["after"] = ns.after
    if ns.tail is not None:
        args["tail"] = ns.tail
    if ns.limit is not None:
        args["limit"] = ns.limit
    if ns.follow and not args:
        args["tail"] = 10
    first = True
    asked: dict[tuple[Any, Any], Any] = {}
    while True:
        try:
            raw, reply = client.call(client.operator_socket(ns.socket), op.EVENTS, op.Events(**args), timeout=30)
        except client.ClientError as exc:
            _unreachable(ns, exc)
            return 1
        data = reply.get("data") or {}
        if ns.json and (first or data.get("events") or not reply.get("ok")):
            sys.stdout.buffer.write(raw + b"\n")
            sys.stdout.flush()
        if not reply.get("ok"):
            error = reply.get("error") or {}
            if not ns.json:
                _err(f"{error.get('code')}: {error.get('message')}")
            return 1
        if not ns.json:
            for e in data.get("events", []):
                print(_event_line(e, asked), flush=ns.follow)
        if not ns.follow:
            return 0
        first = False
        args = {"after": data.get("next_cursor", 0)} | ({"limit": ns.limit} if ns.limit else {})
        if len(data.get("events", [])) < (ns.limit or 64):
            time.sleep(ns.interval)


def cmd_audit_export(ns: argparse.Namespace) -> int:
    """Every event as JSON lines, paged through the events feed (oldest first)."""
    since = _parse_since(ns.since) if ns.since else None
    if ns.since and since is None:
        _err(f"audit export: --since takes an ISO 8601 time (got {ns.since!r})")
        return 2
    try:
        for events in client.event_pages(client.operator_socket(ns.socket), timeout=None):
            for event in events:
                when = _parse_since(str(event.get("time", "")))
                if since is None or when is None or when >= since:
                    sys.stdout.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False) + "\n")
    except client.ClientError as exc:
        _err(str(exc))
        return 1
    sys.stdout.flush()
    return 0


def _parse_since(value: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def cmd_audit(ns: argparse.Namespace) -> int:
    if ns.audit_command == "export":
        return cmd_audit_export(ns)
    if ns.audit_command == "head":
        rc, data = _operator(ns, op.AUDIT_HEAD, Empty())
        if rc == 0 and not ns.json:
            print(f"{data.get('seq')} {data.get('hash')}")
        return rc
    from airlock.cli import audit

    if ns.audit_command == "archive":
        return audit.archive(ns)
    if ns.audit_command == "verify" and getattr(ns, "segment", None):
        return audit.verify_segment(ns)
    if ns.audit_command == "verify" and getattr(ns, "journal", None):
        return fleet.verify_journal(ns)
    if ns.audit_command == "acknowledge":
        return audit.acknowledge(ns)
    return audit.verify(ns)

"""`airlock passkey enroll|list|revoke|signout`: operators' passkeys and console sessions for airlock-web."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from airlock.cli.base import _err, _operator, _table
from airlock.common import client
from airlock.common.render import sanitise
from airlock.common.wire import operator as op
from airlock.common.wire import passkey as pk

WAIT_STEP_SECONDS = 60.0  # one enroll_wait call; the loop is bounded by the link's expiry


def cmd_passkey(ns: argparse.Namespace) -> int:
    if ns.passkey_command == "enroll":
        return _enroll(ns)
    if ns.passkey_command == "list":
        rc, data = _operator(ns, op.PASSKEY_LIST, pk.AccountMaybe(ns.user or None))
        if rc == 0 and not ns.json:
            rows = [
                [
                    sanitise(p.get("account")),
                    sanitise(p.get("credential_id")),
                    sanitise(p.get("created_at")),
                    "revoked" if p.get("revoked") else "in use",
                    str(p.get("sign_count")),
                    _sessions(p.get("sessions") or []),
                ]
                for p in data.get("passkeys") or []
            ]
            header = ["ACCOUNT", "CREDENTIAL ID", "CREATED", "STATE", "COUNTER", "LIVE SESSIONS"]
            print(_table(rows, header) if rows else "no passkeys")
        return rc
    if ns.passkey_command == "signout":
        rc, data = _operator(ns, op.PASSKEY_SESSIONS_END, pk.SessionsEnd(ns.user, ns.reason or None))
        if rc == 0 and not ns.json:
            print(f"ended {data.get('ended')} console session(s) of {sanitise(data.get('account'))}")
        return rc
    rc, data = _operator(ns, op.PASSKEY_REVOKE, pk.PasskeyRevoke(ns.credential_id, ns.reason or None))
    if rc == 0 and not ns.json:
        print(
            f"revoked passkey {sanitise(data.get('credential_id'))} of {sanitise(data.get('account'))}; "
            f"{data.get('sessions_ended', 0)} console session(s) it made ended"
        )
    return rc


def _sessions(live: list[dict[str, Any]]) -> str:
    """A passkey's live console sessions: how many, since when."""
    if not live:
        return "none"
    return f"{len(live)} (since " + ", ".join(sanitise(s.get("since")) for s in live) + ")"


def _enroll(ns: argparse.Namespace) -> int:
    rc, data = _operator(ns, op.PASSKEY_ENROLL, pk.Account(ns.user))
    if rc != 0:
        return rc
    if not data.get("url") and not ns.json:
        # Without web.url there is no console to open the link in, and approval checks no passkey.
        _err(
            "passkey enroll: web.url is not set, so there is no URL to open: set it in /etc/airlock/airlock.yaml "
            "(http://localhost:8787 with `ssh -L 8787:127.0.0.1:8787 HOST`, or https://NAME behind a TLS proxy), "
            "restart airlock-approval, enable airlock-web.socket, and enroll again: the link to open is then "
            "printed as WEB_URL/enroll/TOKEN (docs/operations.md, Passkeys)"
        )
        return 1
    if ns.json or ns.no_wait:
        if not ns.json:
            print(data.get("url"))
        return 0
    print(data["url"], flush=True)
    _err(
        f"open the link within {max(0, int(data['expires'] - time.time())) // 60} minutes "
        f"(until {data.get('expires_at')}) and register a passkey for {sanitise(data.get('account'))}; waiting..."
    )
    path = client.operator_socket(ns.socket)
    while time.time() < float(data["expires"]):
        step = min(WAIT_STEP_SECONDS, max(1.0, float(data["expires"]) - time.time()))
        try:
            _raw, reply = client.call(
                path, op.PASSKEY_ENROLL_WAIT, pk.EnrollWait(data["token"], step), timeout=step + 30
            )
        except client.ClientError as exc:
            _err(f"passkey enroll: {exc}")
            return 1
        if not reply.get("ok"):
            _err(f"passkey enroll: {json.dumps(reply.get('error'))}")
            return 1
        found = reply.get("data") or {}
        if found.get("enrolled"):
            print(f"enrolled passkey {sanitise(found.get('credential_id'))} for {sanitise(found.get('account'))}")
            return 0
        if found.get("expired"):
            break
    _err("passkey enroll: the link expired (or was used and failed) before a passkey was registered")
    return 1

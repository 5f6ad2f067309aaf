"""`airlock token issue|revoke`: agents' session tokens."""

from __future__ import annotations

import argparse
from typing import Any

from airlock.cli.base import _err, _operator
from airlock.common import render
from airlock.common.render import sanitise
from airlock.common.wire import operator as op


def cmd_token(ns: argparse.Namespace) -> int:
    if ns.token_command == "issue":
        try:
            ttl = render.parse_ttl(ns.ttl)
        except ValueError as exc:
            _err(f"token issue: --ttl: {exc}")
            return 2
        args: dict[str, Any] = {"session": ns.session, "user": ns.user, "ttl_seconds": ttl}
        if ns.reason:
            args["reason"] = ns.reason
        rc, data = _operator(ns, op.TOKEN_ISSUE, op.TokenIssue(**args))
        if rc == 0 and not ns.json:
            # The token alone on stdout, so `TOKEN=$(airlock token issue ...)` works.
            print(data.get("token"))
            _err(
                f"token {data.get('token_id')} for {sanitise(data.get('user'))} in session "
                f"{sanitise(data.get('session'))}, expires "
                f"{data.get('expires_at')}"
            )
        return rc
    if (ns.token is None) == (ns.session is None):
        _err("token revoke: give a TOKEN or --session S (not both)")
        return 2
    args = {"token": ns.token} if ns.token is not None else {"session": ns.session}
    if ns.reason:
        args["reason"] = ns.reason
    rc, data = _operator(ns, op.TOKEN_REVOKE, op.TokenRevoke(**args))
    if rc == 0 and not ns.json:
        print(f"revoked {data.get('revoked')} token(s)")
    return rc

"""`airlock run`: the agent's command (the full path; cli/quick.py is the short one, with the same output and exit
codes)."""

from __future__ import annotations

import argparse
import os
import uuid
from typing import Any

from airlock.cli.base import _err, _unreachable
from airlock.cli.quick import EXIT_AIRLOCK_ERROR, report
from airlock.common import client
from airlock.common.codec import iso_utc


def cmd_run(ns: argparse.Namespace) -> int:
    args = _run_args(ns)
    if args is None:
        return 2
    noticed = False

    def on_event(_raw: bytes, event: dict[str, Any]) -> None:
        nonlocal noticed
        if event.get("event") == "pending_approval" and not noticed and not ns.json:
            noticed = True
            wait = event.get("timeout_seconds")
            _err(f"waiting for an operator to approve (rule {event.get('rule')!r}, up to {wait}s)")

    try:
        token = ns.token or os.environ.get("AIRLOCK_TOKEN") or None
        raw, reply = client.call(client.agent_socket(ns.socket), "exec", args, on_event=on_event, token=token)
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return EXIT_AIRLOCK_ERROR
    return report(raw, reply, ns.json)


def _run_args(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The exec request's arguments from the command line; None after reporting a usage error."""
    if not ns.command:
        _err("run: give a command after --, e.g. airlock run -- systemctl status nginx")
        return None
    args: dict[str, Any] = {
        "argv": ns.command,
        "privileged": not ns.no_privilege,
        "time": iso_utc(),
    }
    for key in ("reason", "session", "cwd"):
        if getattr(ns, key):
            args[key] = getattr(ns, key)
    if ns.timeout:
        args["timeout_ms"] = int(ns.timeout * 1000)
    if ns.env:
        env = {}
        for item in ns.env:
            name, sep, value = item.partition("=")
            if not sep:
                _err(f"run: --env takes NAME=VALUE (got {item!r})")
                return None
            env[name] = value
        args["env"] = env
    # Each `airlock run` is a new intent: without --operation-id it gets an ID
    # of its own, so typing the same command twice runs it twice instead of
    # replaying the first outcome (the protocol's derived IDs suit retries).
    args["operation_id"] = ns.operation_id or f"cli-{uuid.uuid4()}"
    args["stream"] = True
    return args

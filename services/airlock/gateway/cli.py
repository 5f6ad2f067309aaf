"""The `airlock gateway` subcommand (registered by cli/main.py)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from airlock.common import client


def register(sub: Any) -> None:
    """Add `airlock gateway` to the `airlock` command's subparsers."""
    text = "speak the reference/001 gateway protocol on stdin/stdout, forwarding work to airlock"
    sp = sub.add_parser(
        "gateway", help=text, description=text + ". Every command still goes through approval, runner and audit."
    )
    sp.add_argument(
        "--stdio", action="store_true", required=True, help="JSON lines on stdin/stdout (the only transport)"
    )
    sp.add_argument("--socket", help="agent socket (default: $AIRLOCK_SOCKET, else /run/airlock/agent.sock)")
    sp.add_argument(
        "--privileged", action="store_true", help="run jobs as root (approval still applies); default: as yourself"
    )
    sp.set_defaults(func=cmd_gateway)


def cmd_gateway(ns: argparse.Namespace) -> int:
    from airlock.gateway import stdio

    try:
        cwd: str | None = os.getcwd()
    except OSError:
        cwd = None
    settings = stdio.Settings(socket=client.agent_socket(ns.socket), privileged=ns.privileged, cwd=cwd)
    if sys.stdin is None:
        return 2
    return stdio.run(settings)

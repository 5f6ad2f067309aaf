"""The `airlock mcp` subcommand: its arguments and its entry point."""

from __future__ import annotations

import argparse
import os
from typing import Any

from airlock.common import client


def operator_socket(given: str | None, agent: str) -> str:
    """`--operator-socket`, else $AIRLOCK_OPERATOR_SOCKET, else operator.sock beside the agent socket.

    Beside the agent socket is where both `airlock dev up` and the package put
    it (/run/airlock/), so `--socket run/agent.sock` finds `run/operator.sock`.
    """
    if given or os.environ.get("AIRLOCK_OPERATOR_SOCKET"):
        return client.operator_socket(given)
    return os.path.join(os.path.dirname(agent) or ".", "operator.sock")


def cmd_mcp(ns: argparse.Namespace) -> int:
    from airlock.mcp import server

    agent = client.agent_socket(ns.socket)
    settings = server.Settings(
        agent_socket=agent,
        operator_socket=None if ns.no_operator_socket else operator_socket(ns.operator_socket, agent),
        session=ns.session,
        progress_interval=ns.progress_interval,
    )
    import asyncio

    return asyncio.run(server.serve_stdio(settings))


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds (got {text!r})")
    return value


def register(sub: Any) -> None:
    """Add `airlock mcp` to the `airlock` command's subparsers."""
    text = "serve airlock to an MCP client (Claude Code and others) on stdin/stdout"
    sp = sub.add_parser(
        "mcp",
        help=text,
        description=text + ". An MCP client starts it, e.g. `claude mcp add --scope project airlock -- airlock mcp "
        "--socket /run/airlock/agent.sock` (docs/mcp.md). Tools: execute (run a command through airlock; "
        "64 KiB of each output stream shown by default) and status.",
    )
    sp.add_argument("--socket", help="agent socket (default: $AIRLOCK_SOCKET, else /run/airlock/agent.sock)")
    sp.add_argument(
        "--operator-socket",
        help="operator socket, used if this user may, and only for the status tool's hold state and pending "
        "count (a cancelled call is withdrawn on the agent socket) (default: $AIRLOCK_OPERATOR_SOCKET, else "
        "operator.sock beside the agent socket)",
    )
    sp.add_argument("--no-operator-socket", action="store_true", help="never use the operator socket")
    sp.add_argument("--session", help="session name sent with every request (policy `sessions:` may match it)")
    sp.add_argument(
        "--progress-interval",
        type=_positive,
        default=5.0,
        metavar="SECONDS",
        help="how often to send progress while a call waits or runs (default 5)",
    )
    sp.set_defaults(func=cmd_mcp)

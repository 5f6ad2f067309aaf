"""`airlock mcp`'s command line: registration and where the sockets are looked for."""

from __future__ import annotations

import pytest

from airlock.cli.main import parser
from airlock.mcp.cli import operator_socket


def test_the_subcommand_is_registered_with_its_options() -> None:
    ns = parser().parse_args(["mcp", "--socket", "/x/agent.sock", "--progress-interval", "1.5", "--session", "s"])
    assert ns.func.__name__ == "cmd_mcp"
    assert ns.socket == "/x/agent.sock" and ns.progress_interval == 1.5 and ns.session == "s"
    assert ns.operator_socket is None and ns.no_operator_socket is False


def test_a_non_positive_progress_interval_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["mcp", "--progress-interval", "0"])


def test_the_operator_socket_is_looked_for_beside_the_agent_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRLOCK_OPERATOR_SOCKET", raising=False)
    assert operator_socket(None, "/run/airlock/agent.sock") == "/run/airlock/operator.sock"
    assert operator_socket(None, "run/agent.sock") == "run/operator.sock"
    assert operator_socket(None, "agent.sock") == "./operator.sock"
    assert operator_socket("/o.sock", "/run/airlock/agent.sock") == "/o.sock"
    monkeypatch.setenv("AIRLOCK_OPERATOR_SOCKET", "/env/operator.sock")
    assert operator_socket(None, "/run/airlock/agent.sock") == "/env/operator.sock"
    assert operator_socket("/o.sock", "/run/airlock/agent.sock") == "/o.sock"

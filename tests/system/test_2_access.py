"""Who can open which socket: the socket units' owners and modes, and the
servers' own SO_PEERCRED check behind them."""

from __future__ import annotations

import pytest

CONNECT = "import socket, sys; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); print('connected')"
INTERNAL = (
    "/run/airlock/internal/approval.sock",
    "/run/airlock/internal/runner.sock",
    "/run/airlock/internal/journal.sock",
)


def connect(system, user: str, path: str):
    return system.c.run(["python3", "-c", CONNECT, path], user=user, check=False)


def test_agent_can_open_agent_sock(system) -> None:
    assert connect(system, system.AGENT, "/run/airlock/agent.sock").stdout.strip() == "connected"


def test_outsider_cannot_open_agent_sock(system) -> None:
    r = connect(system, system.OUTSIDER, "/run/airlock/agent.sock")
    assert r.returncode != 0 and "PermissionError" in r.stderr, r
    r = system.airlock("run", "--no-privilege", "--", "/usr/bin/id", user=system.OUTSIDER)
    assert r.returncode == 125 and "permission denied" in r.stderr, r
    assert "uid=" not in r.stdout


@pytest.mark.parametrize("path", ["/run/airlock/operator.sock", *INTERNAL])
def test_agent_cannot_open_operator_or_internal_sockets(system, path: str) -> None:
    r = connect(system, system.AGENT, path)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r


@pytest.mark.parametrize("path", INTERNAL)
def test_operator_cannot_open_internal_sockets(system, path: str) -> None:
    r = connect(system, system.OPERATOR, path)
    assert r.returncode != 0 and "PermissionError" in r.stderr, r


def test_operator_can_open_operator_sock_but_not_agent_sock(system) -> None:
    assert connect(system, system.OPERATOR, "/run/airlock/operator.sock").stdout.strip() == "connected"
    r = connect(system, system.OPERATOR, "/run/airlock/agent.sock")
    assert r.returncode != 0 and "PermissionError" in r.stderr, r


def test_journal_user_cannot_reach_other_services(system) -> None:
    # airlock-journal is not in airlock-svc: it serves, it never calls out.
    for path in INTERNAL:
        r = system.c.run(
            [
                "setpriv",
                "--reuid=airlock-journal",
                "--regid=airlock-journal",
                "--init-groups",
                "--",
                "python3",
                "-c",
                CONNECT,
                path,
            ],
            check=False,
        )
        assert r.returncode != 0 and "PermissionError" in r.stderr, r


def test_server_rechecks_the_peer_behind_the_socket_mode(system) -> None:
    # root can open agent.sock (root bypasses the mode), but it is not an agent
    # (agents.groups: [airlock]): intake refuses it from SO_PEERCRED before
    # reading a byte, and nothing runs.
    probe = (
        "import socket; s = socket.socket(socket.AF_UNIX); s.connect('/run/airlock/agent.sock'); "
        "f = s.makefile('rb'); print(f.readline().decode().strip())"
    )
    r = system.c.run(["python3", "-c", probe], timeout=30)
    assert '"unauthorized"' in r.stdout, r
    r = system.c.run(["airlock", "run", "--no-privilege", "--", "/usr/bin/id"], check=False)
    assert r.returncode != 0 and "uid=" not in r.stdout, r

"""/etc/profile.d/airlock-agent.sh (issue 48): airlock's sudo first on PATH for agents, never for root or people."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

SNIPPET = Path(__file__).resolve().parents[3] / "packaging" / "debian" / "airlock-agent.sh"
AGENT_BIN = "/usr/lib/airlock/agent-bin"


def path_after_login(tmp_path: Path, uid: int, groups: str, path: str = "/usr/bin:/bin") -> str:
    """PATH after a login shell sources the snippet, for an account `id` describes as given."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "id").write_text(f'#!/bin/sh\ncase "$1" in -u) echo {uid};; -Gn) echo "{groups}";; esac\n')
    (fake / "id").chmod(0o755)
    script = f'PATH="{fake}:{path}"; . "{SNIPPET}"; printf %s "$PATH"'
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True)
    return done.stdout.replace(f"{fake}:", "")


@pytest.mark.parametrize(
    ("uid", "groups", "first"),
    [
        (1001, "agent airlock", True),  # an agent
        (1001, "airlock", True),
        (0, "root airlock", False),  # root, even in the group
        (1002, "alice airlock-admin airlock", False),  # an operator keeps the real sudo
        (1003, "bob sudo", False),  # a person
        (1004, "airlockers", False),  # a group name that merely starts alike
    ],
)
def test_who_gets_airlocks_sudo_first(tmp_path: Path, uid: int, groups: str, first: bool) -> None:
    assert path_after_login(tmp_path, uid, groups).startswith(AGENT_BIN + ":") is first


def test_sourcing_it_twice_adds_it_once(tmp_path: Path) -> None:
    once = path_after_login(tmp_path, 1001, "airlock")
    assert path_after_login(tmp_path, 1001, "airlock", once).count(AGENT_BIN) == 1

"""cli/remote.py: what `airlock --host` hands to ssh (issue 19)."""

from __future__ import annotations

import shlex

import pytest

from airlock.cli import remote
from airlock.cli.main import parser


def test_the_host_options_stay_here_and_the_rest_runs_there() -> None:
    argv = ["--host", "web1", "--ssh-config", "/x", "--json", "approve", "--reason", "ok", "--host", "abc"]
    assert remote.strip_global(argv) == ["--json", "approve", "--reason", "ok", "--host", "abc"]
    assert remote.strip_global(["--host=web1", "pending"]) == ["pending"]


def test_ssh_gets_batch_mode_bounds_and_one_quoted_remote_command() -> None:
    argv = remote.ssh_argv("op@web1", ["approve", "--reason", "it's fine; rm -rf /", "abc"], config="/etc/fleet.conf")
    assert argv[:4] == ["ssh", "-T", "-o", "BatchMode=yes"]
    assert (
        "ConnectTimeout=10" in argv
        and "ServerAliveInterval=5" in argv
        and argv[argv.index("-F") + 1] == "/etc/fleet.conf"
    )
    assert argv[-3:-1] == ["op@web1", "--"]
    # the remote shell sees exactly the arguments given, nothing more
    assert shlex.split(argv[-1]) == ["airlock", "approve", "--reason", "it's fine; rm -rf /", "abc"]


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "", "web1 web2", "web1;id", "$(id)", "a\nb"])
def test_a_host_that_is_not_a_host_is_refused(host: str) -> None:
    with pytest.raises(ValueError, match=r"not a \[USER@\]HOST"):
        remote.ssh_argv(host, ["pending"])


def test_global_host_and_audit_verify_host_do_not_collide() -> None:
    ns = parser().parse_args(["--host", "web1", "audit", "verify", "--journal", "/j", "--host", "web2"])
    assert ns.remote_hosts == ["web1"] and ns.journal_host == "web2" and ns.journal == ["/j"]
    ns = parser().parse_args(["watch", "--host", "a", "--host", "b"])
    assert ns.watch_hosts == ["a", "b"] and not ns.remote_hosts

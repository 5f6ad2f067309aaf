"""An ``airlock`` command on another host over OpenSSH: the one way the CLI and the fleet console reach a host.

`ssh_argv` is ``ssh -T -o BatchMode=yes … HOST -- airlock ARGS`` (each
argument quoted for the remote shell; keep-alives and a connect timeout
bound a dead network; ``ControlMaster`` reuse when given a control path).
Used by `airlock --host` / `airlock watch --host` (cli/remote.py) and by
airlock-web's fleet mode (web/fleet.py, issue 49).  Pure: no I/O.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

CONNECT_TIMEOUT: Final = 10
_HOST_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_@:[]%")


def check_host(host: str) -> str:
    """A destination ssh takes as a host, never as an option."""
    if not host or host.startswith("-") or not set(host) <= _HOST_CHARS:
        raise ValueError(f"--host: not a [USER@]HOST: {host!r}")
    return host


def ssh_argv(
    host: str,
    remote: Sequence[str],
    *,
    config: str | None = None,
    control: str | None = None,
    connect_timeout: int = CONNECT_TIMEOUT,
) -> list[str]:
    """``ssh -T -o BatchMode=yes … HOST -- airlock ARGS`` (each argument quoted for the remote shell)."""
    argv = [
        "ssh",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        f"ConnectTimeout={connect_timeout}",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",
    ]
    if config:
        argv += ["-F", config]
    if control:
        argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60"]
    return [*argv, check_host(host), "--", " ".join(shlex.quote(a) for a in ["airlock", *remote])]

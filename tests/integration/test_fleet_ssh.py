"""`airlock --host` and a multi-host `airlock watch` over a real OpenSSH (issue 19).

Two live stacks stand for two hosts, each behind its own loopback ``sshd`` (throwaway host
key, authorized_keys and ssh_config in a temp folder; ``SetEnv`` points each login's
airlock at its stack's operator socket).  A third name points at a closed port: a host
that is down.  The console runs in tmux, as an operator would see it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from operator_support import ask, stack_with

from support import REPO, Stack
from waits import wait_screen

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="a loopback sshd logging in as root needs root"),
    pytest.mark.skipif(
        not Path(SSHD).exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None,
        reason="needs OpenSSH (apt-get install openssh-server openssh-client)",
    ),
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Fleet:
    web1: Stack
    web2: Stack
    config: Path
    tmp: Path

    def airlock(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(self.tmp),
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO / "services"),
        }
        return subprocess.run(
            [sys.executable, "-m", "airlock", "--ssh-config", str(self.config), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            check=False,
        )


def _sshd(
    tmp: Path, name: str, stack: Stack, authorized: Path, bindir: str
) -> tuple[subprocess.Popen[bytes], int, str]:
    key = tmp / f"{name}_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    port = _free_port()
    config = tmp / f"sshd_{name}.conf"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\nAuthorizedKeysFile {authorized}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        f"UsePAM no\nStrictModes no\nPidFile {tmp}/sshd_{name}.pid\n"
        f"SetEnv PATH={bindir}:/usr/sbin:/usr/bin:/sbin:/bin AIRLOCK_OPERATOR_SOCKET={stack.operator}\n"
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp / f"sshd_{name}.log", "wb"),
    )
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"sshd {name} did not start:\n{(tmp / f'sshd_{name}.log').read_text()}")
        time.sleep(0.05)
    return proc, port, Path(f"{key}.pub").read_text().strip()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = Path(tmp_path_factory.mktemp("ssh"))
    identity = tmp / "id"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(identity)], check=True)
    authorized = tmp / "authorized_keys"
    authorized.write_text(Path(f"{identity}.pub").read_text())
    bindir = str(Path(sys.executable).parent)  # the venv's `airlock`, standing in for /usr/bin/airlock
    stacks = [stack_with(tmp / "s1"), stack_with(tmp / "s2")]
    web1, web2 = (next(s) for s in stacks)
    daemons = []
    try:
        lines, known = [], []
        for name, stack in (("web1", web1), ("web2", web2)):
            proc, port, hostkey = _sshd(tmp, name, stack, authorized, bindir)
            daemons.append(proc)
            known.append(f"[127.0.0.1]:{port} {hostkey}")
            lines.append(f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n")
        lines.append(f"Host down\n  HostName 127.0.0.1\n  Port {_free_port()}\n")
        (tmp / "known_hosts").write_text("\n".join(known) + "\n")
        config = tmp / "ssh_config"
        config.write_text(
            "".join(lines) + f"Host *\n  User root\n  IdentityFile {identity}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {tmp}/known_hosts\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
        )
        yield Fleet(web1, web2, config, tmp)
    finally:
        for proc in daemons:
            proc.terminate()
            proc.wait(10)
        for s in stacks:
            s.close()


def test_host_runs_the_command_on_that_host_and_approves_there(fleet: Fleet) -> None:
    bg = ask(fleet.web2, ["echo", "from-web2"])
    on_web1 = json.loads(fleet.airlock("--host", "web1", "pending", "--json").stdout)
    on_web2 = fleet.airlock("--host", "web2", "pending", "--json")
    assert on_web2.returncode == 0, on_web2.stderr
    assert bg.request_id in on_web2.stdout and bg.request_id not in json.dumps(on_web1)
    approved = fleet.airlock("--host", "web2", "approve", bg.request_id, "--reason", "over ssh")
    assert approved.returncode == 0, approved.stdout + approved.stderr
    assert bg.result()["ok"] is True
    status = fleet.airlock("--host", "web1", "status")
    assert status.returncode == 0 and "pending" in status.stdout, status


def test_an_unreachable_host_is_a_clear_ssh_error(fleet: Fleet) -> None:
    r = fleet.airlock("--host", "down", "pending", timeout=60)
    assert r.returncode == 255 and "down: ssh could not run the command" in r.stderr, r
    bad = fleet.airlock("--host", "-oProxyCommand=touch /tmp/pwned", "pending")
    assert bad.returncode == 2 and "not a [USER@]HOST" in bad.stderr


class Console:
    def __init__(self, fleet: Fleet) -> None:
        self.server = str(fleet.tmp / f"tmux-{uuid.uuid4().hex[:8]}.sock")
        command = (
            f"cd {REPO} && HOME={fleet.tmp} PYTHONPATH={REPO / 'services'} exec {sys.executable} -m airlock "
            f"watch --ssh-config {fleet.config} --host web1 --host web2 --host down"
        )
        self.tmux("new-session", "-d", "-s", "watch", "-x", "160", "-y", "60", command)

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-S", self.server, *args], capture_output=True, text=True, check=True).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "watch")

    def wait_for(self, *texts: str, timeout: float = 40) -> str:
        return wait_screen(self.screen, *texts, timeout=timeout, interval=0.2)

    def close(self) -> None:
        subprocess.run(["tmux", "-S", self.server, "kill-server"], capture_output=True, check=False)


def test_one_console_for_two_hosts_approves_on_the_right_one(fleet: Fleet) -> None:
    console = Console(fleet)
    try:
        idle = console.wait_for("no pending requests on any host", "web1: ok", "web2: ok", "down: FAILING")
        assert "unreachable" in idle
        on2 = ask(fleet.web2, ["echo", "second-host"])
        screen = console.wait_for("on host web2", on2.request_id, "approve?")
        assert "down: FAILING" in screen  # the dead host is shown, and did not stop the others
        console.tmux("send-keys", "-t", "watch", "y")
        assert on2.result()["ok"] is True
        on1 = ask(fleet.web1, ["echo", "first-host"])
        console.wait_for("on host web1", on1.request_id, "approve?")
        console.tmux("send-keys", "-t", "watch", "n")
        console.wait_for("reason for the agent")
        console.tmux("send-keys", "-t", "watch", "Enter")
        reply = on1.result()
        assert reply["ok"] is False and reply["error"]["code"] == "denied", reply
        console.wait_for("no pending requests on any host")
    finally:
        console.close()

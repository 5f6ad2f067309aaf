"""airlock-web's origin is held whole (issue 46, item 1): a local user cannot answer for http://localhost:PORT.

The attack: the console listened on 127.0.0.1:PORT only, while its URL and
passkey origin were http://localhost:PORT.  Chromium resolves ``localhost`` to
``::1`` first, so another local user listening on ``[::1]:PORT`` *was* the
console's origin: it used the operator's enrollment link with its own key and
approved its own root command.  Here a throwaway user squats ``[::1]:PORT``;
airlock-web, started as the old unit started it (handed 127.0.0.1:PORT only)
and by hand, refuses to start.  Controls: the squatter really is what a
``localhost`` client reaches first, and a console handed both loopback
addresses (the shipped unit) starts, answers on both, and leaves the squatter
nothing to bind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from secsupport import as_user, needs_root, throwaway_user

pytestmark = [needs_root]

# Run as the squatter: listen on [::1]:PORT and answer every connection with a page of its own.
_SQUAT = r"""
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
s.bind(("::1", int(sys.argv[1])))
s.listen(16)
print("listening", flush=True)
while True:
    c, _ = s.accept()
    c.recv(65536)
    c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<h1>squatter's enrollment page</h1>")
    c.close()
"""


def _free_port() -> int:
    """A port free on both 127.0.0.1 and [::1] right now."""
    for _ in range(50):
        with socket.socket() as v4:
            v4.bind(("127.0.0.1", 0))
            port = int(v4.getsockname()[1])
            with socket.socket(socket.AF_INET6) as v6:
                try:
                    v6.bind(("::1", port))
                except OSError:
                    continue
        return port
    raise AssertionError("no port free on both loopback addresses")


def _listen(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    if sock.family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(16)
    return sock


@contextlib.contextmanager
def _squatter(port: int) -> Iterator[subprocess.Popen[str]]:
    with throwaway_user("alsqt") as user:
        proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", _SQUAT, str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            **as_user(user),
        )
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "listening", proc.stderr.read() if proc.stderr else ""
            yield proc
        finally:
            proc.kill()
            proc.wait()


def _config(tmp_path: Path, port: int, listen: str | None = None) -> Path:
    cfg = tmp_path / "airlock.yaml"
    text = f"web:\n  url: http://localhost:{port}\n"
    if listen is not None:
        text += f"  listen: {listen}\n"
    cfg.write_text(text, encoding="utf-8")
    return cfg


def _web(cfg: Path, handed: list[socket.socket]) -> subprocess.Popen[str]:
    """airlock-web as root, handed ``handed`` as systemd hands a socket unit's sockets (fds 3, 4, ...)."""
    fds = [s.fileno() for s in handed]

    def place() -> None:
        for i, fd in enumerate([os.dup(fd) for fd in fds]):
            os.dup2(fd, 3 + i, inheritable=True)

    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if handed:
        env |= {"LISTEN_FDS": str(len(fds)), "LISTEN_FDNAMES": ":".join("web" for _ in fds)}
    argv = ["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" "$@"', sys.executable, "-m", "airlock.web", "--config", str(cfg)]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=place if handed else None,
        pass_fds=tuple(range(3, 3 + len(fds))),
        env=env | {"PYTHONPATH": os.pathsep.join(sys.path)},
    )


def _page(host: str, port: int) -> str:
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/signin"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return str(answer.read().decode())
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_console_handed_only_127_0_0_1_refuses_to_start_while_another_user_holds_ipv6_localhost(
    tmp_path: Path,
) -> None:
    port = _free_port()
    with _squatter(port):
        # Control (the attack's premise): a client of http://localhost:PORT reaches the squatter first.
        first = socket.getaddrinfo("localhost", port, type=socket.SOCK_STREAM)[0][4][0]
        if first == "::1":
            assert "squatter" in _page("localhost", port)
        assert "squatter" in _page("::1", port)
        # The old unit: ListenStream=127.0.0.1:PORT only.
        with _listen("127.0.0.1", port) as v4:
            web = _web(_config(tmp_path, port), [v4])
            try:
                _out, err = web.communicate(timeout=60)
            finally:
                if web.poll() is None:
                    web.kill()
        assert web.returncode == 78, err
        assert f"does not hold [::1]:{port}" in err and "any local user" in err
        # Started by hand (web.listen 127.0.0.1:PORT): it must take [::1]:PORT too, and cannot.
        web = _web(_config(tmp_path, port, f"127.0.0.1:{port}"), [])
        _out, err = web.communicate(timeout=60)
        assert web.returncode != 0 and f"[::1]:{port}" in err, err


def test_a_console_handed_both_loopback_addresses_answers_on_both_and_leaves_nothing_to_squat(tmp_path: Path) -> None:
    port = _free_port()
    with _listen("127.0.0.1", port) as v4, _listen("::1", port) as v6:
        web = _web(_config(tmp_path, port), [v4, v6])
        try:
            for host in ("127.0.0.1", "::1", "localhost"):
                assert "Sign in" in _page(host, port), host
            # The would-be squatter finds the address taken.
            with throwaway_user("alsqt") as user:
                done = subprocess.run(
                    ["/usr/bin/python3", "-I", "-c", _SQUAT, str(port)],
                    capture_output=True,
                    text=True,
                    timeout=30,
                    check=False,
                    **as_user(user),
                )
            assert done.returncode != 0 and "Address already in use" in done.stderr, done.stderr
        finally:
            web.terminate()
            web.wait(30)
    assert web.returncode == 0


def test_started_by_hand_with_a_localhost_url_it_holds_both_addresses(tmp_path: Path) -> None:
    port = _free_port()
    web = _web(_config(tmp_path, port, f"127.0.0.1:{port}"), [])
    try:
        for host in ("127.0.0.1", "::1"):
            assert "Sign in" in _page(host, port), host
    finally:
        web.terminate()
        web.wait(30)

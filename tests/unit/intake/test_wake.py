"""intake/wake.py: under socket activation intake pokes each internal socket once, so systemd starts the
services it calls while it loads (issue 37's cold start); elsewhere it touches nothing."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from airlock.intake import wake


def _listening(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    sock.setblocking(False)
    return sock


def test_each_peer_sees_one_connection_that_is_closed_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listeners = [_listening(tmp_path / f"{n}.sock") for n in ("journal", "approval", "runner")]
    monkeypatch.setattr(wake, "PEERS", tuple(str(tmp_path / f"{n}.sock") for n in ("journal", "approval", "runner")))
    activated = {"LISTEN_PID": str(os.getpid()), "INVOCATION_ID": "0123abcd"}
    assert wake.peers(activated) == 3
    for listener in listeners:
        conn, _ = listener.accept()  # what systemd saw as the socket readable: the service accepts it ...
        assert conn.recv(16) == b""  # ... and reads its end: nothing was sent
        conn.close()
        listener.close()


def test_nothing_is_touched_unless_socket_activated_by_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listener = _listening(tmp_path / "journal.sock")
    monkeypatch.setattr(wake, "PEERS", (str(tmp_path / "journal.sock"), str(tmp_path / "missing.sock")))
    assert wake.peers({}) == 0  # a test, a shell
    assert wake.peers({"LISTEN_PID": str(os.getpid())}) == 0  # dev up hands sockets over, but is not systemd
    assert wake.peers({"LISTEN_PID": "1", "INVOCATION_ID": "x"}) == 0  # another process's sockets
    with pytest.raises(BlockingIOError):
        listener.accept()
    # A missing peer is no error: intake's own call finds it and says so.
    assert wake.peers({"LISTEN_PID": str(os.getpid()), "INVOCATION_ID": "x"}) == 1
    listener.close()


def test_the_paths_are_the_socket_units_own() -> None:
    """wake cannot read the config before its imports: its paths are the units' ListenStream=, kept in step."""
    units = Path(__file__).resolve().parents[3] / "units"
    listened = {
        line.split("=", 1)[1].strip()
        for name in ("airlock-journal.socket", "airlock-approval.socket", "airlock-runner.socket")
        for line in (units / name).read_text().splitlines()
        if line.startswith("ListenStream=")
    }
    assert set(wake.PEERS) == listened

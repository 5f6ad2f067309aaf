"""A peer's groups are the kernel's (SO_PEERGROUPS), not the user database's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from airlock.common.peer import Peer, identify, peer_of

CONNECT = "import socket, sys, time; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(5)"


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a process a group its user does not have needs root")
def test_a_group_given_only_to_the_process_is_seen() -> None:
    # 4242 is nobody's group in the user database: only SO_PEERGROUPS can know the peer has it.
    folder = Path(tempfile.mkdtemp(prefix="alpeer"))
    folder.chmod(0o755)  # the peer runs as nobody
    path = str(folder / "s")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(1)
        server.settimeout(10)
        child = subprocess.Popen([sys.executable, "-c", CONNECT, path], user=65534, group=65534, extra_groups=[4242])
        try:
            conn, _ = server.accept()
            with conn:
                peer = peer_of(conn)
        finally:
            child.kill()
            child.wait()
            shutil.rmtree(folder, ignore_errors=True)
    assert peer.uid == 65534 and peer.pid == child.pid
    assert 4242 in peer.group_ids


def test_the_own_process_groups_come_back() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = peer_of(a)
    assert set(peer.group_ids) == {os.getegid(), *os.getgroups()}


def test_another_service_rebuilds_the_same_groups() -> None:
    # 4242 is in nobody's user-database entry: a rebuild from the database would drop it.
    sent = identify(1, 65534, 65534, [65534, 4242])
    got = Peer.from_dict(sent.to_dict())
    assert got == sent and 4242 in got.group_ids
    assert Peer.from_dict(sent.to_dict() | {"group_ids": None}).group_ids != sent.group_ids  # the old path: database


@pytest.mark.parametrize("bad", [[-1], ["0"], [True], "0,1", [2**32]])
def test_malformed_group_ids_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="group_ids"):
        Peer.from_dict({"pid": 1, "uid": 0, "gid": 0, "group_ids": bad})


EXHAUST = r"""
import os, resource, sys
from airlock.common.errors import AirlockError
from airlock.common.peer import identify
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    peer = identify(1, 65534, 65534)
    print("named", peer.user, sorted(peer.groups))
except AirlockError as exc:
    print("refused", exc.code.value)
for fd in held[:8]:
    os.close(fd)
peer = identify(1, 65534, 65534)
print("named", peer.user)
"""


def test_a_lookup_that_fails_for_want_of_file_descriptors_is_identity_unavailable() -> None:
    """Issue 28: with no descriptor left the user database cannot be read; the peer is not a nameless
    stranger (which an allow-list would refuse as unauthorized) but identity_unavailable.  Control: with
    a few descriptors back, the same uid is named."""
    done = subprocess.run([sys.executable, "-c", EXHAUST], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first == "refused identity_unavailable", done.stdout
    assert second == "named nobody"


def test_a_uid_without_a_name_is_still_its_number() -> None:
    peer = identify(1, 4_000_000_007, 4_000_000_007)
    assert peer.user == "4000000007" and peer.groups == frozenset({"4000000007"})

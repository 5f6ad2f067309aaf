"""`common.sshsig.sealed`: the one sealed memfd a signature reaches ssh-keygen through (approval and the journal)."""

from __future__ import annotations

import os

import pytest

from airlock.common import sshsig


def test_the_memfd_holds_exactly_the_signature_and_cannot_be_changed() -> None:
    with sshsig.sealed(b"-----BEGIN SSH SIGNATURE-----\nabc\n") as fd:
        with open(f"/proc/self/fd/{fd}", "rb") as seen:  # what ssh-keygen opens by that name
            assert seen.read() == b"-----BEGIN SSH SIGNATURE-----\nabc\n"
        with pytest.raises(PermissionError):
            os.write(fd, b"forged")
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)
        assert os.get_inheritable(fd) is False  # only a child it is passed to (pass_fds) sees it
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)  # closed after

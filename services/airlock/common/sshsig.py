"""OpenSSH signatures over airlock's own statements: ``ssh-keygen -Y sign`` / ``-Y verify``.

The machinery airlock already uses for signed approvals (approval/signers.py),
for the statements a service makes itself: the journal's signed checkpoints
(`airlock.common.checkpoint`).  Every run goes through `airlock.common.child`
(environment rebuilt from nothing -- so never an ``SSH_AUTH_SOCK``: ssh-keygen
signs with the key file it is given, never with an agent a caller could put
in front of it --, stdin the message, a deadline, always waited for).  A
signature to check goes in through a sealed memfd (``-s /proc/self/fd/N``):
nothing is written to disk.

The private key must be the caller's own and readable by nobody else
(`check_private_key`: opened without following a symlink, a regular file
owned by the caller's uid, no group or other bits), as ssh-keygen itself
insists too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from airlock.common import child

SSH_KEYGEN: Final = "/usr/bin/ssh-keygen"
RUN_SECONDS: Final = 10.0
_ARMOUR: Final = "-----BEGIN SSH SIGNATURE-----"
# An armoured ed25519 SSHSIG is about 300 bytes; anything much longer is not one.
MAX_SIGNATURE_CHARS: Final = 8192
_FINGERPRINT: Final = re.compile(r" key (SHA256:[A-Za-z0-9+/=]+)")


class SigningError(Exception):
    """A signature could not be made; the message says why."""


def available() -> bool:
    return os.access(SSH_KEYGEN, os.X_OK)


def check_private_key(key: Path) -> None:
    """The key file is a regular file of ours, readable by us alone (no symlink followed); else `SigningError`."""
    try:
        fd = os.open(key, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise SigningError(f"no checkpoint key at {key}") from None
    except OSError as exc:
        raise SigningError(f"cannot open the checkpoint key {key}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SigningError(f"the checkpoint key {key} is not a regular file")
    if st.st_uid != os.geteuid():
        raise SigningError(
            f"the checkpoint key {key} belongs to uid {st.st_uid}, not to the signer (uid {os.geteuid()})"
        )
    if st.st_mode & 0o077:
        raise SigningError(
            f"the checkpoint key {key} is readable by others (mode {st.st_mode & 0o777:04o}; make it 0600)"
        )


async def sign(key: Path, namespace: str, message: bytes, *, timeout: float = RUN_SECONDS) -> str:  # noqa: ASYNC109  the helper's deadline
    """The armoured SSHSIG of ``message`` by ``key`` in ``namespace``; `SigningError` if there is none."""
    check_private_key(key)
    try:
        done = await child.run(
            [SSH_KEYGEN, "-q", "-Y", "sign", "-f", str(key), "-n", namespace],
            env=child.environment(),
            timeout=timeout,
            stdin=message,
        )
    except OSError as exc:
        raise SigningError(f"could not run {SSH_KEYGEN}: {exc.strerror}") from None
    if done.timed_out:
        raise SigningError(f"ssh-keygen did not sign within {timeout:g}s")
    text = done.stdout.decode("ascii", "replace")
    if done.returncode != 0 or not text.startswith(_ARMOUR):
        raise SigningError(f"ssh-keygen -Y sign failed ({done.text()}): {done.stderr.decode(errors='replace')[:300]}")
    return text


async def verify(
    allowed_signers: Path,
    principal: str,
    namespace: str,
    message: bytes,
    signature: str,
    *,
    timeout: float = RUN_SECONDS,  # noqa: ASYNC109  the helper's deadline: passing it stops ssh-keygen
) -> str | None:
    """The key's fingerprint (``SHA256:…``) if ``signature`` over exactly ``message`` is by a key
    ``allowed_signers`` lists for ``principal``; None if it is not."""
    if not signature.startswith(_ARMOUR) or len(signature) > MAX_SIGNATURE_CHARS or principal.startswith("-"):
        return None
    with sealed(signature.encode("ascii", "replace")) as fd:
        done = await child.run(
            [
                SSH_KEYGEN,
                "-Y",
                "verify",
                "-f",
                str(allowed_signers),
                "-I",
                principal,
                "-n",
                namespace,
                "-s",
                f"/proc/self/fd/{fd}",
            ],
            env=child.environment(),
            timeout=timeout,
            stdin=message,
            pass_fds=(fd,),
        )
    if done.timed_out or done.returncode != 0:
        return None
    found = _FINGERPRINT.search(done.stdout.decode("ascii", "replace"))
    return found.group(1) if found else "?"


@contextlib.contextmanager
def sealed(data: bytes) -> Iterator[int]:
    """A memfd holding exactly ``data``, sealed against any change, for ``-s /proc/self/fd/N``; closed after.

    Nothing touches the disk, and ssh-keygen reads what was checked here: the
    seals forbid a write, a grow or a shrink, and further sealing.
    """
    fd = os.memfd_create("airlock-signature", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
        )
        yield fd
    finally:
        os.close(fd)


def public_line(key: Path) -> str:
    """``<type> <base64> [comment]`` of ``key``'s public half (``KEY.pub``), or `SigningError`."""
    pub = Path(f"{key}.pub")
    try:
        text = pub.read_text(encoding="ascii", errors="replace").strip()
    except OSError as exc:
        raise SigningError(f"cannot read {pub}: {exc.strerror}") from None
    parts = text.split()
    if len(parts) < 2 or not parts[0].startswith(("ssh-", "ecdsa-", "sk-")):
        raise SigningError(f"{pub} does not hold an OpenSSH public key")
    return " ".join(parts[:3])

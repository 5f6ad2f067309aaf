"""The enrolled passkeys file (``approval.passkeys``, issue 33): its lines, reading it, and rewriting it.

One JSON object per line: ``credential_id`` and ``public_key`` (base64url;
the COSE key as CBOR), ``account`` (the operator account the passkey is),
``created`` and ``revoked`` (Unix seconds; ``revoked`` null while in use).
The file is root's: approval reads it at every use (a revocation, or a line
root deletes, applies at once); only the runner writes it, for approval
(`rewrite`), after approval checked a registration bound to a one-time
enrollment token (docs/security.md, "Passkeys").

A line that does not parse is skipped by readers (and logged by approval):
it can enroll nobody.  `rewrite` keeps such lines as they are.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_B64U = re.compile(r"[A-Za-z0-9_-]{1,1400}")
_ACCOUNT = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?")
MAX_BYTES = 4 * 1024 * 1024  # the whole file: far more than any host's passkeys


class PasskeyFileError(ValueError):
    """A line or a file that cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Credential:
    credential_id: str  # base64url
    public_key: str  # base64url of the COSE key (CBOR)
    account: str
    created: int
    revoked: int | None = None

    def to_line(self) -> str:
        return json.dumps(
            {
                "credential_id": self.credential_id,
                "public_key": self.public_key,
                "account": self.account,
                "created": self.created,
                "revoked": self.revoked,
            },
            separators=(",", ":"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "credential_id": self.credential_id,
            "account": self.account,
            "created": self.created,
            "revoked": self.revoked,
        }


def _b64u_bytes(text: str) -> bytes:
    """Unpadded base64url; a length no encoding has (4n + 1) is refused like any bad value."""
    import base64
    import binascii

    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise PasskeyFileError("not base64url") from None


def checked(data: object) -> Credential:
    """A credential from a parsed line or a runner request: every field validated."""
    if not isinstance(data, dict):
        raise PasskeyFileError("a passkey must be a JSON object")
    cid, key, account, created, revoked = (
        data.get("credential_id"),
        data.get("public_key"),
        data.get("account"),
        data.get("created"),
        data.get("revoked"),
    )
    if not isinstance(cid, str) or not _B64U.fullmatch(cid) or len(cid) % 4 == 1 or len(_b64u_bytes(cid)) > 1023:
        raise PasskeyFileError("credential_id: must be base64url, at most 1023 bytes")
    if not isinstance(key, str) or not _B64U.fullmatch(key):
        raise PasskeyFileError("public_key: must be base64url")
    from fido2 import cbor  # here, not at import: fido2 and cryptography would be most of the runner's start
    from fido2.cose import CoseKey, UnsupportedKey

    try:
        parsed = CoseKey.parse(cbor.decode(_b64u_bytes(key)))
    except Exception:
        parsed = None
    # fido2 parses a key of an algorithm it does not know as UnsupportedKey, which can never verify: a
    # passkey enrolled with one could never sign in or approve, so it is refused here, at enrollment.
    if parsed is None or isinstance(parsed, UnsupportedKey):
        raise PasskeyFileError("public_key: not a COSE key fido2 can verify with")
    if not isinstance(account, str) or not _ACCOUNT.fullmatch(account):
        raise PasskeyFileError("account: must be a user name")
    for name, value in (("created", created), ("revoked", revoked)):
        if value is None and name == "revoked":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**40:
            raise PasskeyFileError(f"{name}: must be Unix seconds")
    return Credential(cid, key, account, int(created), None if revoked is None else int(revoked))  # type: ignore[arg-type]


def parse(text: str) -> tuple[list[Credential], list[int]]:
    """The credentials of a file's text, and the line numbers that did not parse (skipped)."""
    found: list[Credential] = []
    bad: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            found.append(checked(json.loads(line)))
        except (ValueError, PasskeyFileError):
            bad.append(number)
    return found, bad


def read(path: Path) -> tuple[list[Credential], list[int]]:
    """The file's credentials (none if it is absent); a symlink or a non-regular file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return [], []
    return parse(_text(fd, path))


def _text(fd: int, path: Path) -> str:
    """The whole file behind ``fd`` (closed here): a regular file of at most MAX_BYTES, else refused."""
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise PasskeyFileError(f"{path}: not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:  # a rewrite of a copy cut here would lose the file's tail
        raise PasskeyFileError(f"{path}: larger than {MAX_BYTES} bytes")
    return data.decode("utf-8", errors="replace")


def rewrite(path: Path, change: Callable[[list[str], list[Credential]], list[str]]) -> None:
    """Replace ``path`` atomically with ``change(lines, credentials)`` (root, in the runner).

    The folder is opened once (O_NOFOLLOW) and everything else is done
    relative to it: the old file read with O_NOFOLLOW, the new one written to a
    fresh temporary name (O_EXCL), fsynced, renamed over, the folder fsynced.
    """
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(folder)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise PasskeyFileError(f"{path.parent}: must be the runner's own and not group or world writable")
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            text = ""
        else:
            text = _text(fd, path)
        lines = text.splitlines()
        new = "".join(line + "\n" for line in change(lines, parse(text)[0]))
        if len(new) > MAX_BYTES:
            raise PasskeyFileError(f"{path}: would be larger than {MAX_BYTES} bytes")
        temporary = f".{path.name}.{os.getpid()}.{time.monotonic_ns()}"
        fd = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=folder
        )
        try:
            with os.fdopen(fd, "wb") as f:
                os.fchmod(f.fileno(), 0o644)  # public keys: approval reads it
                f.write(new.encode("utf-8"))
                f.flush()
                os.fsync(f.fileno())
            os.rename(temporary, path.name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=folder)
            except OSError:
                pass
            raise
        os.fsync(folder)
    finally:
        os.close(folder)

"""Reading an agent's session token from a file, never from the command line.

A command line is world-readable (``/proc/PID/cmdline``); a token there is a
token for every local user.  So `airlock run` takes a token from
``$AIRLOCK_TOKEN`` (``/proc/PID/environ`` is readable by the owner only) or
from a file named by ``--token-file``, which must be the caller's own and
closed to others, as OpenSSH insists for a private key.  Only ``os`` is
imported: `airlock run`'s short path loads this module.
"""

from __future__ import annotations

import os
import stat

MAX_TOKEN_FILE_BYTES = 4096


class TokenFileError(Exception):
    """The token file cannot be used; the message says why and what to do."""


def read_token_file(path: str) -> str:
    """The token in ``path`` (its first line, stripped); `TokenFileError` otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise TokenFileError(f"--token-file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise TokenFileError(f"--token-file {path}: not a regular file")
        if st.st_uid != os.getuid():
            raise TokenFileError(f"--token-file {path}: not your file (owner uid {st.st_uid}); a token is its holder's")
        if st.st_mode & 0o077:
            raise TokenFileError(
                f"--token-file {path}: permissions {stat.S_IMODE(st.st_mode):04o} are too open; "
                f"other users could read the token (chmod 600 {path})"
            )
        raw = os.read(fd, MAX_TOKEN_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(f"--token-file {path}: larger than {MAX_TOKEN_FILE_BYTES} bytes; is it a token file?")
    token = raw.decode("utf-8", "replace").partition("\n")[0].strip()
    if not token:
        raise TokenFileError(f"--token-file {path}: empty")
    return token

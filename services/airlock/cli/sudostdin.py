"""What an agent's `sudo` sends as the command's stdin (issue 48): a piped or redirected stdin, whole and bounded.

airlock sends stdin with the request (it cannot stream it), so `echo x | sudo tee
-a /etc/file` works.  A terminal is never read (the caller checks), /dev/null is
no stdin, and a pipe that stays silent is given up on: an agent's tool may hand
over a pipe it never writes or closes, and `sudo systemctl restart x` must not hang.
"""

from __future__ import annotations

import os
import select
import stat
import sys

from airlock.cli.sudoargs import Refusal

# How long a piped stdin may stay silent (no byte, no end) before the command runs without it.
STDIN_FIRST_BYTE_SECONDS = 3.0
STDIN_LIMIT = 768 * 1024  # in base64 it fits limits.max_request_bytes (1 MiB) with the rest of the request


def read_stdin() -> bytes | None:
    """A piped or redirected stdin, whole (bounded); None when there is none to send."""
    try:
        mode = os.fstat(0).st_mode
    except OSError:
        return None  # closed
    if stat.S_ISCHR(mode) and os.path.realpath("/proc/self/fd/0") == "/dev/null":
        return None
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        ready, _, _ = select.select([0], [], [], STDIN_FIRST_BYTE_SECONDS)
        if not ready:
            print(
                f"sudo: nothing came on standard input within {STDIN_FIRST_BYTE_SECONDS:g}s; running the command "
                "without it (airlock sends stdin with the request: pipe it in, or use </dev/null)",
                file=sys.stderr,
            )
            return None
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(0, 64 * 1024)
        if not chunk:
            break
        size += len(chunk)
        if size > STDIN_LIMIT:
            raise Refusal(
                f"standard input is larger than airlock sends with a request ({STDIN_LIMIT // 1024} KiB)",
                "write it to a file first (sudo tee reads it from a pipe; for more, copy the file with sudo cp)",
            )
        chunks.append(chunk)
    return b"".join(chunks)

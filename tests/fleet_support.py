"""Journal files as a collector holds them: entries in the export format, written by
systemd-journal-remote (issue 19)."""

from __future__ import annotations

import struct
import subprocess
import time
from pathlib import Path
from typing import Any

REMOTE = next(
    (p for p in ("/lib/systemd/systemd-journal-remote", "/usr/lib/systemd/systemd-journal-remote") if Path(p).exists()),
    None,
)
BOOT = "0123456789abcdef0123456789abcdef"


def export(entries: list[dict[str, Any]]) -> bytes:
    """The journal export format (systemd.journal-export-formats(7)), as systemd-journal-upload sends it."""
    out = bytearray()
    for n, fields in enumerate(entries, 1):
        out += (
            f"__REALTIME_TIMESTAMP={int(time.time() * 1e6) + n}\n__MONOTONIC_TIMESTAMP={n}\n_BOOT_ID={BOOT}\n".encode()
        )
        for name, value in fields.items():
            data = value if isinstance(value, bytes) else str(value).encode()
            if b"\n" in data or len(data) > 512:
                out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
            else:
                out += name.encode() + b"=" + data + b"\n"
        out += b"\n"
    return bytes(out)


def write_collector(directory: Path, entries: list[dict[str, Any]]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [str(REMOTE), f"--output={directory}/remote-web1.journal", "-"],
        input=export(entries),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr.decode(errors="replace")

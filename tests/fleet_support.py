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


def anchor_entries(anchors_file: Path, host: str) -> list[dict[str, Any]]:
    """The journald entries airlock-journal.service logs for each line of its anchors file
    (``journal.chain.anchored``: the head, and a signed checkpoint's statement and signature)."""
    import json

    entries = []
    for line in anchors_file.read_text().splitlines():
        a = json.loads(line)
        fields: dict[str, Any] = {
            "MESSAGE_ID": "d95f3306ee3b4488bba7c5125f73ec62",
            "MESSAGE": f"journal.chain.anchored chain_seq={a['seq']}",
            "AIRLOCK_EVENT": "journal.chain.anchored",
            "AIRLOCK_CHAIN_SEQ": str(a["seq"]),
            "AIRLOCK_CHAIN_HASH": a["hash"],
            "AIRLOCK_HOST": host,
            "_SYSTEMD_UNIT": "airlock-journal.service",
            "_UID": "998",
        }
        if a.get("ack"):
            fields |= {"AIRLOCK_CHAIN_ACK": "true", "_UID": "0"}
        if "checkpoint" in a:
            fields |= {"AIRLOCK_CHECKPOINT": a["checkpoint"], "AIRLOCK_SIGNATURE": a["signature"]}
        entries.append(fields)
    return entries

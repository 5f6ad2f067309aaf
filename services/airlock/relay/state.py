"""The relay's status for operators: ``status.json`` in its state directory.

What `airlock status` shows of the relay (issue 28): whether it runs, and for
each channel the last event delivered, how far it lags behind the journal,
what waits, and the last error (and since when the receiver has been failing).

Why a file the relay writes, not a verb or journald: the relay is an
observer on operator.sock and must stay read-only there (a verb to report
progress would be a write door into approval); journald needs the reader to
be in systemd-journal or adm, and a stopped relay says nothing there.  The
file is replaced atomically, at most once a second on a change and every
`HEARTBEAT_SECONDS` anyway, and says ``stopped`` on a clean exit; mode 0640 in
a 0750 directory of group airlock-admin (the unit's ``Group=``), so operators
read it and agents do not.  A file older than `STALE_SECONDS`, or whose
process is gone, is a relay that is not running.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airlock.relay.cursor import write_atomically

STATUS_FILE = "status.json"
HEARTBEAT_SECONDS = 10.0
STALE_SECONDS = 3 * HEARTBEAT_SECONDS
MAX_BYTES = 256 * 1024


def write(state_dir: Path, body: dict[str, Any]) -> None:
    # Not fsync'd: rewritten every few seconds, and a crash that sets it back is corrected by the next one.
    write_atomically(state_dir / STATUS_FILE, json.dumps(body, sort_keys=True).encode() + b"\n", 0o640, durable=False)


def read(state_dir: Path) -> dict[str, Any] | None:
    """The relay's last status, or None when there is none (never ran here, or unreadable: ``error`` says)."""
    try:
        fd = os.open(state_dir / STATUS_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"error": f"{state_dir / STATUS_FILE}: {exc.strerror}"}
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    if not isinstance(body, dict) or len(data) > MAX_BYTES:
        return {"error": f"{state_dir / STATUS_FILE}: not a relay status file"}
    return body


def running(body: dict[str, Any], now: float) -> bool:
    """Whether the relay that wrote ``body`` still runs: it said so lately, and its process is there."""
    updated, pid = body.get("updated"), body.get("pid")
    if body.get("state") != "running" or not isinstance(updated, int | float) or now - updated > STALE_SECONDS:
        return False
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # there, and not ours (the relay runs as airlock-notify)
    return True

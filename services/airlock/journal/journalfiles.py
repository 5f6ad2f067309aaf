"""journald I/O for fleet audit: this host's identity, sending records, reading journal files.

The checks themselves are pure (`airlock.journal.fleet`).  Reading uses
python3-systemd's ``journal.Reader``, which opens journal files or a
directory of them (as ``systemd-journal-remote`` writes on a collector)
without any service and without root -- only read permission on the files.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

from airlock.journal import fleet

MACHINE_ID: Final = Path("/etc/machine-id")


class Unreadable(Exception):
    """The journal files cannot be read; the message says why."""


def local_host(machine_id: Path = MACHINE_ID) -> str:
    """This host's ``AIRLOCK_HOST``: ``<hostname>/<machine-id>`` (`fleet.host_identity`)."""
    return fleet.host_identity(machine_id.read_text(encoding="ascii", errors="replace"), socket.gethostname())


class RecordSender:
    """Sends each committed record to journald (`fleet.record_fields`), after the commit."""

    def __init__(self, host: str) -> None:
        from systemd import journal  # only where journald is in use

        self._send = journal.send
        self.host = host

    def __call__(self, events: Sequence[Any]) -> None:
        """``events``: committed `airlock.journal.store.Event`s; an ``OSError`` from journald propagates."""
        for event in events:
            record = event.to_dict()
            self._send(
                fleet.record_message(record),
                SYSLOG_IDENTIFIER="airlock-journal",
                **fleet.record_fields(record, event.hash, self.host),
            )


def _keep_bytes(value: bytes) -> bytes:
    return value


def read_entries(paths: Sequence[Path]) -> Iterator[dict[str, Any]]:
    """Every record and anchor entry in the journal files or directories ``paths``.

    ``AIRLOCK_RECORD`` stays bytes: it is compared byte for byte with what was hashed.
    """
    try:
        from systemd import journal
    except ImportError as exc:
        raise Unreadable("python3-systemd is not installed (apt-get install python3-systemd)") from exc
    files = [p for p in paths if not p.is_dir()]
    dirs = [p for p in paths if p.is_dir()]
    for p in files:
        if not p.exists():
            raise Unreadable(f"no such file or directory: {p}")
    openers: list[dict[str, Any]] = [{"path": str(d)} for d in dirs]
    if files:
        openers.append({"files": [str(f) for f in files]})
    for how in openers:
        try:
            reader = journal.Reader(converters={"AIRLOCK_RECORD": _keep_bytes}, **how)
        except OSError as exc:
            raise Unreadable(
                f"cannot open {how.get('path') or ', '.join(how['files'])}: {exc.strerror or exc}"
            ) from exc
        try:
            reader.add_match(MESSAGE_ID=fleet.RECORD_MESSAGE_ID)
            reader.add_match(MESSAGE_ID=fleet.ANCHOR_MESSAGE_ID)
            try:
                yield from reader
            except OSError as exc:
                raise Unreadable(f"cannot read the journal: {exc.strerror or exc}") from exc
        finally:
            reader.close()

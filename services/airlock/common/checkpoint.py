"""Signed checkpoints: a host's own word on its audit chain's head (issue 29).

At every anchor (start, stop, every ``journal.anchor_every_records`` records,
every ``journal.anchor_every_seconds``) airlock-journal signs the chain head
with the host's checkpoint key (an ed25519 key made at install, readable only
by airlock-journal), with ``ssh-keygen -Y sign`` in the namespace `NAMESPACE`.
The signed bytes are the canonical JSON of `Checkpoint`: what the host says,
and all it says -- its identity, the head's seq and hash, the time, and the
previous checkpoint it extends.  A collector verifies each with the host keys
an operator collected (`airlock audit host-key` on each host, gathered like SSH
host keys into an allowed_signers-style file: ``<host identity> <key>``).

The namespace keeps the key to this one use: an ``airlock-checkpoint``
signature is never an approval (``airlock-approval``) nor anything else.

Pure: no I/O (`airlock.common.sshsig` runs ssh-keygen).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Final

from airlock.common.codec import canonical_json

NAMESPACE: Final = "airlock-checkpoint"
VERSION: Final = 1
_HASH = re.compile(r"[0-9a-f]{64}")
# <hostname>/<machine-id>, as journal/fleet.py's host_identity makes it.
_HOST = re.compile(r"[A-Za-z0-9_.-]{1,253}/[0-9a-f]{32}")
MAX_STATEMENT_BYTES: Final = 4096


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Host ``host`` says: my chain's record ``seq`` has ``hash`` (at ``time``), extending ``prev``."""

    host: str
    seq: int
    hash: str
    time: str
    prev: tuple[int, str] | None = None  # the checkpoint (or anchor) before it: (seq, hash)

    def __post_init__(self) -> None:
        if not _HOST.fullmatch(self.host):
            raise ValueError("a checkpoint's host is <hostname>/<machine-id>")
        for seq, digest in [(self.seq, self.hash), *([self.prev] if self.prev is not None else [])]:
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
                raise ValueError("a checkpoint's seq is a positive integer")
            if not isinstance(digest, str) or not _HASH.fullmatch(digest):
                raise ValueError("a checkpoint's hash is 64 lowercase hex digits")
        if self.prev is not None and self.prev[0] > self.seq:
            raise ValueError("a checkpoint extends an earlier one, not a later one")
        if not isinstance(self.time, str) or not 1 <= len(self.time) <= 64:
            raise ValueError("a checkpoint's time is a timestamp")

    def to_dict(self) -> dict[str, Any]:
        return {
            "airlock_checkpoint": VERSION,
            "host": self.host,
            "seq": self.seq,
            "hash": self.hash,
            "time": self.time,
            "prev": None if self.prev is None else {"seq": self.prev[0], "hash": self.prev[1]},
        }

    def statement(self) -> bytes:
        """The exact bytes that are signed."""
        return canonical_json(self.to_dict())


def parse(data: bytes | str) -> Checkpoint:
    """A checkpoint from its signed bytes; `ValueError` unless they are exactly a canonical statement."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > MAX_STATEMENT_BYTES:
        raise ValueError("a checkpoint statement is short")
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        raise ValueError("a checkpoint statement is JSON") from None
    if not isinstance(value, dict) or set(value) != {"airlock_checkpoint", "host", "seq", "hash", "time", "prev"}:
        raise ValueError("a checkpoint statement holds exactly its fields")
    if value["airlock_checkpoint"] != VERSION:
        raise ValueError(f"unknown checkpoint version {value['airlock_checkpoint']!r}")
    prev = value["prev"]
    if prev is not None and (not isinstance(prev, dict) or set(prev) != {"seq", "hash"}):
        raise ValueError("a checkpoint's prev is {seq, hash} or null")
    made = Checkpoint(
        value["host"], value["seq"], value["hash"], value["time"], None if prev is None else (prev["seq"], prev["hash"])
    )
    if made.statement() != raw:
        raise ValueError("a checkpoint statement is in canonical form (the bytes that were signed)")
    return made


def host_key_line(host: str, public: str) -> str:
    """One line of a collector's host-keys file (allowed_signers(5) format): ``<host> <type> <base64> [comment]``."""
    return f"{host} {public}"

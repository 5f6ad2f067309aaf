"""The span helper's process (journal/spanwalk.py starts it): one span of the chain walked, its result printed.

``python3 -I -S -B -c ... PACKAGE_ROOT DATABASE FIRST LAST LINK``: opens the
database read-only, walks seqs FIRST to LAST with `fastwalk.verify_stored`
from LINK (the hash stored at FIRST - 1) and prints the `VerifyResult` as one
JSON line.  It imports only the walk and the standard library, so it starts
in ~30 ms under any interpreter that can import the package.

A process of its own; it reads the database.
"""

from __future__ import annotations

import gc
import json
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from airlock.journal import fastwalk
from airlock.journal.chain import is_hash

# `fastwalk.STORED_COLUMNS` from the journal's table, over one span (constant names: no injection).
_COLUMNS: Final = ", ".join(fastwalk.STORED_COLUMNS)
_SELECT: Final = f"SELECT {_COLUMNS} FROM events WHERE seq >= ? AND seq <= ? ORDER BY seq"  # noqa: S608
_BATCH: Final = 2048  # rows per fetch, as journal/verification.py's walk


def main(argv: list[str] | None = None) -> int:
    """Walk one span and print its result; 0, or 2 for arguments that are not a span."""
    args = sys.argv[2:] if argv is None else argv
    try:
        if len(args) != 4:
            raise ValueError
        path, first, last, link = Path(args[0]), int(args[1]), int(args[2]), args[3]
        if not path.is_absolute() or first < 2 or last < first or not is_hash(link):
            raise ValueError
    except ValueError:
        print(
            "usage: spanchild DATABASE FIRST LAST LINK (an absolute path, 2 <= FIRST <= LAST, a hash)", file=sys.stderr
        )
        return 2
    gc.disable()  # millions of short-lived dicts and no cycles (journal/verification.py says why)
    conn = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True, isolation_level=None, timeout=10)
    try:
        cursor = conn.execute(_SELECT, (first, last))
        result = fastwalk.verify_stored(_batches(cursor), from_seq=first, prev_hash=link)
    finally:
        conn.close()
    sys.stdout.write(json.dumps(result.to_dict(), separators=(",", ":")) + "\n")
    return 0


def _batches(cursor: sqlite3.Cursor) -> Iterator[list[Any]]:
    while batch := cursor.fetchmany(_BATCH):
        yield batch

"""The journal's generic read (``records``): a service's records by kind and payload fields.

The journal answers it without knowing what the records mean; the service
that wrote them interprets them (approval its holds and grants,
approval/restore.py).  Only the writers named count, so nothing an agent can
put in an ID, a session or a payload of its own can stand in for one.

Read on a read-only connection of its own (the store's writer is not
involved), from the live database; the live segment's opening record's
``carried`` part (journal/rollover.py `carry`: the answers to the queries
`wire.journal.CARRIED` names when the segments before were sealed) comes back
beside the records, as it was written.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from airlock.common.wire.journal import Found, Records
from airlock.journal import segments


def records(database: Path, query: Records) -> Found:
    """The records ``query`` asks for (`Records`), oldest first, and what the live segment carried."""
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=10)
    try:
        return Found(tuple(rows(conn, query)), carried(conn))
    finally:
        conn.close()


def rows(conn: sqlite3.Connection, query: Records) -> list[dict[str, Any]]:
    """``query``'s records on ``conn`` (the live database), oldest first."""
    where = [
        f"writer IN ({', '.join('?' * len(query.writers))})",
        f"kind IN ({', '.join('?' * len(query.kinds))})",
    ]
    params: list[Any] = [*query.writers, *query.kinds]
    # Field names are checked (`Records.check`) and travel as parameters all the same.
    for key, value in sorted((query.fields or {}).items()):
        where.append("json_extract(payload, ?) = ?")
        params += [f"$.{key}", value]
    for key, values in sorted((query.field_in or {}).items()):
        where.append(f"json_extract(payload, ?) IN ({', '.join('?' * len(values))})")
        params += [f"$.{key}", *values]
    if query.since_seq is not None:
        where.append("seq > ?")
        params.append(query.since_seq)
    order = "DESC" if query.newest else "ASC"
    rows = conn.execute(
        f"SELECT seq, time, peer_uid, kind, writer, payload FROM events WHERE {' AND '.join(where)}"
        f" ORDER BY seq {order} LIMIT ?",
        (*params, query.limit),
    ).fetchall()
    if query.newest:
        rows.reverse()
    out = []
    for seq, time, peer_uid, kind, writer, payload in rows:
        body = json.loads(payload)
        if query.pick is not None and isinstance(body, dict):
            body = {k: body[k] for k in query.pick if k in body}
        out.append({"seq": seq, "time": time, "peer_uid": peer_uid, "kind": kind, "writer": writer, "payload": body})
    return out


def carried(conn: sqlite3.Connection) -> dict[str, Any] | None:
    """The live segment's opening record's ``carried`` part (None before the first rollover)."""
    row = conn.execute("SELECT kind, payload FROM events ORDER BY seq LIMIT 1").fetchone()
    if row is None or row[0] != segments.OPEN_KIND:
        return None
    try:
        carried = json.loads(row[1]).get("carried")
    except (ValueError, AttributeError):
        return None
    return carried if isinstance(carried, dict) else None

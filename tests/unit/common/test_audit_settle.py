"""`Audit.record` when the journal read an append and died before answering (a SIGKILL).

It must neither write the record twice (it was committed) nor lose it (it was
not): it asks the journal, once it is back, whether the record is in the
request's trail.  A real Unix socket and a journal stand-in that "dies" after
reading the first append.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from airlock.common import config
from airlock.common.audit import Audit, Ids
from airlock.common.errors import ErrorCode
from airlock.common.ipc import Client, Unreachable
from airlock.common.wire.journal import Appended
from airlock.common.wire.verb import DoorName, Stub


class Journal:
    """Commits (or not) the first append, then closes without a reply; answers everything after."""

    def __init__(self, path: Path, *, commit_first: bool) -> None:
        self.commit_first = commit_first
        self.events: list[dict[str, Any]] = []
        self.appends = 0
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(8)
        self.server.settimeout(15)
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        first = True
        with self.server:
            while True:
                try:
                    conn, _ = self.server.accept()
                except OSError:
                    return
                threading.Thread(target=self.serve, args=(conn, first), daemon=True).start()
                first = False

    def serve(self, conn: socket.socket, first: bool) -> None:
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                request = json.loads(line)
                args = request["args"]
                if request["verb"] == "append":
                    self.appends += 1
                    if first:
                        if self.commit_first:
                            self.events.append(args | {"seq": len(self.events) + 1, "hash": "h"})
                        return  # killed before the reply
                    self.events.append(args | {"seq": len(self.events) + 1, "hash": "h"})
                    data: dict[str, Any] = {"seq": self.events[-1]["seq"], "hash": "h"}
                else:
                    scope = args["scope"]["request_id"]
                    found = [e for e in self.events if e["request_id"] == scope]
                    data = {"events": found, "next_cursor": len(self.events), "latest": len(self.events)}
                conn.sendall(json.dumps({"id": request["id"], "ok": True, "data": data}).encode() + b"\n")


def _audit(path: Path) -> Audit:
    audit = Audit(config.parse_text("", "/t.yaml"), "runner")
    audit.journal = Stub(
        DoorName.JOURNAL, Client(path, service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
    )
    return audit


def _record(audit: Audit, ids: Ids) -> Appended:
    async def main() -> Appended:
        try:
            return await audit.record("exec.finished", ids, payload={"exit_codes": [0]})
        finally:
            audit.journal.close()

    return asyncio.run(main())


def test_a_committed_append_is_found_not_written_again(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sock", commit_first=True)
    result = _record(_audit(tmp_path / "j.sock"), Ids("r1", "op-1"))
    assert result.seq == 1 and journal.appends == 1
    assert [e["kind"] for e in journal.events] == ["exec.finished"]


def test_an_append_lost_with_the_journal_is_written_once_more(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sock", commit_first=False)
    result = _record(_audit(tmp_path / "j.sock"), Ids("r1", "op-1"))
    assert result.seq == 1 and journal.appends == 2
    assert [e["kind"] for e in journal.events] == ["exec.finished"]


def test_a_record_outside_any_request_is_not_guessed_at(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "j.sock", commit_first=False)
    with pytest.raises(Unreachable) as caught:
        _record(_audit(tmp_path / "j.sock"), Ids(None, "op-1"))
    assert caught.value.maybe_done and journal.appends == 1

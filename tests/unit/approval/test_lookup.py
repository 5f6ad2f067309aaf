"""approval/lookup.py: reading a request's trail back from the journal's events feed, page by page.

The feed here is a real server on a temporary socket with the journal's
``events`` semantics (after/limit/scope/tail, ``next_cursor``, ``latest``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from airlock.approval import lookup
from airlock.approval.lookup import JournalLookup
from airlock.common.codec import decode_request, encode_ok
from airlock.common.errors import ErrorCode
from airlock.common.ipc import Client
from airlock.common.wire.verb import DoorName, Stub


def event(seq: int, kind: str, request_id: str | None = None, operation_id: str | None = None) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "request_id": request_id, "operation_id": operation_id}


def feed(events: list[dict[str, Any]], args: dict[str, Any], calls: list[dict[str, Any]]) -> dict[str, Any]:
    calls.append(args)
    latest = events[-1]["seq"] if events else 0
    if "tail" in args:
        return {"events": events[-args["tail"] :] if args["tail"] else [], "next_cursor": latest, "latest": latest}
    scope = args.get("scope") or {}
    matching = [e for e in events if e["seq"] > args["after"] and all(e.get(k) == v for k, v in scope.items())]
    page = matching[: args["limit"]]
    return {"events": page, "next_cursor": page[-1]["seq"] if page else args["after"], "latest": latest}


def with_journal(tmp_path: Path, events: list[dict[str, Any]], body: Any) -> tuple[Any, list[dict[str, Any]]]:
    calls: list[dict[str, Any]] = []

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            request = decode_request(line.rstrip(b"\n"))
            writer.write(encode_ok(request.id, feed(events, request.args, calls)))
            await writer.drain()
        writer.close()

    async def main() -> Any:
        server = await asyncio.start_unix_server(one, path=str(tmp_path / "journal.sock"))
        client = Client(tmp_path / "journal.sock", service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
        try:
            return await body(JournalLookup(Stub(DoorName.JOURNAL, client)))
        finally:
            client.close()
            server.close()
            await server.wait_closed()

    return asyncio.run(main()), calls


def test_a_requests_events_come_back_in_order_across_pages(tmp_path: Path) -> None:
    events = [event(i, "x", request_id="r-1" if i % 2 else "r-2") for i in range(1, 2 * lookup.PAGE + 40)]
    found, calls = with_journal(tmp_path, events, lambda j: j.request_events("r-1"))
    assert [e["seq"] for e in found] == [e["seq"] for e in events if e["request_id"] == "r-1"]
    assert len(calls) == 2 and all(c["limit"] == lookup.PAGE for c in calls)  # every read one bounded page


def test_scoped_reads_at_most_the_pages_it_is_given(tmp_path: Path) -> None:
    events = [event(i, "x", request_id="r") for i in range(1, 5 * lookup.PAGE)]
    found, calls = with_journal(tmp_path, events, lambda j: j.scoped({"request_id": "r"}, pages=2))
    assert len(found) == 2 * lookup.PAGE and len(calls) == 2


def test_an_operation_is_told_by_its_newest_request_that_ran_not_one_that_replayed(tmp_path: Path) -> None:
    events = [
        event(1, "request.received", "r-a", "op"),
        event(2, "exec.finished", "r-a", "op"),
        event(3, "request.received", "r-b", "op"),
        event(4, "operation.replayed", "r-b", "op"),
        event(5, "request.received", "r-other", "op-2"),
    ]
    found, _ = with_journal(tmp_path, events, lambda j: j.operation_events("op"))
    assert [e["seq"] for e in found] == [1, 2]


def test_an_operation_only_ever_replayed_shows_its_newest_request(tmp_path: Path) -> None:
    events = [event(1, "operation.replayed", "r-a", "op"), event(2, "operation.replayed", "r-b", "op")]
    found, _ = with_journal(tmp_path, events, lambda j: j.operation_events("op"))
    assert [e["seq"] for e in found] == [2]


def test_an_unknown_operation_has_no_events(tmp_path: Path) -> None:
    found, _ = with_journal(tmp_path, [event(1, "x", "r", "op")], lambda j: j.operation_events("nope"))
    assert found == []

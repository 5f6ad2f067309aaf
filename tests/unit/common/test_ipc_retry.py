"""`ipc.Client` asks again on a pooled connection only when the server cannot have read the request.

A server killed after it read a request (and perhaps acted on it: journaled a
record, decided, ran a job) must not get it again on a new connection: that is
how a SIGKILL duplicated journal records and decisions (issue 20).  A server
that closed an idle connection with the request unread is asked again.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
from pathlib import Path

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client


def _reply(line: bytes) -> bytes:
    request = json.loads(line)
    return json.dumps({"id": request["id"], "ok": True, "data": {"n": request["args"]["n"]}}).encode() + b"\n"


def _serve(path: Path, second: str, seen: list[bytes]) -> threading.Thread:
    """Answer the first request; then on the same connection ``second``: 'read' it and close, or
    close with it 'unread'.  Every later connection is answered normally."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(4)
    server.settimeout(10)

    def run() -> None:
        with server:
            conn, _ = server.accept()
            line = conn.recv(65536)
            seen.append(line)
            conn.sendall(_reply(line))
            select.select([conn], [], [], 10)  # the second request has arrived
            if second == "read":
                seen.append(conn.recv(65536))
            conn.close()
            server.settimeout(2 if second == "read" else 10)
            try:
                again, _ = server.accept()
            except TimeoutError:
                return
            with again:
                line = again.recv(65536)
                seen.append(line)
                again.sendall(_reply(line))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _two_calls(path: Path, client: Client) -> dict[str, object]:
    async def main() -> dict[str, object]:
        first = await client.call("x", {"n": 1})
        assert first == {"n": 1}
        try:
            return await client.call("x", {"n": 2}, timeout=10)
        finally:
            client.close()

    return asyncio.run(main())


def test_a_request_the_server_read_before_it_died_is_not_sent_again(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    seen: list[bytes] = []
    thread = _serve(path, "read", seen)
    client = Client(path, service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
    with pytest.raises(AirlockError) as caught:
        _two_calls(path, client)
    assert caught.value.code is ErrorCode.AUDIT_UNAVAILABLE
    thread.join(15)
    assert [json.loads(line)["args"]["n"] for line in seen] == [1, 2]  # the second went once


def test_a_request_left_unread_on_a_closed_idle_connection_is_sent_again(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    seen: list[bytes] = []
    thread = _serve(path, "unread", seen)
    client = Client(path, service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
    assert _two_calls(path, client) == {"n": 2}
    thread.join(15)
    assert [json.loads(line)["args"]["n"] for line in seen] == [1, 2]

"""`Connection`'s view of its client, on real socket pairs: gone or not, and the write timeout."""

from __future__ import annotations

import asyncio
import socket

import pytest

from airlock.common import config
from airlock.common.peer import AllowList, peer_of
from airlock.common.server import Connection, Door, write_timeout


def _config(timeout: float = 10.0) -> config.Config:
    return config.parse_text(f"limits:\n  write_timeout_seconds: {timeout}\n", "/t.yaml")


async def _connection(server_side: socket.socket, cfg: config.Config, door: str = "agent") -> Connection:
    reader, writer = await asyncio.open_unix_connection(sock=server_side)
    return Connection(reader, writer, peer_of(server_side), Door(door, allow=AllowList.of([], [])), cfg)


def test_a_half_closed_client_is_still_there_a_closed_one_is_gone() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        conn = await _connection(ours, _config())
        assert not conn.peer_gone()
        theirs.shutdown(socket.SHUT_WR)  # sent its request, waits for the answer
        await asyncio.sleep(0.05)
        assert not conn.peer_gone()
        theirs.close()
        await asyncio.wait_for(conn.wait_gone(interval=0.01), 5)
        assert conn.peer_gone()
        conn.writer.close()

    asyncio.run(main())


def test_a_client_that_does_not_read_is_dropped_after_the_write_timeout() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn = await _connection(ours, _config(0.3))
        dropped: list[str] = []
        conn.on_dropped = lambda _conn, reason: dropped.append(reason)
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(ConnectionResetError):
            await conn.send(b"x" * (8 * 1024 * 1024) + b"\n")
        assert 0.25 < loop.time() - started < 5
        assert dropped == ["write_timeout"] and conn.peer_gone()
        with pytest.raises(ConnectionResetError):
            await conn.send(b"more\n")  # nothing more is tried
        theirs.close()

    asyncio.run(main())


def test_internal_doors_allow_longer_than_the_client_doors() -> None:
    cfg = _config(10)
    allow = AllowList.of([], [])
    assert write_timeout(cfg, Door("agent", allow=allow)) == write_timeout(cfg, Door("operator", allow=allow)) == 10
    assert write_timeout(cfg, Door("approval", allow=allow)) > 10 + 10  # more than a relayed client write


def test_a_stop_ends_a_client_idle_between_requests_but_not_one_mid_request() -> None:
    async def main() -> None:
        idle_ours, idle_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        busy_ours, busy_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        idle = await _connection(idle_ours, _config(), door="journal")
        busy = await _connection(busy_ours, _config(), door="journal")
        idle_theirs.sendall(b'{"first": 1}\n')
        busy_theirs.sendall(b'{"half": ')
        assert await idle.read_line() == b'{"first": 1}'
        idle_next = asyncio.ensure_future(idle.read_line())
        busy_next = asyncio.ensure_future(busy.read_line())
        deadline = asyncio.get_running_loop().time() + 5
        while not busy.decoder.buffered:  # the half line is read: busy waits for the rest
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        idle.end_if_idle()
        busy.end_if_idle()
        assert await asyncio.wait_for(idle_next, 2) is None
        with pytest.raises(BrokenPipeError):
            idle_theirs.sendall(b'{"late": 1}\n')  # the client learns at once: asks again elsewhere
        assert not busy_next.done()
        busy_theirs.sendall(b"2}\n")
        assert await asyncio.wait_for(busy_next, 2) == b'{"half": 2}'
        for end in (idle.writer, busy.writer):
            end.close()
        idle_theirs.close()
        busy_theirs.close()

    asyncio.run(main())


def test_a_request_sent_just_before_the_stop_is_still_read() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        conn = await _connection(ours, _config(), door="journal")
        theirs.sendall(b'{"first": 1}\n')
        assert await conn.read_line() == b'{"first": 1}'
        following = asyncio.ensure_future(conn.read_line())
        await asyncio.sleep(0)  # one turn: it waits for bytes, between requests
        assert conn.between_requests
        theirs.sendall(b'{"second": 2}\n')  # in the socket, not yet read, when the stop comes
        conn.end_if_idle()
        assert await asyncio.wait_for(following, 2) == b'{"second": 2}'
        assert await asyncio.wait_for(conn.read_line(), 2) is None
        conn.writer.close()
        theirs.close()

    asyncio.run(main())

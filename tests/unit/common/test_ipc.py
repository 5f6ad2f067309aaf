"""common/ipc.py: the asyncio client every service uses — replies, events, errors, pooling, bounds.

A real server on a temporary Unix socket, speaking the native envelope with
the codec's own encoders (test_ipc_retry.py covers the retry rule).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from airlock.common.codec import Event, decode_request, encode_error, encode_event, encode_ok
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.ipc import Client, Unreachable

Handler = Callable[[str, dict[str, Any], asyncio.StreamWriter, str | None], Awaitable[bytes | None]]


@contextlib.asynccontextmanager
async def serving(path: Path, handler: Handler, connections: list[int] | None = None) -> AsyncIterator[None]:
    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if connections is not None:
            connections.append(1)
        try:
            while line := await reader.readline():
                request = decode_request(line.rstrip(b"\n"))
                reply = await handler(request.verb, request.args, writer, request.id)
                if reply is None:  # the handler hangs up without answering
                    return
                writer.write(reply)
                await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_unix_server(one, path=str(path))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def echo(verb: str, args: dict[str, Any], writer: asyncio.StreamWriter, rid: str | None) -> bytes | None:
    if verb == "fail":
        return encode_error(rid, AirlockError(ErrorCode.DENIED, "no", {"rule": "r"}))
    if verb == "progress":
        for seq in range(1, 4):
            writer.write(encode_event(rid, "progress", seq, {"n": seq}))
        return encode_ok(rid, {"done": True})
    if verb == "hang":
        await asyncio.sleep(60)
    if verb == "drop":
        return None
    return encode_ok(rid, {"verb": verb, "args": args})


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_a_reply_and_its_data(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-x", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
            assert await client.call("hello", {"a": 1}) == {"verb": "hello", "args": {"a": 1}}
            client.close()

    run(body)


def test_an_error_reply_is_raised_as_it_came(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-x", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
            with pytest.raises(AirlockError) as caught:
                await client.call("fail", {})
            assert not isinstance(caught.value, Unreachable)
            assert (caught.value.code, caught.value.message, caught.value.details) == (
                ErrorCode.DENIED,
                "no",
                {"rule": "r"},
            )
            client.close()

    run(body)


def test_events_reach_the_handler_in_order_before_the_reply(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []

    async def on_event(event: Event) -> None:
        seen.append((event.event, event.fields["n"]))

    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-x", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
            assert await client.call("progress", {}, on_event=on_event) == {"done": True}
            client.close()

    run(body)
    assert seen == [("progress", 1), ("progress", 2), ("progress", 3)]


def test_connections_are_reused(tmp_path: Path) -> None:
    connections: list[int] = []

    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo, connections):
            client = Client(tmp_path / "s.sock", service="airlock-x", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
            for i in range(5):
                assert (await client.call("n", {"i": i}))["args"] == {"i": i}
            client.close()

    run(body)
    assert len(connections) == 1


def test_a_missing_socket_is_unavailable_with_the_callers_code(tmp_path: Path) -> None:
    async def body() -> None:
        client = Client(tmp_path / "absent.sock", service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
        with pytest.raises(Unreachable) as caught:
            await client.call("x", {})
        assert caught.value.code is ErrorCode.AUDIT_UNAVAILABLE
        assert caught.value.message.startswith("airlock-journal is unavailable: ")
        assert caught.value.details == {"service": "airlock-journal"}
        assert isinstance(caught.value.cause, FileNotFoundError)

    run(body)


def test_no_answer_within_the_bound_is_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE)
            with pytest.raises(Unreachable) as caught:
                await client.call("hang", {}, timeout=0.3)
            assert caught.value.code is ErrorCode.RUNNER_UNAVAILABLE
            assert caught.value.message == "airlock-runner is unavailable: no answer within 0.3s"
            client.close()

    run(body)


def test_a_server_that_hangs_up_without_answering_is_unavailable_and_may_have_acted(tmp_path: Path) -> None:
    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-approval", unavailable=ErrorCode.APPROVAL_UNAVAILABLE)
            with pytest.raises(Unreachable) as caught:
                await client.call("drop", {})
            assert caught.value.code is ErrorCode.APPROVAL_UNAVAILABLE
            assert caught.value.maybe_done  # it read the request: the caller must not assume nothing happened
            client.close()

    run(body)


def test_a_reply_larger_than_the_client_reads_is_told_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 39: the server did the work; the caller must know (intake settles it instead of abandoning)."""
    monkeypatch.setattr("airlock.common.ipc.MAX_REPLY_BYTES", 4096)

    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):
            client = Client(tmp_path / "s.sock", service="airlock-runner", unavailable=ErrorCode.RUNNER_UNAVAILABLE)
            assert await client.call("small", {"x": "y" * 100}) == {"verb": "small", "args": {"x": "y" * 100}}
            with pytest.raises(Unreachable) as caught:
                await client.call("large", {"x": "y" * 8192})
            assert caught.value.code is ErrorCode.RUNNER_UNAVAILABLE
            assert caught.value.details.get("reply_too_large") is True and caught.value.maybe_done
            client.close()

    run(body)


def test_a_reply_its_declaration_does_not_allow_is_the_callee_unavailable(tmp_path: Path) -> None:
    """A stub's reply that fails its message check names the callee as unavailable, not the caller's arguments
    as invalid: a client asked through intake must not be told its request was malformed because the journal
    answered garbage (and the journal may have acted)."""
    from airlock.common.wire.journal import APPEND, Append
    from airlock.common.wire.verb import DoorName, Stub

    async def body() -> None:
        async with serving(tmp_path / "s.sock", echo):  # echo's {"verb", "args"} is not an `Appended`
            client = Client(tmp_path / "s.sock", service="airlock-journal", unavailable=ErrorCode.AUDIT_UNAVAILABLE)
            journal = Stub(DoorName.JOURNAL, client)
            with pytest.raises(Unreachable) as caught:
                await journal.call(APPEND, Append(kind="request.received"))
            assert caught.value.code is ErrorCode.AUDIT_UNAVAILABLE
            assert "malformed append reply" in caught.value.message and caught.value.maybe_done
            assert await client.call("hello", {}) == {"verb": "hello", "args": {}}  # control: the door itself works
            client.close()

    run(body)

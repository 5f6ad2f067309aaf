"""airlock-web's guard: a bug in a handler is a plain 500 page with the security headers, never a traceback."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from airlock.common import config
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb
from airlock.web.door import Door
from airlock.web.service import CSP, Web


class BrokenDoor(Door):
    async def call(self, verb: Verb[Any, Any], args: Message) -> dict[str, Any]:
        raise RuntimeError("secret internal detail /etc/airlock")


def test_an_unexpected_error_is_a_plain_500_with_the_headers() -> None:
    async def scenario() -> None:
        web = Web(config.defaults(), BrokenDoor("/nonexistent"), "host")
        token, session = web.sessions.create("alice", "operator", "cred")
        async with TestClient(TestServer(web.app())) as client:
            sent = {"Cookie": f"{web.cookie}={token}", "X-Airlock-Proof": session.proof}
            reply = await client.get("/grants", headers=sent)
            text = await reply.text()
            assert reply.status == 500 and "internal error" in text
            assert "Traceback" not in text and "secret internal detail" not in text
            assert reply.headers["Content-Security-Policy"] == CSP and reply.headers["X-Frame-Options"] == "DENY"

    asyncio.run(scenario())

"""A small Chrome DevTools Protocol client (aiohttp's websocket client) and a headless Chromium.

Enough to drive airlock-web the way a person does: open a page, click, read
text, add a virtual WebAuthn authenticator, take a screenshot.  Every wait
has a deadline; a test support module, not part of airlock.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
START_SECONDS = 30.0
CALL_SECONDS = 30.0


class CDPError(Exception):
    pass


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[int]:
    """Headless Chromium with a fresh profile; yields its DevTools port, killed afterwards."""
    assert CHROMIUM is not None
    argv = [
        CHROMIUM,
        "--headless=new",
        "--remote-debugging-port=0",
        "--remote-debugging-address=127.0.0.1",
        f"--user-data-dir={profile}",
        "--no-first-run",
        "--no-default-browser-check",
        "--disable-gpu",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-sync",
        "--password-store=basic",
        "about:blank",
    ]
    if os.geteuid() == 0:
        argv.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
    log = open(profile.parent / f"{profile.name}.log", "wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + START_SECONDS
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise CDPError(
                    f"chromium did not start: {(profile.parent / f'{profile.name}.log').read_text()[-2000:]}"
                )
            time.sleep(0.05)
        yield int(port_file.read_text().split()[0])
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


class Page:
    """One page target over its own websocket: commands by id, events kept for `wait_event`."""

    def __init__(self, session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.session = session
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, port: int) -> Page:
        session = aiohttp.ClientSession()
        async with session.get(f"http://127.0.0.1:{port}/json/list", timeout=aiohttp.ClientTimeout(10)) as reply:
            targets = await reply.json()
        page = next(t for t in targets if t.get("type") == "page")
        ws = await session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024)
        return cls(session, ws)

    async def close(self) -> None:
        self.reader.cancel()
        await self.ws.close()
        await self.session.close()

    async def _read(self) -> None:
        async for msg in self.ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            future = self.waiting.pop(data.get("id"), None) if "id" in data else None
            if future is not None and not future.done():
                future.set_result(data)
            elif "method" in data:
                self.events.append(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self.ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[call_id] = future
        await self.ws.send_str(json.dumps({"id": call_id, "method": method, "params": params}))
        reply = await asyncio.wait_for(future, CALL_SECONDS)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result") or {}
        return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise CDPError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float = 20.0) -> Any:
        """Evaluate ``expression`` until it is truthy (a page condition, polled with a deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(CDPError):  # mid-navigation the context may be gone for a moment
                value = await self.evaluate(expression)
                if value:
                    return value
            if time.monotonic() > deadline:
                text = await self.text()
                raise CDPError(f"timed out waiting for {expression!r}; the page reads:\n{text[:3000]}")
            await asyncio.sleep(0.05)

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    async def text(self) -> str:
        try:
            return str(await self.evaluate("document.body ? document.body.innerText : ''"))
        except CDPError as exc:
            return f"(no text: {exc})"

    async def screenshot(self, width: int, height: int, *, full_page: bool = False) -> bytes:
        """A PNG as a phone of ``width`` x ``height`` CSS pixels (2x) shows the page; ``full_page``: all of it."""
        await self.send(
            "Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=2, mobile=True
        )
        options: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            tall = max(height, int(metrics["cssContentSize"]["height"]))
            options |= {
                "captureBeyondViewport": True,
                "clip": {"x": 0, "y": 0, "width": width, "height": tall, "scale": 1},
            }
        shot = await self.send("Page.captureScreenshot", **options)
        await self.send("Emulation.clearDeviceMetricsOverride")
        return base64.b64decode(shot["data"])

    async def virtual_authenticator(self) -> str:
        """WebAuthn's virtual authenticator: a platform passkey with user verification (PIN/biometric) done."""
        await self.send("WebAuthn.enable")
        added = await self.send(
            "WebAuthn.addVirtualAuthenticator",
            options={
                "protocol": "ctap2",
                "transport": "internal",
                "hasResidentKey": True,
                "hasUserVerification": True,
                "isUserVerified": True,
                "automaticPresenceSimulation": True,
            },
        )
        return str(added["authenticatorId"])

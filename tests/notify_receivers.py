"""Real receivers on 127.0.0.1 for the notify relay's tests.

`HttpReceiver` is an ``http.server`` that records every POST (path, headers,
body) and can be taken down (its port closed: connections are refused) and
brought back on the same port.  `MailReceiver` is an aiosmtpd SMTP server
(Debian python3-aiosmtpd) that records every mail.
"""

from __future__ import annotations

import email
import email.policy
import http.server
import json
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Post:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


class HttpReceiver:
    def __init__(self, delay: float = 0.0) -> None:
        self.posts: list[Post] = []
        self.lock = threading.Lock()
        self.delay = delay
        self.port = 0
        self.server: http.server.ThreadingHTTPServer | None = None
        self.up()

    def up(self) -> None:
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                if receiver.delay:
                    time.sleep(receiver.delay)
                with receiver.lock:
                    receiver.posts.append(
                        Post(self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.time())
                    )
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self.server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self) -> None:
        assert self.server is not None
        self.server.shutdown()
        self.server.server_close()
        self.server = None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def on(self, path: str) -> list[Post]:
        with self.lock:
            return [p for p in self.posts if p.path == path]

    def wait(self, path: str, match: Any, timeout: float = 30.0) -> Post:
        """The first POST to ``path`` for which ``match(post)`` is true."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for post in self.on(path):
                try:
                    if match(post):
                        return post
                except (ValueError, KeyError, TypeError):
                    pass
            time.sleep(0.02)
        raise AssertionError(
            f"no matching POST to {path} within {timeout}s; got {[p.body[:200] for p in self.on(path)]}"
        )


class MailReceiver:
    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.mails: list[tuple[float, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
                parsed = email.message_from_bytes(envelope.content, policy=email.policy.default)
                with receiver.lock:
                    receiver.mails.append((time.time(), parsed))
                return "250 OK"

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()  # type: ignore[no-untyped-call]  # aiosmtpd is untyped

    def stop(self) -> None:
        self.controller.stop()

    def wait(self, match: Any, timeout: float = 30.0) -> tuple[float, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for at, mail in self.mails:
                    if match(mail):
                        return at, mail
            time.sleep(0.02)
        raise AssertionError(f"no matching mail within {timeout}s; got {[m['Subject'] for _, m in self.mails]}")

"""The fleet channel (issue 49): this host's pending and decided messages, posted to a fleet console.

Like the webhook channel (the message as JSON, HMAC-SHA256 over the exact
body in ``X-Airlock-Signature``), plus the name the console knows this host
by (``host``, as in the console's ``web.fleet_hosts``) inside the signed
body and in ``X-Airlock-Host``, so the console checks each post with that
host's own secret (`verify`).  At least once, in order: the relay's cursor
and retries, as for every channel.  The console treats a post as news from
that host, never as the truth: it then asks the host itself over SSH
(docs/fleet.md), so a forged or replayed post can make it look, not believe.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from typing import Any

from airlock.common.channels.base import REQUIRED, Channel, Key, RuleError, post
from airlock.common.channels.webhook import shared_secret, signature
from airlock.common.configvalues import string, url

HOST_HEADER = "X-Airlock-Host"


class Fleet(Channel):
    kind = "fleet"
    settings_keys = (
        Key("url", url, REQUIRED),
        Key("host", string, REQUIRED),
        Key("secret", shared_secret, None, secret=True),
    )

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        if settings["secret"] is None and settings["secret_file"] is None:
            raise RuleError("secret", "a fleet channel needs secret or secret_file")
        if not settings["host"] or not settings["host"].isprintable() or len(settings["host"]) > 255:
            raise RuleError("host", "the name the console knows this host by (printable, at most 255 characters)")

    def body(self, message: dict[str, Any]) -> bytes:
        signed = message | {"fleet_host": self.settings["host"]}
        return json.dumps(signed, ensure_ascii=True, sort_keys=True, separators=(",", ":")).encode()

    def send(self, message: dict[str, Any]) -> str:
        body = self.body(message)
        headers = {
            "Content-Type": "application/json",
            "X-Airlock-Signature": signature(self.settings["secret"], body),
            HOST_HEADER: self.settings["host"],
        }
        return post(self.settings["url"], body, headers)


def verify(body: bytes, signed: str, secrets: Mapping[str, str]) -> tuple[str, dict[str, Any]] | None:
    """The console's side: (host, message) when ``signed`` is that host's HMAC of ``body``; None otherwise."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    host = message.get("fleet_host") if isinstance(message, dict) else None
    secret = secrets.get(host) if isinstance(host, str) else None
    if secret is None or not hmac.compare_digest(signature(secret, body), signed):
        return None
    return str(host), message


CHANNEL = Fleet

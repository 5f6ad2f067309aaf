"""The ntfy channel: the message's text as a plain-text push, title and priority as headers."""

from __future__ import annotations

from typing import Any

from airlock.common.channels.base import REQUIRED, Channel, Key, post
from airlock.common.configvalues import choice, optional_string, string_list, url

PRIORITY = {"min": 1, "low": 2, "default": 3, "high": 4, "urgent": 5}


def _header_safe(text: str) -> str:
    # HTTP header values: no CR/LF (sanitise already escaped them), latin-1 only.
    return text.encode("latin-1", "backslashreplace").decode("latin-1").replace("\r", " ").replace("\n", " ")


class Ntfy(Channel):
    kind = "ntfy"
    settings_keys = (
        Key("url", url, REQUIRED),
        Key("priority", choice(*PRIORITY), "high"),
        Key("tags", string_list, ("lock",)),
        Key("token", optional_string, None, secret=True),
    )

    def body(self, message: dict[str, Any]) -> tuple[bytes, dict[str, str]]:
        """The text and the headers; never markdown, clicks, actions or attachments."""
        priority = PRIORITY[self.settings.get("priority") or "high"]
        if message["event"] == "decided":
            priority = max(1, priority - 1)
        headers = {
            "Title": _header_safe(message["title"]),
            "Priority": str(priority),
            "Tags": _header_safe(",".join(self.settings.get("tags") or ())),
            "X-Airlock-Seq": str(message.get("seq")),
        }
        if self.settings.get("token"):
            headers["Authorization"] = f"Bearer {self.settings['token']}"
        return message["text"].encode(), headers

    def send(self, message: dict[str, Any]) -> str:
        body, headers = self.body(message)
        return post(self.settings["url"], body, headers | {"Content-Type": "text/plain; charset=utf-8"})


CHANNEL = Ntfy

"""The Slack (and Mattermost) channel: an incoming-webhook JSON body whose markup cannot be forged."""

from __future__ import annotations

import json
from typing import Any

from airlock.common.channels.base import REQUIRED, Channel, Key, post
from airlock.common.configvalues import url


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def slack_escape(text: str) -> str:
    """Text for Slack mrkdwn: ``& < >`` as Slack's entities, so ``<!channel>``, ``<@U1>`` and
    ``<http://x|click>`` are shown, never acted on (api.slack.com, "Escaping text")."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chat_text(text: str) -> str:
    """The top-level ``text`` of a Slack or Mattermost message: markup off for both.

    Mattermost renders it as Markdown (links, ``@channel``, emphasis), Slack as
    mrkdwn and in notifications.  It goes in a code block, where neither renders
    links or emphasis and Mattermost does not notify mentions; a backtick could
    close the block, so it is shown as the visible escape ``\\x60`` (as control
    characters are, render.sanitise: a backslash in the text is already doubled,
    so the escape cannot be forged); ``& < >`` are escaped for Slack.
    """
    return "```\n" + slack_escape(text.replace("`", "\\x60")) + "\n```"


class Slack(Channel):
    kind = "slack"
    settings_keys = (Key("url", url, REQUIRED),)

    def body(self, message: dict[str, Any]) -> bytes:
        """Every block but one is plain_text; the mrkdwn "Decide:" line is escaped and its code span
        cannot be closed; link previews are off (an agent's URL is never fetched by the chat service)."""
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": _clip(message["title"], 150), "emoji": False}},
            {"type": "section", "text": {"type": "plain_text", "text": _clip(message["text"], 2900), "emoji": False}},
        ]
        if message["event"] in ("pending", "reminder"):
            decide = str(message["decide"])
            if "`" in decide:  # no escape exists inside a code span: show the line as plain text
                blocks.append({"type": "section", "text": {"type": "plain_text", "text": f"Decide: {decide}"}})
            else:
                line = f"Decide: `{slack_escape(decide)}`"
                blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": line}})
        body = {
            "text": chat_text(f"{message['title']}\n{message['text']}"),
            "blocks": blocks,
            "unfurl_links": False,
            "unfurl_media": False,
        }
        return json.dumps(body, ensure_ascii=False).encode()

    def send(self, message: dict[str, Any]) -> str:
        return post(self.settings["url"], self.body(message), {"Content-Type": "application/json"})


CHANNEL = Slack

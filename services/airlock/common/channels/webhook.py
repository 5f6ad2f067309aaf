"""The webhook channel: the message as JSON, signed with HMAC-SHA256 over the exact body."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

import yaml

from airlock.common.channels.base import REQUIRED, Channel, Key, RuleError, post
from airlock.common.configvalues import string, url


def shared_secret(node: yaml.Node) -> str:
    value = string(node)
    if len(value) < 16:
        raise ValueError("must be at least 16 characters")
    return value


def signature(secret: str, body: bytes) -> str:
    """``X-Airlock-Signature``: ``sha256=`` and the hex HMAC-SHA256 of the exact body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class Webhook(Channel):
    kind = "webhook"
    settings_keys = (Key("url", url, REQUIRED), Key("secret", shared_secret, None, secret=True))

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        if settings["secret"] is None and settings["secret_file"] is None:
            raise RuleError("secret", "a webhook channel needs secret or secret_file")

    def body(self, message: dict[str, Any]) -> bytes:
        return json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()

    def send(self, message: dict[str, Any]) -> str:
        body = self.body(message)
        headers = {"Content-Type": "application/json", "X-Airlock-Signature": signature(self.settings["secret"], body)}
        return post(self.settings["url"], body, headers)


CHANNEL = Webhook

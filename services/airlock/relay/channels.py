"""Sending one message to one channel: stdlib urllib and smtplib, nothing else.

Each `send` either returns (the receiver took the message: an HTTP 2xx, or
the SMTP server accepted the mail for every recipient) or raises
`DeliveryError`; the caller retries with backoff.  Every network wait is
bounded by a timeout.
"""

from __future__ import annotations

import os
import smtplib
import ssl
import urllib.error
import urllib.request
from typing import Any

from airlock.common.config import SECRET_FILE_KEYS
from airlock.relay import message as msg

HTTP_TIMEOUT_SECONDS = 10.0
USER_AGENT = "airlock-notify/1"


class DeliveryError(Exception):
    """The receiver did not take the message (why, in words fit for a log)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # A webhook that answers with a redirect did not take the message; following
    # it would send the signed body somewhere the operator did not configure.
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


class SecretError(Exception):
    """A ``*_file`` secret could not be read (the relay does not start)."""


def with_secrets(channel: dict[str, Any]) -> dict[str, Any]:
    """The channel with each ``<key>_file`` read into ``<key>`` (once, at start; the file is not followed if a
    symlink)."""
    out = dict(channel)
    for key in SECRET_FILE_KEYS.get(channel["type"], ()):
        path = channel.get(f"{key}_file")
        if path is None:
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(4097)
        except OSError as exc:
            raise SecretError(f"channel {channel['name']}: {key}_file {path}: {exc.strerror}") from None
        try:
            value = raw.decode().rstrip("\r\n")
        except UnicodeDecodeError:
            value = ""
        if not value or len(raw) > 4096 or "\n" in value:
            raise SecretError(
                f"channel {channel['name']}: {key}_file {path}: must hold one line of text (at most 4 KiB)"
            )
        if key == "secret" and len(value) < 16:
            raise SecretError(
                f"channel {channel['name']}: {key}_file {path}: the secret must be at least 16 characters"
            )
        out[key] = value
    return out


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float = HTTP_TIMEOUT_SECONDS) -> int:
    # The configuration admits only http:// and https:// URLs (common/config.py).
    request = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": USER_AGENT, **headers})  # noqa: S310
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            response.read(64 * 1024)
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise DeliveryError(f"cannot reach the receiver: {exc.reason}") from None
    except (OSError, ValueError) as exc:  # timeouts, resets, bad URLs
        raise DeliveryError(f"cannot reach the receiver: {exc}") from None
    if not 200 <= status < 300:
        raise DeliveryError(f"HTTP {status}")
    return status


def send(channel: dict[str, Any], message: dict[str, Any]) -> str:
    """Deliver ``message`` on ``channel``; returns a short note for the log (raises DeliveryError)."""
    kind = channel["type"]
    if kind == "webhook":
        body = msg.webhook_body(message)
        headers = {"Content-Type": "application/json", "X-Airlock-Signature": msg.signature(channel["secret"], body)}
        return f"HTTP {_post(channel['url'], body, headers)}"
    if kind == "ntfy":
        body, headers = msg.ntfy_request(message, channel)
        return f"HTTP {_post(channel['url'], body, headers | {'Content-Type': 'text/plain; charset=utf-8'})}"
    if kind == "slack":
        return f"HTTP {_post(channel['url'], msg.slack_body(message), {'Content-Type': 'application/json'})}"
    if kind == "email":
        return _mail(channel, message)
    raise DeliveryError(f"unknown channel type {kind!r}")


def _mail(channel: dict[str, Any], message: dict[str, Any]) -> str:
    mail = msg.email_message(message, channel)
    try:
        with smtplib.SMTP(channel["host"], channel["port"], timeout=channel["timeout_seconds"]) as smtp:
            smtp.ehlo()
            if channel["starttls"]:
                smtp.starttls(context=ssl.create_default_context())
                smtp.ehlo()
            if channel["username"] is not None:
                smtp.login(channel["username"], channel["password"])
            refused = smtp.send_message(mail)
    except smtplib.SMTPException as exc:
        raise DeliveryError(f"SMTP: {exc}") from None
    except (TimeoutError, OSError) as exc:
        raise DeliveryError(f"cannot reach the mail server: {exc}") from None
    if refused:
        raise DeliveryError(f"SMTP refused {sorted(refused)}")
    return f"mail to {len(channel['to'])} recipient(s)"

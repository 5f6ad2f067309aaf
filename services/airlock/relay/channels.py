"""Sending one message to one channel: stdlib urllib and smtplib, nothing else.

Each `send` either returns (the receiver took the message: an HTTP 2xx, or
the SMTP server accepted the mail for every recipient) or raises
`DeliveryError`; the caller retries with backoff.  Every network wait is
bounded by a timeout.
"""

from __future__ import annotations

import smtplib
import ssl
import urllib.error
import urllib.request
from typing import Any

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


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float = HTTP_TIMEOUT_SECONDS) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": USER_AGENT, **headers})
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

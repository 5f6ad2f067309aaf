"""The email channel: one text/plain mail per message over SMTP (STARTTLS and login optional)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import yaml

from airlock.common.channels.base import REQUIRED, Channel, DeliveryError, Key, RuleError
from airlock.common.configvalues import optional_string, parse_bool, positive_float, positive_int, string, string_list

if TYPE_CHECKING:
    from email.message import EmailMessage


def port(node: yaml.Node) -> int:
    value = positive_int(node)
    if value > 65535:
        raise ValueError("must be a TCP port (1-65535)")
    return value


def addresses(node: yaml.Node) -> tuple[str, ...]:
    values = string_list(node)
    if not values:
        raise ValueError("must name at least one address")
    return values


class Email(Channel):
    kind = "email"
    settings_keys = (
        Key("host", string, "localhost"),
        Key("port", port, 25),
        Key("starttls", parse_bool, False),
        Key("username", optional_string, None),
        Key("password", optional_string, None, secret=True),
        Key("from", string, REQUIRED),
        Key("to", addresses, REQUIRED),
        Key("timeout_seconds", positive_float, 30.0),
    )

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        has_password = settings["password"] is not None or settings["password_file"] is not None
        if (settings["username"] is None) == has_password:
            raise RuleError("", "give both username and password (or password_file), or neither")

    def body(self, message: dict[str, Any]) -> EmailMessage:
        # Imported here: every service loads the channel classes with the config, only the relay mails.
        from email.message import EmailMessage

        mail = EmailMessage()
        mail["Subject"] = message["title"]
        mail["From"] = self.settings["from"]
        mail["To"] = ", ".join(self.settings["to"])
        mail["X-Airlock-Seq"] = str(message.get("seq"))
        if message.get("request_id"):
            mail["X-Airlock-Request-Id"] = str(message["request_id"])
        mail.set_content(message["text"] + "\n")
        return mail

    def send(self, message: dict[str, Any]) -> str:
        import smtplib
        import ssl

        mail, s = self.body(message), self.settings
        try:
            with smtplib.SMTP(s["host"], s["port"], timeout=s["timeout_seconds"]) as smtp:
                smtp.ehlo()
                if s["starttls"]:
                    smtp.starttls(context=ssl.create_default_context())
                    smtp.ehlo()
                if s["username"] is not None:
                    smtp.login(s["username"], s["password"])
                refused = smtp.send_message(mail)
        except smtplib.SMTPException as exc:
            raise DeliveryError(f"SMTP: {exc}") from None
        except (TimeoutError, OSError) as exc:
            raise DeliveryError(f"cannot reach the mail server: {exc}") from None
        if refused:
            raise DeliveryError(f"SMTP refused {sorted(refused)}")
        return f"mail to {len(s['to'])} recipient(s)"


CHANNEL = Email

"""What every notification channel is: its settings keys, its secrets, its body, its send.

A channel type is one `Channel` subclass in a module of its own in this
package (``webhook.py``, ``ntfy.py``, ...); the package's registry finds it.
The class declares the keys its entry in ``notify.channels`` takes
(`settings_keys`, each a `Key`: name, parser, default; ``secret=True`` for one
that may instead be read from ``<name>_file`` and that `airlock config show`
masks), a rule across its keys (`check`), the bytes it sends (``body``) and
how it sends them (`send`).  An instance is one configured entry.

`send` either returns (the receiver took the message: an HTTP 2xx, or the
SMTP server accepted the mail for every recipient) or raises `DeliveryError`;
the relay retries with backoff.  Every network wait is bounded by a timeout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import yaml

from airlock.common.configvalues import REQUIRED, Parser, absolute_path
from airlock.common.yamlnodes import STR

HTTP_TIMEOUT_SECONDS = 10.0
USER_AGENT = "airlock-notify/1"
MAX_SECRET_FILE = 4096


class DeliveryError(Exception):
    """The receiver did not take the message (why, in words fit for a log)."""


class SecretError(Exception):
    """A ``*_file`` secret could not be read (the relay does not start)."""


class RuleError(ValueError):
    """A channel's keys break a rule across them: ``key`` names where ("" for the entry itself)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True, slots=True)
class Key:
    """One key of a channel's entry: its parser and default (`REQUIRED`: it must be given)."""

    name: str
    parse: Parser
    default: Any = None
    # A secret: may stand in ``<name>_file`` instead (read at the relay's start), never shown.
    secret: bool = False


class Channel(Mapping[str, Any]):
    """One configured channel: its settings (checked by the config) and how a message reaches it.

    It reads as the mapping of its entry's keys (``channel["url"]``, as
    `airlock config show` prints them) and compares by them; its repr masks
    its secrets, so a logged configuration never carries one.
    """

    kind: ClassVar[str]  # the ``type:`` value
    settings_keys: ClassVar[tuple[Key, ...]]

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.settings = dict(settings)
        self.name = str(settings["name"])

    def __getitem__(self, key: str) -> Any:
        return self.settings[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.settings)

    def __len__(self) -> int:
        return len(self.settings)

    def __repr__(self) -> str:
        secrets = self.secret_keys()
        shown = {k: "[set]" if k in secrets and v is not None else v for k, v in self.settings.items()}
        return f"{type(self).__name__}({shown!r})"

    @classmethod
    def secret_keys(cls) -> tuple[str, ...]:
        return tuple(key.name for key in cls.settings_keys if key.secret)

    @classmethod
    def all_keys(cls) -> tuple[Key, ...]:
        """The keys in the order `airlock config show` prints them: each secret followed by its ``_file``."""
        out: list[Key] = []
        for key in cls.settings_keys:
            out.append(key)
            if key.secret:
                out.append(Key(f"{key.name}_file", absolute_path, None))
        return tuple(out)

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        """A rule across the parsed keys (raise `RuleError`); each key is already valid on its own."""

    def send(self, message: dict[str, Any]) -> str:
        """Deliver ``message``; returns a short note for the log (raises `DeliveryError`)."""
        raise NotImplementedError

    def with_secrets(self) -> Self:
        """This channel with each ``<key>_file`` read into ``<key>`` (once, at start; a symlink is not followed).

        The value read is checked by the key's own parser, as if written inline.
        """
        settings = dict(self.settings)
        for key in self.settings_keys:
            path = settings.get(f"{key.name}_file") if key.secret else None
            if path is not None:
                settings[key.name] = self._read_secret(key, Path(path))
        return type(self)(settings)

    def _read_secret(self, key: Key, path: Path) -> Any:
        where = f"channel {self.name}: {key.name}_file {path}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_SECRET_FILE + 1)
        except OSError as exc:
            raise SecretError(f"{where}: {exc.strerror}") from None
        try:
            value = raw.decode().rstrip("\r\n")
        except UnicodeDecodeError:
            value = ""
        if not value or len(raw) > MAX_SECRET_FILE or "\n" in value:
            raise SecretError(f"{where}: must hold one line of text (at most 4 KiB)")
        try:
            return key.parse(yaml.ScalarNode(STR, value))
        except ValueError as exc:
            raise SecretError(f"{where}: the {key.name} {exc}") from None


def post(url: str, body: bytes, headers: dict[str, str], timeout: float = HTTP_TIMEOUT_SECONDS) -> str:
    """POST ``body``; returns ``HTTP <status>`` for a 2xx, raises `DeliveryError` for anything else.

    A redirect is not followed: it would send the (signed) body somewhere the
    operator did not configure.  The configuration admits only http:// and
    https:// URLs (configvalues.url).
    """
    # Imported here: every service loads the channel classes with the config, only the relay sends.
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any, **kwargs: Any) -> None:
            return None

    request = urllib.request.Request(url, data=body, method="POST", headers={"User-Agent": USER_AGENT, **headers})  # noqa: S310
    try:
        with urllib.request.build_opener(NoRedirect).open(request, timeout=timeout) as response:
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
    return f"HTTP {status}"


__all__ = ["REQUIRED", "Channel", "DeliveryError", "Key", "RuleError", "SecretError", "post"]

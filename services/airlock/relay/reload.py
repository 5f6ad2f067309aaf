"""The relay's reload (`systemctl reload airlock-notify`, a SIGHUP): what it can take without a restart.

A reload reads the configuration again.  The one setting it applies is
``web.url`` (the link in each pending message, issue 44): a string the
workers read when they build a message, so changing it cannot lose or repeat
a delivery.  Everything else the relay uses (channels and their secrets,
which the relay read once at start, the socket, rate limits, the state
directory) shapes running workers and cursors; a reload that changes any of
it says, by key, that a restart is needed, and keeps the running values.  A
configuration that does not load is refused whole: the relay goes on with
the one it has, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airlock.common.config import Config

APPLIED = ("web.url",)


@dataclass(frozen=True, slots=True)
class Reload:
    """What a reload from ``old`` to ``new`` does: the web URL to use, and what waits for a restart."""

    web_url: str
    needs_restart: tuple[str, ...]


def plan(old: Config, new: Config) -> Reload:
    """Pure: compare every setting; only ``web.url`` is taken live."""
    before, after = _flat(old.to_dict()), _flat(new.to_dict())
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return Reload(new.web.url, tuple(k for k in changed if k not in APPLIED))


def _flat(sections: dict[str, Any]) -> dict[str, Any]:
    return {f"{section}.{name}": value for section, values in sections.items() for name, value in values.items()}

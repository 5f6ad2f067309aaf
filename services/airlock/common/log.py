"""One structlog configuration for every airlock service.

Events are names with key-value fields (``log.info("runner.job.finished",
exit_code=0)``).  Under systemd, when stderr *is* the journal (JOURNAL_STREAM
names fd 2), each event goes to ``journal.send`` with ``MESSAGE_ID``,
``SYSLOG_IDENTIFIER``, ``PRIORITY`` and one uppercase ``AIRLOCK_*`` field per
key, so ``journalctl AIRLOCK_REQUEST_ID=…`` finds a request across units.
Elsewhere each event is one JSON line on stderr.

(The published structlog-journald processor needs Python 3.12 and structlog
25; Debian 12 has 3.11 and structlog 22.3, hence this small processor.)
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

import structlog

_PRIORITY = {"critical": 2, "error": 3, "warning": 4, "info": 6, "debug": 7}
_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
# Keys never forwarded to any sink: a secret-typed value must not reach a log.
_SECRET_KEYS = frozenset({"protected_env", "protected_values", "token", "ticket", "secret"})


def stderr_is_journal(environ: Mapping[str, str]) -> bool:
    """True when systemd connected our stderr to journald (see systemd.exec(5))."""
    value = environ.get("JOURNAL_STREAM", "")
    try:
        dev, ino = (int(part) for part in value.split(":"))
        st = os.fstat(2)
    except (ValueError, OSError):
        return False
    return st.st_dev == dev and st.st_ino == ino


def journal_field(key: str) -> str:
    """``request_id`` -> ``AIRLOCK_REQUEST_ID`` (journald allows A-Z, 0-9 and _)."""
    cleaned = "".join(c if c.isalnum() else "_" for c in key.upper())
    return "AIRLOCK_" + cleaned


def _scrub(_logger: Any, _name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in _SECRET_KEYS & event_dict.keys():
        event_dict[key] = "[redacted]"
    return event_dict


class JournaldRenderer:
    """The last processor under journald: sends the event and drops it."""

    def __init__(self, identifier: str) -> None:
        from systemd import journal  # only imported where journald is in use

        self._send = journal.send
        self._identifier = identifier

    def __call__(self, _logger: Any, name: str, event_dict: MutableMapping[str, Any]) -> Any:
        fields: dict[str, str] = {}
        event = str(event_dict.pop("event", ""))
        level = str(event_dict.pop("level", name))
        message_id = event_dict.pop("message_id", None)
        said = event_dict.pop("message", None)  # an audit record's sentence (common/sentence.py)
        event_dict.pop("timestamp", None)
        for key, value in event_dict.items():
            if value is None:
                continue
            fields[journal_field(key)] = value if isinstance(value, str) else json.dumps(value, default=str)
        if message_id:
            fields["MESSAGE_ID"] = str(message_id)
        summary = " ".join(f"{k}={v}" for k, v in event_dict.items() if v is not None and k != "service")
        self._send(
            str(said) if said else f"{event} {summary}".strip(),
            PRIORITY=str(_PRIORITY.get(level, 6)),
            SYSLOG_IDENTIFIER=self._identifier,
            AIRLOCK_EVENT=event,
            **fields,
        )
        raise structlog.DropEvent


def configure(
    service: str, *, level: str = "info", target: str = "auto", environ: Mapping[str, str] | None = None
) -> None:
    """Configure logging once, at start-up, for the whole process."""
    environ = os.environ if environ is None else environ
    use_journal = target == "journal" or (target == "auto" and stderr_is_journal(environ))
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _scrub,
    ]
    if use_journal:
        try:
            processors.append(JournaldRenderer(f"airlock-{service}" if service != "cli" else "airlock"))
        except ImportError:
            use_journal = False
    if not use_journal:
        processors += [
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(default=str, sort_keys=False),
        ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS.get(level, logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
    global _journald_in_use
    _journald_in_use = use_journal


_journald_in_use = False


def to_journald() -> bool:
    """Did `configure` send this process's events to journald?"""
    return _journald_in_use


def get(name: str | None = None) -> Any:
    return structlog.get_logger(name)

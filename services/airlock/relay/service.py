"""airlock-notify: follow the events feed on operator.sock, deliver to channels.

The service's main: it checks the configuration (a channel at least; its own
user an observer, never an operator), reads each channel's secrets once, and
starts one worker thread per channel (`worker.py`: its own durable cursor,
backoff and rate limit, so a receiver that is down holds back only its own
channel; at least once, and at most the message in flight is sent again after
a crash).  It writes ``status.json`` for `airlock status` (`state.py`).

The relay's user is an observer (``operators.observers``): it can read the
feed and nothing else.  It has no socket of its own and is not
socket-activated; the package ships its unit disabled.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airlock.common import log
from airlock.common.activation import RELAY_READY_SECONDS
from airlock.common.channels.base import SecretError
from airlock.common.codec import iso_utc
from airlock.common.config import Config, ConfigError, load
from airlock.common.notify import Notifier
from airlock.common.peer import identify, may_decide
from airlock.relay import state
from airlock.relay.worker import Worker

EX_CONFIG = 78
STOP_JOIN_SECONDS = 20.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="airlock-notify",
        description="The airlock relay: follows the events feed on operator.sock (as a read-only observer) "
        "and delivers pending requests and their outcome to the channels in notify.channels.",
    )
    parser.add_argument("--config", default=None, help="configuration file (default: /etc/airlock/airlock.yaml)")
    parser.add_argument(
        "--socket", default=None, help="operator.sock to follow (default: the configured runtime_dir's)"
    )
    ns = parser.parse_args(argv)
    try:
        config = load(Path(ns.config) if ns.config else None)
    except ConfigError as exc:
        print(f"airlock-notify: {exc}", file=sys.stderr)
        return EX_CONFIG
    log.configure("notify", level=config.log.level, target=config.log.target)
    logger = log.get()
    if not config.notify.channels:
        logger.error("notify.start.failed", error="notify.channels is empty: there is nowhere to deliver to")
        print(
            "airlock-notify: notify.channels is empty: configure a channel first (docs/operations.md)", file=sys.stderr
        )
        return EX_CONFIG
    me = identify(os.getpid(), os.geteuid(), os.getegid(), os.getgroups())
    if me.user == config.notify.user and may_decide(
        me, config.operators.users, config.operators.groups, config.operators.observers.users
    ):
        # Least privilege: the relay reads; a relay that could approve is refused outright.
        error = f"{me.user} may decide on operator.sock: name it in operators.observers.users, not as an operator"
        logger.error("notify.start.failed", error=error)
        print(f"airlock-notify: {error}", file=sys.stderr)
        return EX_CONFIG
    try:
        config.notify.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        logger.error("notify.start.failed", error=f"{config.notify.state_dir}: {exc.strerror}")
        return 1
    try:
        resolved = [channel.with_secrets() for channel in config.notify.channels]
    except SecretError as exc:
        logger.error("notify.start.failed", error=str(exc))
        print(f"airlock-notify: {exc}", file=sys.stderr)
        return EX_CONFIG
    socket_path = ns.socket or str(config.socket_path("operator"))
    host = config.notify.host or socket.gethostname()
    notifier = Notifier()
    stop = threading.Event()

    reload = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, lambda _signum, _frame: reload.set())
    workers = [Worker(config, channel, socket_path, host, stop) for channel in resolved]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + RELAY_READY_SECONDS
    for worker in workers:
        worker.ready.wait(max(0.0, deadline - time.monotonic()))
    names = ", ".join(c.name for c in config.notify.channels)
    notifier.ready(f"relaying {socket_path} to {names}")
    logger.info("notify.started", socket=socket_path, channels=[c.name for c in config.notify.channels], host=host)
    report = StatusReport(config.notify.state_dir, workers, logger)
    report.write("running")
    tick = notifier.watchdog_interval() or 1.0
    while not stop.wait(min(tick, 1.0)):
        if not any(w.is_alive() for w in workers):
            break
        if reload.is_set():
            reload.clear()
            config = reload_config(Path(ns.config) if ns.config else None, config, workers, logger)
        notifier.watchdog()
        report.write("running")
    notifier.stopping()
    stop.set()
    end = time.monotonic() + STOP_JOIN_SECONDS
    for worker in workers:
        worker.join(max(0.0, end - time.monotonic()))
    failed = any(w.crashed for w in workers)
    report.write("stopped", force=True)
    logger.info("notify.stopped", failed=failed)
    return 1 if failed else 0


def reload_config(path: Path | None, config: Config, workers: list[Worker], logger: Any) -> Config:
    """SIGHUP: take ``web.url`` from the file now; name what else changed (a restart applies it).

    Returns the configuration now in force: the running one with the new ``web.url``."""
    import dataclasses

    from airlock.relay.reload import plan

    try:
        new = load(path)
    except ConfigError as exc:
        logger.error("notify.reload.refused", error=str(exc), kept="the running configuration")
        return config
    change = plan(config, new)
    for worker in workers:
        worker.web_url = change.web_url
    logger.info("notify.reloaded", web_url=change.web_url, needs_restart=list(change.needs_restart))
    if change.needs_restart:
        logger.warning(
            "notify.reload.partial",
            needs_restart=list(change.needs_restart),
            error="a reload applies web.url only: systemctl restart airlock-notify for the rest",
        )
    return dataclasses.replace(config, web=dataclasses.replace(config.web, url=change.web_url))


class StatusReport:
    """``status.json`` for `airlock status` (relay/state.py): on a change, and every heartbeat."""

    def __init__(self, state_dir: Path, workers: list[Worker], logger: Any) -> None:
        self.state_dir, self.workers, self.log = state_dir, workers, logger
        self.started = iso_utc(timespec="seconds")
        self.last: dict[str, Any] | None = None
        self.written = 0.0
        self.broken = False

    def write(self, what: str, *, force: bool = False) -> None:
        body: dict[str, Any] = {
            "pid": os.getpid(),
            "state": what,
            "started": self.started,
            "journal_latest": max((w.latest for w in self.workers), default=0),
            "channels": [w.snapshot() for w in self.workers],
        }
        now = time.time()
        if not force and body == self.last and now - self.written < state.HEARTBEAT_SECONDS:
            return
        try:
            state.write(self.state_dir, body | {"updated": now})
        except OSError as exc:
            if not self.broken:  # once: the relay works on without it
                self.log.warning("notify.status.unwritable", error=f"{self.state_dir}: {exc.strerror}")
            self.broken = True
            return
        self.broken = False
        self.last, self.written = body, now

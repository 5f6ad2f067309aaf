"""airlock-notify: follow the events feed on operator.sock, deliver to channels.

One thread per channel, each with its own durable cursor (`cursor.py`), its
own exponential backoff and its own rate limit, so a receiver that is down
holds back only its own channel.  A worker reads the feed with the cursor-paged
``events`` verb (as `airlock events --follow` does), turns ``approval.pending``
and ``approval.decided`` events into messages (`message.py`), sends each
(`channels.py`) until the receiver takes it, and only then moves its cursor
past the event: at least once, and at most the message in flight is sent
again after a crash (each message carries its event's seq).

The relay's user is an observer (``operators.observers``): it can read the
feed and nothing else.  It has no socket of its own and is not
socket-activated; the package ships its unit disabled.
"""

from __future__ import annotations

import argparse
import collections
import os
import pwd
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from airlock.common import client, log
from airlock.common.config import Config, ConfigError, load
from airlock.common.kinds import NOTICES
from airlock.common.notify import Notifier
from airlock.common.peer import identify, may_decide
from airlock.relay import channels, cursor
from airlock.relay import message as msg

EX_CONFIG = 78
FEED_TIMEOUT_SECONDS = 30.0
PAGE = 256
KNOWN_CAP = 4096  # pending requests remembered for their follow-ups
STOP_JOIN_SECONDS = 20.0


class FeedError(Exception):
    """operator.sock could not be read (not there, refused, or answered an error)."""


def feed_call(socket_path: str, verb: str, args: dict[str, Any]) -> dict[str, Any]:
    try:
        _raw, reply = client.call(socket_path, verb, args, timeout=FEED_TIMEOUT_SECONDS)
    except (client.ClientError, OSError) as exc:
        raise FeedError(str(exc)) from None
    if not reply.get("ok"):
        error = reply.get("error") or {}
        raise FeedError(f"{error.get('code')}: {error.get('message')}")
    data: dict[str, Any] = reply.get("data") or {}
    return data


def user_of(uid: object) -> str:
    if not isinstance(uid, int):
        return ""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


class RateLimit:
    """A token bucket: ``per_minute`` messages a minute, bursts up to that many."""

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(per_minute)
        self.tokens = float(per_minute)
        self.rate = per_minute / 60.0
        self.stamp = time.monotonic()

    def wait(self, stop: threading.Event) -> bool:
        """Take one token, waiting for it; False when stopped meanwhile."""
        while not stop.is_set():
            now = time.monotonic()
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens >= 1:
                self.tokens -= 1
                return True
            stop.wait((1 - self.tokens) / self.rate)
        return False


class Worker(threading.Thread):
    def __init__(
        self, config: Config, channel: dict[str, Any], socket_path: str, host: str, stop: threading.Event
    ) -> None:
        super().__init__(name=f"notify-{channel['name']}", daemon=True)
        self.config = config
        self.channel = channel
        self.socket_path = socket_path
        self.host = host
        self.stop = stop
        self.log = log.get().bind(service="notify", channel=channel["name"], channel_type=channel["type"])
        self.cursor_path = cursor.path_for(config.notify.state_dir, channel["name"])
        self.limit = RateLimit(channel.get("rate_per_minute") or config.notify.rate_per_minute)
        self.ready = threading.Event()
        self.cursor: int | None = None  # the last event handled, durable
        self.fetched = 0  # the last event read from the feed
        self.buffer: collections.deque[dict[str, Any]] = collections.deque()
        self.known: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.reminders: dict[str, dict[str, Any]] = {}
        self.failed_feed = 0
        self.crashed = False

    # --- the feed ---------------------------------------------------------------

    def _feed(self, verb: str, args: dict[str, Any]) -> dict[str, Any] | None:
        try:
            data = feed_call(self.socket_path, verb, args)
        except FeedError as exc:
            self.failed_feed += 1
            delay = min(self.config.notify.backoff_max_seconds, 2.0 ** min(self.failed_feed - 1, 16))
            self.log.warning(
                "notify.feed.failed",
                message_id=NOTICES["notify.feed.failed"],
                error=str(exc),
                socket=self.socket_path,
                retry_in=delay,
            )
            self.stop.wait(delay)
            return None
        self.failed_feed = 0
        return data

    def _start_cursor(self) -> bool:
        saved = cursor.load(self.cursor_path)
        if saved is None:
            # First start: from the newest event on (what was before is history, not news).
            while not self.stop.is_set():
                data = self._feed("events", {"tail": 1})
                if data is not None:
                    saved = int(data.get("latest") or 0)
                    cursor.save(self.cursor_path, saved)
                    self.log.info("notify.cursor.created", seq=saved, path=str(self.cursor_path))
                    break
            if saved is None:
                return False
        else:
            self.log.info("notify.cursor.resumed", seq=saved, path=str(self.cursor_path))
        self.cursor = self.fetched = saved
        return True

    def _fill(self) -> bool:
        """Read the next page after what was read; True when something new came."""
        data = self._feed("events", {"after": self.fetched, "limit": PAGE})
        if data is None:
            return False
        events = [e for e in data.get("events") or [] if isinstance(e, dict) and isinstance(e.get("seq"), int)]
        events = [e for e in events if e["seq"] > self.fetched]
        self.buffer.extend(events)
        if events:
            self.fetched = events[-1]["seq"]
        return bool(events)

    def _advance(self, seq: int) -> None:
        if self.cursor is None or seq > self.cursor:
            cursor.save(self.cursor_path, seq)
            self.cursor = seq

    # --- delivery ---------------------------------------------------------------

    def deliver(self, message: dict[str, Any], *, give_up_at: float | None = None) -> bool:
        """Send until the receiver takes it (True), or the relay stops / ``give_up_at`` passes (False)."""
        attempt = 0
        fields = {"seq": message.get("seq"), "request_id": message.get("request_id"), "message": message["event"]}
        while not self.stop.is_set():
            if give_up_at is not None and time.time() >= give_up_at:
                return False
            if not self.limit.wait(self.stop):
                return False
            attempt += 1
            try:
                note = channels.send(self.channel, message)
            except channels.DeliveryError as exc:
                delay = min(self.config.notify.backoff_max_seconds, 2.0 ** min(attempt - 1, 16))
                self.log.warning(
                    "notify.delivery.failed",
                    message_id=NOTICES["notify.delivery.failed"],
                    error=str(exc),
                    attempt=attempt,
                    retry_in=delay,
                    **fields,
                )
                self.stop.wait(delay)
                continue
            self.log.info(
                "notify.delivery.succeeded",
                message_id=NOTICES["notify.delivery.succeeded"],
                attempts=attempt,
                result=note,
                **fields,
            )
            return True
        return False

    def _remember(self, message: dict[str, Any]) -> None:
        self.known[message["request_id"]] = message
        while len(self.known) > KNOWN_CAP:
            self.known.popitem(last=False)
        if self.config.notify.remind_seconds > 0:
            self.reminders[message["request_id"]] = message

    def _message_of(self, event: dict[str, Any]) -> dict[str, Any] | None:
        kind = event.get("kind")
        if kind == "approval.pending":
            return msg.pending_message(event, self.host, user_of, time.time())
        if kind == "approval.decided":
            request_id = str(event.get("request_id"))
            self.reminders.pop(request_id, None)
            return msg.decided_message(event, self.host, self.known.get(request_id))
        return None

    def _next_message(self) -> tuple[dict[str, Any] | None, int] | None:
        """The next event's message (None for an event that makes none) and its seq; None if nothing is buffered."""
        if not self.buffer:
            return None
        event = self.buffer.popleft()
        return self._message_of(event), event["seq"]

    def _digest(self, first: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """Pending requests that follow ``first`` within notify.digest_seconds, as one message."""
        items, last = [first], int(first["seq"])
        deadline = time.monotonic() + self.config.notify.digest_seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            if not self.buffer and not self._fill():
                self.stop.wait(min(self.config.notify.poll_seconds, max(0.0, deadline - time.monotonic())))
                continue
            event = self.buffer[0]
            if event.get("kind") == "approval.decided" or (
                event.get("kind") == "approval.pending" and len(items) >= 50
            ):
                break  # the follow-up goes after the digest, in order
            self.buffer.popleft()
            last = event["seq"]
            if event.get("kind") == "approval.pending":
                item = msg.pending_message(event, self.host, user_of, time.time())
                items.append(item)
        for item in items:
            self._remember(item)
        return (items[0] if len(items) == 1 else msg.digest(items)), last

    def _remind(self) -> None:
        now = time.time()
        for request_id, message in list(self.reminders.items()):
            expires = msg._parse_time(message.get("expires_at")) or now
            if expires <= now:
                self.reminders.pop(request_id, None)
            elif expires - now <= self.config.notify.remind_seconds:
                self.reminders.pop(request_id, None)
                # Best effort: a reminder is not an event; it is not retried past the request's end.
                self.deliver(msg.reminder(message, now), give_up_at=expires)

    def run(self) -> None:
        try:
            if not self._start_cursor():
                return
            self.ready.set()
            while not self.stop.is_set():
                if not self.buffer and not self._fill():
                    if self.cursor is not None and self.fetched > self.cursor:
                        self._advance(self.fetched)  # events that made no message: passed
                    self._remind()
                    self.stop.wait(self.config.notify.poll_seconds)
                    continue
                nxt = self._next_message()
                if nxt is None:
                    continue
                message, seq = nxt
                if message is None:
                    continue  # the cursor passes it with the next delivery or idle moment
                if message["event"] == "pending":
                    if self.config.notify.digest_seconds > 0:
                        message, seq = self._digest(message)
                    else:
                        self._remember(message)
                if not self.deliver(message):
                    return  # stopping: the cursor stays before this event
                self._advance(seq)
        except cursor.CursorError as exc:
            self.log.error("notify.cursor.unreadable", error=str(exc))
            self.crashed = True
            self.stop.set()
        except Exception as exc:  # a bug must stop the relay (systemd restarts it), not one silent thread
            self.log.error("notify.worker.crashed", error=f"{type(exc).__name__}: {exc}")
            self.crashed = True
            self.stop.set()
            raise
        finally:
            self.ready.set()


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
        resolved = [channels.with_secrets(channel) for channel in config.notify.channels]
    except channels.SecretError as exc:
        logger.error("notify.start.failed", error=str(exc))
        print(f"airlock-notify: {exc}", file=sys.stderr)
        return EX_CONFIG
    socket_path = ns.socket or str(config.socket_path("operator"))
    host = config.notify.host or socket.gethostname()
    notifier = Notifier()
    stop = threading.Event()

    def on_signal(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workers = [Worker(config, channel, socket_path, host, stop) for channel in resolved]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + 60
    for worker in workers:
        worker.ready.wait(max(0.0, deadline - time.monotonic()))
    names = ", ".join(c["name"] for c in config.notify.channels)
    notifier.ready(f"relaying {socket_path} to {names}")
    logger.info("notify.started", socket=socket_path, channels=[c["name"] for c in config.notify.channels], host=host)
    tick = notifier.watchdog_interval() or 1.0
    while not stop.wait(min(tick, 1.0)):
        if not any(w.is_alive() for w in workers):
            break
        notifier.watchdog()
    notifier.stopping()
    stop.set()
    end = time.monotonic() + STOP_JOIN_SECONDS
    for worker in workers:
        worker.join(max(0.0, end - time.monotonic()))
    failed = any(w.crashed for w in workers)
    logger.info("notify.stopped", failed=failed)
    return 1 if failed else 0

"""One channel's worker: its cursor on the events feed, its queue, its deliveries with backoff.

A thread per channel (relay/service.py starts them): it reads the feed from
its durable cursor (`cursor.py`), turns events into messages (`message.py`),
queues them a lane per agent (`queue.py`), sends each with its channel's
`send` until the receiver takes it, and only then moves its cursor past the
event.  A receiver that is down holds back only its own channel.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, TypeVar

from airlock.common import log
from airlock.common.channels.base import Channel, DeliveryError
from airlock.common.codec import iso_utc
from airlock.common.config import Config
from airlock.common.kinds import NOTICES
from airlock.common.wire import operator as op
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Empty, Verb
from airlock.relay import cursor
from airlock.relay import message as msg
from airlock.relay.feed import PAGE, FeedError, feed_call, user_of
from airlock.relay.queue import FairQueue, Item
from airlock.relay.ratelimit import RateLimit

KNOWN_CAP = 4096  # pending requests remembered for their follow-ups

A = TypeVar("A", bound=Message)


FAILING_AFTER_ATTEMPTS = 5  # consecutive failures before a channel is reported failing (~30 s of backoff)
READ_AHEAD = 2048  # messages a channel keeps queued at most; the feed is read no further meanwhile


class Worker(threading.Thread):
    def __init__(self, config: Config, channel: Channel, socket_path: str, host: str, stop: threading.Event) -> None:
        super().__init__(name=f"notify-{channel.name}", daemon=True)
        self.config = config
        self.channel = channel
        self.socket_path = socket_path
        self.host = host
        self.stop = stop
        self.log = log.get().bind(service="notify", channel=channel.name, channel_type=channel.kind)
        self.cursor_path = cursor.path_for(config.notify.state_dir, channel.name)
        self.web_url = config.web.url  # replaced whole by a reload (relay/reload.py); read per message
        self.limit = RateLimit(channel.settings.get("rate_per_minute") or config.notify.rate_per_minute)
        self.ready = threading.Event()
        self.cursor: int | None = None  # every event up to it handled, durable
        self.journal: str | None = None  # the journal the seqs belong to (its first record's hash)
        self.fetched = 0  # the last event read from the feed
        self.latest = 0  # the journal's newest seq, as the feed last said
        self.queue = FairQueue()
        self.open: set[int] = set()  # seqs read and not yet handled (queued or in flight)
        self.done: set[int] = set()  # seqs after the cursor already delivered or dropped
        self.skip: frozenset[int] = frozenset()  # delivered before a restart: not sent again
        self.known: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self.reminders: dict[str, dict[str, Any]] = {}
        self.failed_feed = 0
        self.crashed = False
        self.generation = 0  # counts journals followed: an item of an earlier one is not the cursor's
        self.filled = 0.0  # when the feed was last read
        # What `airlock status` shows (relay/state.py); read by the main thread.
        self.delivered_seq: int | None = None
        self.delivered_at: str | None = None
        self.last_error: str | None = None
        self.last_error_at: str | None = None
        self.failing_since: str | None = None
        self.failures = 0

    def snapshot(self) -> dict[str, Any]:
        behind = max(0, self.latest - self.cursor) if self.cursor is not None else None
        return {
            "name": self.channel.name,
            "type": self.channel.kind,
            "cursor": self.cursor,
            "delivered_seq": self.delivered_seq,
            "delivered_at": self.delivered_at,
            "lag": behind,
            "queued": len(self.queue),
            "last_error": self.last_error,
            "last_error_at": self.last_error_at,
            "failing_since": self.failing_since,
            "failures": self.failures,
        }

    # --- the feed ---------------------------------------------------------------

    def _feed(self, verb: Verb[A, Any], args: A, *, wait: bool = True) -> dict[str, Any] | None:
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
            if wait:
                self.stop.wait(delay)
            return None
        self.failed_feed = 0
        return data

    def _journal_id(self) -> tuple[str | None, int] | None:
        """(the journal's first record's hash or None when it is empty, its newest seq); None: no answer."""
        data = self._feed(op.EVENTS, op.Events(after=0, limit=1))
        if data is None:
            return None
        events = data.get("events") or []
        first = events[0] if events and isinstance(events[0], dict) else {}
        digest = first.get("hash")
        return (digest if isinstance(digest, str) else None), int(data.get("latest") or 0)

    def _start_cursor(self) -> bool:
        saved = cursor.load(self.cursor_path)
        found = None
        while found is None and not self.stop.is_set():
            found = self._journal_id()
        if found is None:
            return False
        journal, latest = found
        self.latest = latest
        if saved is not None and saved.seq <= latest and saved.journal in (None, journal):
            self.log.info("notify.cursor.resumed", seq=saved.seq, path=str(self.cursor_path))
            self.cursor = self.fetched = saved.seq
            self.skip = saved.done
            self.journal = journal
            self.delivered_seq, self.delivered_at = saved.delivered, saved.delivered_at  # same journal: still true
            if saved.journal is None:
                self._save()  # bind it to this journal from now on
            return True
        if saved is not None:
            # Not this journal's cursor (a purge and reinstall, a restored backup): its seqs
            # mean nothing here, and following them would skip this journal's events.
            self.log.warning(
                "notify.cursor.reset",
                message_id=NOTICES["notify.cursor.reset"],
                seq=saved.seq,
                journal=saved.journal,
                current_journal=journal,
                latest=latest,
                path=str(self.cursor_path),
            )
        self._fresh(journal, latest)
        return True

    def _fresh(self, journal: str | None, latest: int) -> None:
        """Start from the newest event: the past is history, not news, except requests still waiting."""
        self.cursor = self.fetched = latest
        self.journal = journal
        self.skip = frozenset()
        self.delivered_seq = self.delivered_at = None  # of a journal that is gone, if any
        self._save()
        self.log.info("notify.cursor.created", seq=latest, path=str(self.cursor_path))
        waiting = self._feed(op.PENDING, Empty(), wait=False) or {}
        for entry in waiting.get("pending") or []:
            request_id = entry.get("request_id") if isinstance(entry, dict) else None
            if not isinstance(request_id, str):
                continue
            page = self._feed(op.EVENTS, op.Events(tail=16, scope={"request_id": request_id}), wait=False) or {}
            for event in page.get("events") or []:
                if (
                    isinstance(event, dict)
                    and event.get("kind") == "approval.pending"
                    and isinstance(event.get("seq"), int)
                    and event["seq"] <= latest
                ):
                    # Below the cursor: sent once now, not tracked by it (a crash before it goes loses it).
                    self._route(event, tracked=False)

    def _save(self) -> None:
        assert self.cursor is not None
        cursor.save(
            self.cursor_path,
            cursor.Cursor(self.cursor, self.journal, frozenset(self.done), self.delivered_seq, self.delivered_at),
        )

    def _fill(self) -> bool:
        """Read the next page after what was read and queue its messages; True when something new came."""
        if len(self.queue) >= READ_AHEAD:
            return False
        if self.queue and time.monotonic() - self.filled < self.config.notify.poll_seconds:
            return False  # work queued: read the feed once a poll, not once a message
        self.filled = time.monotonic()
        data = self._feed(op.EVENTS, op.Events(after=self.fetched, limit=PAGE))
        if data is None:
            return False
        self.latest = int(data.get("latest") or 0)
        if self.latest < self.fetched:
            self._journal_replaced()
            return False
        if self.journal is None and self.latest > 0:
            found = self._journal_id()  # it was empty at start: bind the cursor to it now
            if found is not None and found[0] is not None:
                self.journal = found[0]
                self._save()
        events = [e for e in data.get("events") or [] if isinstance(e, dict) and isinstance(e.get("seq"), int)]
        events = [e for e in events if e["seq"] > self.fetched]
        for event in events:
            self.fetched = event["seq"]
            if event["seq"] in self.skip:
                self.done.add(event["seq"])  # delivered before the restart
                continue
            self._route(event)
        self._advance()
        return bool(events)

    def _journal_replaced(self) -> None:
        """The journal went back behind what was read: a new journal under the running relay."""
        found = self._journal_id()
        if found is None:
            return
        journal, latest = found
        self.log.warning(
            "notify.cursor.reset",
            message_id=NOTICES["notify.cursor.reset"],
            seq=self.cursor,
            journal=self.journal,
            current_journal=journal,
            latest=latest,
            path=str(self.cursor_path),
        )
        self.generation += 1  # what is queued or in flight belongs to the old journal
        for item in self.queue.waiting.values():
            item.superseded = True
        self.queue = FairQueue()
        self.open.clear()
        self.done.clear()
        self.known.clear()
        self.reminders.clear()
        self._fresh(journal, latest)

    def _route(self, event: dict[str, Any], *, tracked: bool = True) -> None:
        """File the event's message in its requester's lane (or settle a waiting one)."""
        seq = int(event["seq"])
        lane = event.get("peer_uid") if isinstance(event.get("peer_uid"), int) else None
        kind = event.get("kind")
        seqs = [seq] if tracked else []
        attached = (event.get("payload") or {}).get("attached_to") or (event.get("payload") or {}).get("decided_with")
        if kind in ("approval.pending", "approval.decided") and attached:
            return  # issue 34: attached to an identical request; its message and outcome speak for both
        if kind in ("approval.pending", "approval.promoted"):  # promoted: its pending record was attached
            message = msg.pending_message(event, self.host, user_of, time.time(), self.web_url)
            self.queue.push(Item(message, seqs, lane, message["request_id"], "pending", generation=self.generation))
            self.open.update(seqs)
            return
        if kind == "policy.rejected":  # issue 44: operators hear that the files on disk were refused
            refused = msg.policy_message(event, self.host)
            if refused is not None:
                self.queue.push(Item(refused, seqs, lane, None, "policy", generation=self.generation))
                self.open.update(seqs)
            return
        if kind == "operator.action":
            ended = msg.grant_message(event, self.host, user_of)
            if ended is not None:  # issue 34: a grant's end is news for the operators who gave it
                self.queue.push(Item(ended, seqs, lane, None, "grant", generation=self.generation))
                self.open.update(seqs)
            return
        if kind != "approval.decided":
            return  # makes no message: handled once read
        outcome = msg.decided_message(event, self.host, None)
        if outcome is None:
            return  # a rule's decision: nobody was asked
        request_id = outcome["request_id"]
        self.reminders.pop(request_id, None)
        withdrawn = (event.get("payload") or {}).get("decision") == "withdrawn"
        waiting = self.queue.settle(request_id, withdrawn)
        if waiting is not None:
            # Settled before operators were told: the outcome takes its place, or, withdrawn, nothing does.
            self.open.difference_update(waiting.seqs)
            self.done.update(waiting.seqs)
            if withdrawn:
                self.done.update(seqs)
                return
        details = waiting.message if waiting is not None else self.known.get(request_id)
        if details is not None:
            outcome = msg.decided_message(event, self.host, details) or outcome
        self.queue.push(Item(outcome, seqs, lane, request_id, "decided", generation=self.generation))
        self.open.update(seqs)

    def _handled(self, item: Item) -> None:
        if item.generation != self.generation:
            return  # read from a journal that is gone: its seqs mean nothing to the cursor now
        self.queue.delivered(item)
        self.open.difference_update(item.seqs)
        self.done.update(item.seqs)
        self._advance()

    def _advance(self) -> None:
        """Move the durable cursor up to the first event not yet handled."""
        if self.cursor is None:
            return
        mark = (min(self.open) - 1) if self.open else self.fetched
        done = {seq for seq in self.done if seq > mark}
        if mark > self.cursor or done != self.done:
            self.cursor = max(self.cursor, mark)
            self.done = done
            self._save()

    # --- delivery ---------------------------------------------------------------

    def deliver(self, message: dict[str, Any], *, give_up_at: float | None = None, item: Item | None = None) -> bool:
        """Send until the receiver takes it (True), or the relay stops, ``give_up_at`` passes or the
        request settles meanwhile (False)."""
        attempt = 0
        fields = {"seq": message.get("seq"), "request_id": message.get("request_id"), "message": message["event"]}
        while not self.stop.is_set():
            if give_up_at is not None and time.time() >= give_up_at:
                return False
            if item is not None and item.superseded:
                return False  # its request settled while it waited for the receiver
            if not self.limit.wait(self.stop):
                return False
            attempt += 1
            try:
                note = self.channel.send(message)
            except DeliveryError as exc:
                delay = min(self.config.notify.backoff_max_seconds, 2.0 ** min(attempt - 1, 16))
                self._failed(str(exc))
                self.log.warning(
                    "notify.delivery.failed",
                    message_id=NOTICES["notify.delivery.failed"],
                    error=str(exc),
                    attempt=attempt,
                    retry_in=delay,
                    **fields,
                )
                end = time.monotonic() + delay
                while not self.stop.is_set() and time.monotonic() < end:
                    if item is not None:
                        # Keep reading meanwhile: a request that settles while its message waits is not retried.
                        self._fill()
                        if item.superseded:
                            break
                    self.stop.wait(min(self.config.notify.poll_seconds, max(0.0, end - time.monotonic())))
                continue
            self._succeeded(message)
            self.log.info(
                "notify.delivery.succeeded",
                message_id=NOTICES["notify.delivery.succeeded"],
                attempts=attempt,
                result=note,
                **fields,
            )
            return True
        return False

    def _failed(self, error: str) -> None:
        now = iso_utc(timespec="seconds")
        self.last_error, self.last_error_at = error, now
        self.failures += 1
        if self.failures == 1:
            self.failing_since = now
        if self.failures == FAILING_AFTER_ATTEMPTS:
            # Not retried silently: once, loudly, and in `airlock status` until it recovers.
            self.log.error(
                "notify.channel.failing",
                message_id=NOTICES["notify.channel.failing"],
                error=error,
                failures=self.failures,
                since=self.failing_since,
            )

    def _succeeded(self, message: dict[str, Any]) -> None:
        if self.failures >= FAILING_AFTER_ATTEMPTS:
            self.log.info("notify.channel.recovered", failures=self.failures, since=self.failing_since)
        self.failures = 0
        self.failing_since = None
        if isinstance(message.get("seq"), int):
            self.delivered_seq = message["seq"]
        self.delivered_at = iso_utc(timespec="seconds")

    def _remember(self, message: dict[str, Any]) -> None:
        self.known[message["request_id"]] = message
        while len(self.known) > KNOWN_CAP:
            self.known.popitem(last=False)
        if self.config.notify.remind_seconds > 0:
            self.reminders[message["request_id"]] = message

    def _digest(self, first: Item) -> list[Item]:
        """Pending requests that come within notify.digest_seconds of ``first``, taken in turn (at most 50)."""
        items = [first]
        deadline = time.monotonic() + self.config.notify.digest_seconds
        while not self.stop.is_set() and time.monotonic() < deadline:
            if not self._fill():
                self.stop.wait(min(self.config.notify.poll_seconds, max(0.0, deadline - time.monotonic())))
        while len(items) < 50:
            more = self.queue.pop(kind="pending")
            if more is None:
                break
            items.append(more)
        return items

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
                self._fill()
                item = self.queue.pop()
                if item is None:
                    self._remind()
                    self.stop.wait(self.config.notify.poll_seconds)
                    continue
                if item.kind == "pending" and self.config.notify.digest_seconds > 0:
                    batch = self._digest(item)
                    batch = [i for i in batch if not i.superseded]
                    if not batch:
                        continue
                    message = batch[0].message if len(batch) == 1 else msg.digest([i.message for i in batch])
                    if not self.deliver(message, item=batch[0] if len(batch) == 1 else None):
                        if self.stop.is_set():
                            return  # stopping: the cursor stays before these events
                    for one in batch:
                        self._remember(one.message)
                        self._handled(one)
                    continue
                if not self.deliver(item.message, item=item) and self.stop.is_set():
                    return  # stopping: the cursor stays before this event
                if item.kind == "pending" and not item.superseded:
                    self._remember(item.message)
                self._handled(item)
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

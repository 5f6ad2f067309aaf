"""The journal's audit verbs for operators: ``verify`` (the chain against anchors) and ``archive``, and retention.

`Auditing` answers them for the journal service (journal/service.py): a
walk of the chain, recorded as a ``chain.verified`` record and anchored at
once when it checked out to the head; the sealed segments and the archive;
the retention rules (journal/retention.py), one run at a time.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from airlock.common import log, validate
from airlock.common.config import Config
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.server import Call
from airlock.common.wire import journal as wire
from airlock.journal import anchors, chain, retention, segments
from airlock.journal.anchoring import Anchoring
from airlock.journal.chain import Anchor, parse_anchor
from airlock.journal.store import Store
from airlock.journal.verification import VERIFIED_KIND


class Auditing:
    def __init__(self, config: Config, store: Store) -> None:
        self.config = config
        self.store = store
        self._retaining = asyncio.Lock()
        self.anchoring: Anchoring | None = None  # set by `build`: a verified point is anchored at once

    def limits(self) -> retention.Limits:
        j = self.config.journal
        return retention.Limits(
            j.retention_max_age, j.retention_max_bytes, j.archive_max_age, j.archive_max_bytes, j.archive_delete_when
        )

    async def retain(self, *, confirmed: bool = False, dry_run: bool = False) -> dict[str, Any]:
        """Apply the retention rules (journal/retention.py) once; one run at a time."""

        async def journal_deletion(payload: dict[str, Any]) -> None:
            event = await self.store.append(writer="journal", kind="segment.deleted", payload=payload)
            if self.anchoring is not None:  # issue 51: only an anchored deletion excuses a missing segment
                await self.anchoring.anchor_at("deleted", (event.seq, event.hash))

        async with self._retaining:
            assert self.store.archive_dir is not None
            report = await retention.apply(
                self.store.path,
                self.store.archive_dir,
                self.limits(),
                time.time(),
                journal_deletion,
                confirmed=confirmed,
                dry_run=dry_run,
            )
        logger = log.get()
        for item in report["archived"]:
            logger.info("journal.segment.archived", segment=item["segment"], file=item["file"], to=item["to"])
        for item in report["deleted"]:
            logger.warning(
                "journal.segment.deleted", segment=item["segment"], last_seq=item["last_seq"], reason=item["reason"]
            )
        if report["kept"] and not dry_run:
            logger.warning(
                "journal.archive.over_limit",
                segments=len(report["kept"]),
                bytes=sum(int(k["bytes"]) for k in report["kept"]),
                why=report["kept"][0]["why"],
            )
        return report

    async def archive(self, call: Call, a: wire.Archive) -> wire.Report:
        """``airlock audit archive``: the sealed segments, the archive, and (``confirm``) deleting what is
        past the archive's limits; ``shipped`` "SEQ:HASH" records what a collector holds (checked here)."""
        confirm, shipped = a.confirm, a.shipped
        if shipped is not None:
            seq_text, _, digest = shipped.partition(":")
            if not seq_text.isdigit() or len(seq_text) > 18 or not chain.is_hash(digest):
                raise validate.bad("shipped", "must be SEQ:HASH (a seq and its 64-hex-digit hash)")
            seq = int(seq_text)
            held = await asyncio.to_thread(self.store.hash_at, seq)
            if held != digest:
                raise AirlockError(
                    ErrorCode.INVALID_ARGUMENTS,
                    f"record {seq} here has another hash (or is not here): the collector does not hold this chain",
                    {"field": "shipped"},
                )
            await asyncio.to_thread(retention.write_shipped, self.store.path, seq, digest)
        if confirm and self.config.journal.archive_delete_when != "confirmed":
            raise validate.bad("confirm", "journal.archive_delete_when is not 'confirmed'")
        report = await self.retain(confirmed=confirm, dry_run=not confirm and shipped is None)
        sealed = await asyncio.to_thread(self.store.sealed)
        live_dir = segments.segments_dir(self.store.path)
        return wire.Report(
            report
            | {
                "segments": [s.to_dict() for s in sealed if s.path.parent == live_dir],
                "archive": [s.to_dict() for s in sealed if s.path.parent != live_dir],
                "archive_dir": str(self.store.archive_dir),
                "shipped": retention.read_shipped(self.store.path),
            }
        )

    async def verify(self, call: Call, a: wire.Verify) -> wire.Report:
        """The chain, and the database against anchors: those given and (``own_anchors``) the journal's file.

        ``full``: also every sealed segment, each on its own and linked into one chain (journal/segments.py).
        """
        result = await self._verify(a)
        if a.full:
            given = _anchor_args(a.anchors)
            if a.own_anchors:
                given += (await asyncio.to_thread(anchors.read_file, anchors.path_beside(self.store.path)))[0]
            full = await asyncio.to_thread(self.store.verify_full, given)
            result["full"] = full
            if not full["ok"]:
                result |= {"ok": False, "first_bad_seq": full["first_bad_seq"], "reason": full["reason"]}
        return wire.Report(result)

    async def _verify(self, a: wire.Verify) -> dict[str, Any]:
        given = _anchor_args(a.anchors)
        own = a.own_anchors
        if own:
            found, unreadable = await asyncio.to_thread(anchors.read_file, anchors.path_beside(self.store.path))
            given += found
        check_chain = a.chain
        result = await asyncio.to_thread(
            self.store.audit,
            given,
            from_seq=a.from_seq,
            anchor=a.anchor,
            check_chain=check_chain,
            incremental=not a.full,
        )
        if check_chain and result["ok"]:
            result["recorded"] = await self._record_verified(result)
        if own:
            result["anchors"] |= {"file": str(anchors.path_beside(self.store.path)), "unreadable": unreadable}
        # Whether this journal's anchors also go to journald (it runs under systemd).
        target = self.config.log.target
        result["anchors_in_journald"] = target == "journal" or (target == "auto" and log.stderr_is_journal(os.environ))
        return result

    async def _record_verified(self, result: dict[str, Any]) -> dict[str, Any] | None:
        """After a walk that checked out to the head: a `verification.VERIFIED_KIND` record naming that head, anchored
        at once (the next verify starts there), or None when there is nothing new to record."""
        walked = result.get("chain") or {}
        seq, digest = walked.get("head_seq"), walked.get("head_hash")
        point = result.get("verified") or {}
        if self.store.refusal is not None or not seq or seq != result.get("head_seq"):
            return None
        if result.get("mode") not in ("full", "incremental"):
            return None  # a walk from --from vouches for its part only: it is no start point for the next
        if point.get("record_seq") == seq:
            return None  # nothing since the last verified point but its own record
        event = await self.store.append(
            writer="journal",
            kind=VERIFIED_KIND,
            payload={
                "seq": seq,
                "hash": digest,
                "checked": walked.get("checked"),
                "mode": result.get("mode"),
                "from_seq": point.get("seq", 1),
            },
        )
        if self.anchoring is not None:
            await self.anchoring.anchor_at("verified", (event.seq, event.hash))
        return {"seq": event.seq, "hash": event.hash}


def _anchor_args(value: tuple[Any, ...] | None) -> list[Anchor]:
    try:
        return [parse_anchor(item) for item in value or ()]
    except ValueError as exc:
        raise validate.bad("anchors", str(exc)) from None

"""What the journal's one queue carries: appends, settled operations, request-ID claims and syncs.

Each item holds what its caller asked for and the future the caller waits on
(none for a deferred append); journal/appends.py builds them and
journal/writer.py commits them in batches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.operations import Settled
from airlock.journal.records import Event


@dataclass(slots=True)
class _Append:
    time: str
    kind: str
    request_id: str | None
    operation_id: str | None
    peer_uid: int | None
    session: str | None
    writer: str
    payload: dict[str, Any]
    payload_json: str
    # None for a deferred append: nobody waits for its commit.
    future: asyncio.Future[Event | None] | None
    # Appended only if this claim wins, in the same transaction (intake's
    # replay gate and its request.received cost one commit, not two).
    claim: _Claim | None = None
    mark: int = 0  # its place in the queue (see "Deferred appends")
    after: tuple[int, ...] = ()  # earlier marks that must be committed first


@dataclass(slots=True)
class _Settle:
    entry: Settled
    future: asyncio.Future[None]
    after: tuple[int, ...] = ()


@dataclass(slots=True)
class _Sync:
    """Resolved once everything queued before it has been committed or failed."""

    future: asyncio.Future[None]


@dataclass(slots=True)
class _Claim:
    key: str
    now: float
    window: float
    future: asyncio.Future[bool]


_Work = _Append | _Settle | _Claim | _Sync


def _deferred(work: _Work | None) -> bool:
    return isinstance(work, _Append) and work.future is None


def _lost() -> AirlockError:
    return AirlockError(
        ErrorCode.AUDIT_UNAVAILABLE,
        "an earlier record of this request was not committed (the journal restarted or could not write it)",
    )


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

"""What operators are told of a pending request: its ``approval.pending`` record, and its promotion.

Identical requests of one agent pending at once are one question (issue 34):
the later ones are attached to the first and say nothing to operators.  When
the first leaves undecided (withdrawn, expired, cancelled alone) the oldest
attached one becomes a question of its own.  Its ``approval.pending`` was
journaled attached, so the relay, which reads the journal, skipped it: the
promotion is journaled as ``approval.promoted`` with everything a pending
message needs, and the notify hook is called for it, so operators hear of it
as of any new question instead of finding it only in ``airlock pending``.
"""

from __future__ import annotations

import time
from typing import Any

from airlock.approval import fileop_review, hook
from airlock.approval.asked import journaled_request
from airlock.approval.pending import Pending
from airlock.approval.table import PendingTable
from airlock.approval.votes import Votes
from airlock.common.audit import Audit, Ids
from airlock.common.errors import AirlockError


def pending_payload(entry: Pending, timeout: float, votes: Votes) -> dict[str, Any]:
    """What ``approval.pending`` (and ``approval.promoted``) store of a request waiting for people.

    The diff is file content: operators get it from ``pending``, never from the journal (issue 39).
    """
    return {
        "rule": entry.rule,
        "policy": entry.decision.to_dict(),
        "timeout_seconds": timeout,
        "request": journaled_request(fileop_review.without_content(entry.request)),
    } | votes.pending_extra(entry)


async def announce(
    audit: Audit,
    notifier: hook.NotifyCommand,
    votes: Votes,
    log: Any,
    promoted: Pending,
    leader: Pending,
    session: str | None,
) -> None:
    """``promoted`` was attached to ``leader``, which left undecided: tell operators of it as of a new question."""
    if not PendingTable.is_open(promoted):
        return  # decided (or withdrawn) before this ran: a pending message now would be a stale one
    now = time.time()
    log.info(
        "approval.pending.promoted",
        request_id=promoted.request_id,
        was_attached_to=leader.request_id,
        peer_uid=promoted.peer.uid,
    )
    ids = Ids(promoted.request_id, promoted.operation_id, promoted.peer.uid, session)
    payload = pending_payload(promoted, round(max(0.0, promoted.expires - now), 3), votes)
    try:
        await audit.record("approval.promoted", ids, payload=payload | {"was_attached_to": leader.request_id})
    except AirlockError as exc:  # the hook below still calls; `airlock pending` lists it either way
        log.warning("approval.pending.promotion_unrecorded", request_id=promoted.request_id, error=exc.message)
    notifier.pending(fileop_review.for_observer(promoted.to_dict(now)) | {"event": "pending"})

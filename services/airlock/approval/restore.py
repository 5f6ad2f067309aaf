"""approval's own records read back at start: the hold, the grants with their uses, and people's denials.

The journal serves a generic read (``records``: a service's records by kind
and payload fields, `wire.journal.Records`) and knows nothing of what a hold
or a grant is; approval interprets its own ``operator.action`` records here.
Only records written by approval (or by ``operator``, the writer of older
journals' operator actions) count, so nothing an agent can put in an ID, a
session or a payload of its own can stand in for one.  After a rollover the
live segment's opening record carries what these queries found when the
segments before were sealed (`wire.journal.CARRIED`, journal/rollover.py
`carry`): it comes first.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.wire.journal import (
    DENIAL_RECORDS,
    GRANT_RECORDS,
    HOLD_RECORDS,
    MAX_RECORDS,
    RECORDS,
    Found,
    Records,
)
from airlock.common.wire.verb import Stub

# Pages of grant uses read at start (each MAX_RECORDS records): a bound on the wait, far above any real count.
MAX_USE_PAGES: Final = 64

HOLD_QUERY: Final = HOLD_RECORDS
GRANTS_QUERY: Final = GRANT_RECORDS


def _carried(found: Found, name: str) -> list[dict[str, Any]]:
    """What the live segment's opening record carried under ``name`` (`wire.journal.CARRIED`), oldest first."""
    items = (found.carried or {}).get(name)
    if isinstance(items, dict):
        items = [items]
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


def _hold(record: dict[str, Any]) -> dict[str, Any]:
    if "payload" not in record:  # an older journal's opening record carried approval's reading of it
        return record
    payload = record["payload"] if isinstance(record.get("payload"), dict) else {}
    return {
        "seq": record.get("seq"),
        "time": record.get("time"),
        "peer_uid": record.get("peer_uid"),
        "action": payload.get("action"),
        "operator": payload.get("operator"),
        "reason": payload.get("reason"),
        "since": payload.get("since"),
    }


def hold_from(found: Found) -> dict[str, Any] | None:
    """The newest hold or release (`HOLD_QUERY`'s answer, or what the live segment carried); None: never held."""
    items = [*_carried(found, "hold"), *found.records]
    return _hold(items[-1]) if items else None


def _grant(record: dict[str, Any]) -> dict[str, Any]:
    if "payload" not in record:  # an older journal's opening record carried approval's reading of it
        return record
    payload = record["payload"] if isinstance(record.get("payload"), dict) else {}
    return {
        "seq": record.get("seq"),
        "action": payload.get("action"),
        "grant_id": payload.get("grant_id"),
        "grant": payload.get("grant"),
    }


def grants_from(found: Found, limit: int = MAX_RECORDS) -> list[dict[str, Any]]:
    """Grant records (`GRANTS_QUERY`'s answer), oldest first: those carried over, then the live ones."""
    return [_grant(r) for r in [*_carried(found, "grants"), *found.records][-limit:]]


def limited_grants(records: list[dict[str, Any]]) -> dict[str, int]:
    """Issue 34: the live grants with a number of uses, each with the seq it was made at."""
    ended = {r.get("grant_id") for r in records if r.get("action") != "grant"}
    return {
        str(r["grant"]["grant_id"]): int(r["seq"])
        for r in records
        if r.get("action") == "grant"
        and isinstance(r.get("grant"), dict)
        and r["grant"].get("uses") is not None
        and r["grant"].get("grant_id") not in ended
    }


def uses_query(since_seq: int) -> Records:
    """approval's decisions by a grant after ``since_seq``, first first, only their grant IDs."""
    return Records(
        writers=("approval",),
        kinds=("approval.decided",),
        fields={"by": "grant"},
        since_seq=since_seq,
        newest=False,
        limit=MAX_RECORDS,
        pick=("grant_id",),
    )


def uses_from(limited: dict[str, int], decided: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each use of a limited grant (a decision by it after it was made), as a ``grant.used`` record."""
    out = []
    for record in decided:
        grant_id = (record.get("payload") or {}).get("grant_id")
        if grant_id in limited and int(record["seq"]) > limited[grant_id]:
            out.append({"seq": record["seq"], "action": "grant.used", "grant_id": grant_id, "grant": None})
    return out


async def latest_hold(journal: Stub, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109  bounds the call
    """The newest hold or release in the journal, or None (never held)."""
    return hold_from(await journal.call(RECORDS, HOLD_QUERY, timeout=timeout))


async def grant_records(journal: Stub, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109  bounds each call
    """The newest grant records (made, revoked, expired, exhausted) and each use of a grant with a number of
    uses (so a restart gives no use back), oldest first: approval rebuilds its grants from them."""
    records = grants_from(await journal.call(RECORDS, GRANTS_QUERY, timeout=timeout))
    limited = limited_grants(records)
    if limited:
        since = min(limited.values())
        for _ in range(MAX_USE_PAGES):
            page = await journal.call(RECORDS, uses_query(since), timeout=timeout)
            records += uses_from(limited, list(page.records))
            if len(page.records) < MAX_RECORDS:
                break
            since = int(page.records[-1]["seq"])
        else:
            raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "too many uses of limited grants to read at start")
    return sorted(records, key=lambda r: int(r["seq"]))


def denials_query(since_seq: int | None) -> Records:
    """People's denials (`wire.journal.DENIAL_RECORDS`) after ``since_seq``, first first."""
    return dataclasses.replace(DENIAL_RECORDS, since_seq=since_seq, newest=False, limit=MAX_RECORDS)


def _denial(record: dict[str, Any]) -> dict[str, Any] | None:
    payload = record.get("payload")
    denial = payload.get("denial") if isinstance(payload, dict) else None
    return denial if isinstance(denial, dict) else None


async def denial_records(journal: Stub, timeout: float) -> list[dict[str, Any]]:  # noqa: ASYNC109  bounds each call
    """Every denial a person made that the journal holds (issue 45), oldest first: what the live segment
    carried, then the live ones, page by page (never only the newest few), as journaled (``denial``)."""
    page = await journal.call(RECORDS, denials_query(None), timeout=timeout)
    records = [*_carried(page, "denials"), *page.records]
    for _ in range(MAX_USE_PAGES):
        if len(page.records) < MAX_RECORDS:
            return [d for d in map(_denial, records) if d is not None]
        page = await journal.call(RECORDS, denials_query(int(page.records[-1]["seq"])), timeout=timeout)
        records += page.records
    raise AirlockError(ErrorCode.AUDIT_UNAVAILABLE, "too many denials to read at start")

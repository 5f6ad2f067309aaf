"""Exact references (issue 27): which pending request an operator's command names.

``approve``, ``deny``, ``statement`` and a signature act only on the exact ID
of a request pending *now* (`exact`): never a prefix, never an operation ID,
never a request that is no longer pending.  Request IDs are each agent's
own: when agents share an ID, ``AGENT/ID`` or ``expect`` names one, and a
bare ID is refused with the owners (`named`).  A command that carries
``expect`` (every approve line airlock prints or sends: ``airlock approve ID
--expect DIGEST``) acts only if the request pending under that ID is the one
the line was made for (`mismatch`): `Pending.expect` is a short digest of the
request's allow statement, which holds the ticket binding and a nonce fresh
for each pending request, so an ID withdrawn and asked again, with another
command or the same one, has another digest.

A prefix is accepted only where a person types and reads back what it found:
`airlock show` (and so `airlock approve`/`deny` on a terminal, which show the
request and ask before acting on its exact ID and digest).  `by_prefix`
matches only requests pending now, never an operation ID or a settled
request, needs exactly one match, and refuses a prefix that also named a
request settled within the last `window` seconds: what the person read may
have been that one.  Only when no pending request starts so does `show` look
for a settled one in the journal (approval/lookup.py `prefixed`): reading, never deciding.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from airlock.approval.pending import EXPECT_HEX, Pending
from airlock.common import validate
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import uid_of

MIN_WINDOW: Final = 300.0  # settled IDs are remembered at least this long (or the approval timeout)
_EXPECT = re.compile(f"[0-9a-f]{{{EXPECT_HEX}}}")


def window(timeout_seconds: float) -> float:
    return max(MIN_WINDOW, timeout_seconds)


def named(ref: str, pending: Iterable[Pending], expect: str | None = None) -> Pending | None:
    """The request pending now that ``ref`` names exactly, or None if none.

    ``ref`` is a whole request ID, or ``AGENT/ID`` (the agent by user name or
    uid).  Request IDs are each agent's own (approval keys pending requests by
    (uid, ID)), so two agents may have one ID pending at once: then ``AGENT/ID``
    or ``expect`` (the digest the request's approve line carries) says which,
    and a bare ID without either is ``conflict``, naming the owners.
    """
    pending = list(pending)
    found = [p for p in pending if p.request_id == ref]
    if not found and "/" in ref:
        owner, _, request_id = ref.partition("/")
        found = [p for p in pending if p.request_id == request_id and owner in (p.peer.user, str(p.peer.uid))]
    if len(found) > 1 and expect is not None:
        # A digest no one has falls through to the conflict: `mismatch` could not say which one changed.
        found = [p for p in found if p.expect == expect] or found
    if len(found) > 1:
        owners = sorted(found, key=lambda p: (p.peer.uid, p.expect))
        raise AirlockError(
            ErrorCode.CONFLICT,
            f"request ID {ref!r} is pending for {len(found)} agents ("
            + ", ".join(f"{p.peer.user} uid {p.peer.uid}" for p in owners)
            + "); name one as AGENT/ID: "
            + ", ".join(f"{p.peer.user}/{p.request_id}" for p in owners)
            + " (or give the --expect its approve line carries)",
            {
                "owners": [{"user": p.peer.user, "uid": p.peer.uid, "expect": p.expect} for p in owners],
                "references": [f"{p.peer.user}/{p.request_id}" for p in owners],
                "expect": [p.expect for p in owners],
            },
        )
    return found[0] if found else None


def exact(ref: str, pending: Iterable[Pending], expect: str | None = None) -> Pending:
    """The request pending now under exactly ``ref`` (`named`: its ID or ``AGENT/ID``); ``not_found`` otherwise."""
    found = named(ref, pending, expect)
    if found is None:
        raise AirlockError(
            ErrorCode.NOT_FOUND,
            f"no request {ref!r} is pending (give the whole request ID, as `airlock pending` shows it)",
        )
    return found


def by_prefix(ref: str, pending: Iterable[Pending], settled: set[str], unsure: bool) -> Pending:
    """The one pending request whose ID starts with ``ref``, typed by a person.

    ``settled``: request IDs settled within the window; ``unsure``: some may be
    missing from it (then no prefix is taken).
    """
    found = [p for p in pending if p.request_id.startswith(ref)]
    if not found:
        raise AirlockError(ErrorCode.NOT_FOUND, f"no request or operation {ref!r}, and no pending request starts so")
    if len(found) > 1 and len({p.request_id for p in found}) == 1:
        named(found[0].request_id, found)  # one ID several agents have pending: refused with the owners
    if len(found) > 1:
        raise AirlockError(
            ErrorCode.CONFLICT,
            f"{ref!r} starts {len(found)} pending requests; give more of the ID",
            {"matches": sorted(p.request_id for p in found)[:16]},
        )
    earlier = sorted(r for r in settled if r.startswith(ref))
    if earlier or unsure:
        raise AirlockError(
            ErrorCode.CONFLICT,
            f"{ref!r} also named {earlier[0]!r}, which is no longer pending; give the whole ID"
            if earlier
            else "too many requests settled lately to be sure what a prefix named; give the whole ID",
            {"matches": [found[0].request_id], "settled": earlier[:16]},
        )
    return found[0]


def expected(args: dict[str, Any]) -> str | None:
    """The ``expect`` argument, checked: None or EXPECT_HEX lowercase hex digits."""
    value = args.get("expect")
    if value is None:
        return None
    text = validate.text("expect", value, max_len=64, allow_empty=False)
    if not _EXPECT.fullmatch(text):
        raise validate.bad("expect", f"must be the {EXPECT_HEX} hex digits an approve line carries")
    return text


def mismatch(entry: Pending, given: str | None) -> AirlockError | None:
    """``request_changed`` when ``given`` is not the digest of the request pending now under its ID."""
    if given is None or given == entry.expect:
        return None
    return AirlockError(
        ErrorCode.REQUEST_CHANGED,
        f"request {entry.request_id!r} is not the one this line was made for (--expect {given}, now "
        f"{entry.expect}): it was asked again since; read it with `airlock show {entry.request_id}` and decide again",
        {"request_id": entry.request_id, "expected": given, "pending": entry.expect},
    )


def agent_uid(owner: str) -> int | None:
    """The uid an ``AGENT/ID`` reference's agent part names (a user name or uid); None if no such user."""
    return int(owner) if owner.isdigit() else uid_of(owner)


def belongs_to(event: dict[str, Any], uid: int) -> bool:
    """Whether a journal event belongs to agent ``uid``'s request: an operator's action names the
    agent it acted for (``agent_uid``); every other record of a request carries the agent's uid."""
    if event.get("kind") == "operator.action":
        payload = event.get("payload")
        agent = payload.get("agent_uid") if isinstance(payload, dict) else None
        return agent is None or agent == uid  # older records name no agent: kept
    return event.get("peer_uid") in (None, uid)

"""Exact references (issue 27): which pending request an operator's command names.

``approve``, ``deny``, ``statement`` and a signature act only on the exact ID
of a request pending *now* (`exact`): never a prefix, never an operation ID,
never a request that is no longer pending.  A command that carries
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
have been that one.

Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from airlock.approval.pending import EXPECT_HEX, Pending
from airlock.common import validate
from airlock.common.errors import AirlockError, ErrorCode

MIN_WINDOW: Final = 300.0  # settled IDs are remembered at least this long (or the approval timeout)
_EXPECT = re.compile(f"[0-9a-f]{{{EXPECT_HEX}}}")


def window(timeout_seconds: float) -> float:
    return max(MIN_WINDOW, timeout_seconds)


def exact(ref: str, pending: Iterable[Pending], expect: str | None = None) -> Pending:
    """The request pending now under exactly ``ref``; ``not_found`` otherwise.

    Request IDs are each agent's own, so two agents may have one ID pending at
    once: then ``expect`` says which, and without it the answer is ``conflict``.
    """
    found = [p for p in pending if p.request_id == ref]
    if len(found) > 1 and expect is not None:
        found = [p for p in found if p.expect == expect] or found
    if not found:
        raise AirlockError(
            ErrorCode.NOT_FOUND,
            f"no request {ref!r} is pending (give the whole request ID, as `airlock pending` shows it)",
        )
    if len(found) > 1:
        raise AirlockError(
            ErrorCode.CONFLICT,
            f"{len(found)} requests {ref!r} are pending (from different agents); "
            "give --expect from `airlock pending` to say which",
            {"expect": sorted(p.expect for p in found)},
        )
    return found[0]


def by_prefix(ref: str, pending: Iterable[Pending], settled: set[str], unsure: bool) -> Pending:
    """The one pending request whose ID starts with ``ref``, typed by a person.

    ``settled``: request IDs settled within the window; ``unsure``: some may be
    missing from it (then no prefix is taken).
    """
    found = [p for p in pending if p.request_id.startswith(ref)]
    if not found:
        raise AirlockError(ErrorCode.NOT_FOUND, f"no request or operation {ref!r}, and no pending request starts so")
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

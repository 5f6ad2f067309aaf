"""How a person names a pending request and decides it, on every door that lets them (`wire.operator`, `wire.passkey`).

A request is named exactly (``id``: its whole ID or ``AGENT/ID``) and, from
an approve line, by what it was when shown (``expect``); a decision is allow
or deny, with a reason, and an allow may ask for a grant (its scope and
bounds here; its length against ``approval.max_grant_seconds``, approval's).

Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from airlock.common import validate
from airlock.common.wire.message import Public

REASON_MAX = 4096  # a person's reason, journaled with what it explains
REF_MAX = 256  # a request or operation ID, or AGENT/ID (validate.REQUEST_ID_MAX and an agent's name)
DECISIONS: Final = ("allow", "deny")  # what a statement says and a signature or a passkey signs
GRANT_SCOPES: Final = ("command", "rule")  # a grant covers the same command again, or its rule's
GRANT_MAX_USES: Final = 10_000
EXPECT_HEX = 12  # 48 bits of the request's digest: an agent cannot make two pending requests share one
_EXPECT = re.compile(f"[0-9a-f]{{{EXPECT_HEX}}}")


def reason(value: str | None, max_len: int = REASON_MAX) -> None:
    validate.text("reason", value or "", max_len=max_len)


def ref(name: str, value: str) -> None:
    validate.text(name, value, max_len=REF_MAX, allow_empty=False)


def expect(value: str | None) -> None:
    if value is not None:
        validate.text("expect", value, max_len=64, allow_empty=False)
        if not _EXPECT.fullmatch(value):
            raise validate.bad("expect", f"must be the {EXPECT_HEX} hex digits an approve line carries")


@dataclass(frozen=True)
class Pick(Public):
    """A pending request named exactly (``id``, or ``AGENT/ID``), as an approve line names it."""

    id: str  # the whole ID or AGENT/ID: approval's pending table finds it (never a prefix)
    expect: str | None = None

    def check(self) -> None:
        expect(self.expect)

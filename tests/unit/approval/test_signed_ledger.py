"""The ledger's view per agent and the per-uid limit on refused signatures (issue 27)."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlock.approval.signed import Ledger, RefusalLimit
from airlock.approval.signers import Signers
from airlock.common.errors import AirlockError, ErrorCode


def test_refusals_are_limited_per_uid_within_a_sliding_window() -> None:
    limit = RefusalLimit(limit=3, window=60.0)
    for t in range(3):
        limit.check(1001, now=float(t))
        limit.refused(1001, now=float(t))
    with pytest.raises(AirlockError) as info:
        limit.check(1001, now=10.0)
    assert info.value.code is ErrorCode.RATE_LIMITED and info.value.details["retry_after_seconds"] == 50.0
    limit.check(1002, now=10.0)  # another uid is not limited by the first one's refusals
    limit.check(1001, now=60.5)  # the oldest refusal left the window
    limit.refused(1001, now=60.5)
    with pytest.raises(AirlockError):
        limit.check(1001, now=60.9)  # 1.0, 2.0 and 60.5 are within the window


def test_a_quiet_uid_is_forgotten() -> None:
    limit = RefusalLimit(limit=1, window=1.0)
    limit.refused(7, now=0.0)
    limit.check(7, now=5.0)
    assert 7 not in limit._times


def test_a_settled_request_is_found_only_for_its_owner() -> None:
    ledger = Ledger(Signers(Path("/nonexistent/allowed_signers")))
    mine = ledger.publish("deploy-1", {}, uid=1001)
    theirs = ledger.publish("deploy-1", {}, uid=1002)
    ledger.settle(mine, "decided")
    ledger.settle(theirs, "expired")
    assert ledger.latest("deploy-1", 1001) is mine
    assert ledger.latest("deploy-1", 1002) is theirs
    assert ledger.latest("deploy-1", 1003) is None
    assert ledger.latest("deploy-1") is theirs  # an operator sees the newest, whoever's

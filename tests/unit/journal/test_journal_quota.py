"""Each agent's share of the journal's bytes (journal/quota.py)."""

from __future__ import annotations

import pytest

from airlock.common.errors import AirlockError, ErrorCode
from airlock.journal.quota import RECORD_OVERHEAD, JournalQuota


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_agent_in_debt_is_refused_until_it_is_paid_back_and_others_are_not() -> None:
    clock = Clock()
    quota = JournalQuota(rate=1000, burst=10_000, clock=clock)
    quota.admit(1)
    quota.charge(1, 20_000 - RECORD_OVERHEAD)  # an admitted request may go over: never cut short
    with pytest.raises(AirlockError) as refused:
        quota.admit(1)
    assert refused.value.code is ErrorCode.RATE_LIMITED
    assert refused.value.details["retry_after_seconds"] == 10.0
    assert quota.newly_limited  # the first refusal of the spell is the one logged
    with pytest.raises(AirlockError):
        quota.admit(1)
    assert not quota.newly_limited
    quota.admit(2)  # another agent's bucket is its own
    clock.now += 10.5
    quota.admit(1)  # paid back


def test_a_zero_rate_is_no_quota_and_records_without_an_agent_cost_nothing() -> None:
    clock = Clock()
    off = JournalQuota(rate=0, burst=1, clock=clock)
    off.charge(1, 10**9)
    off.admit(1)
    on = JournalQuota(rate=1, burst=1, clock=clock)
    on.charge(None, 10**9)
    on.admit(None)

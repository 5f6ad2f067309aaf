"""approval/logins.py: sign-in challenges bound to a browser, rated, never evicted for another's (issue 46)."""

from __future__ import annotations

import pytest

from airlock.approval import logins
from airlock.approval.logins import Logins
from airlock.common.errors import AirlockError, ErrorCode


def test_a_challenge_is_spent_once_and_only_by_the_browser_that_asked() -> None:
    table = Logins()
    cid, challenge = table.begin("alice-browser", 0.0)
    assert table.finish(cid, "mallory-browser", 1.0) is None  # another browser: refused, not spent
    assert table.finish(cid, "alice-browser", 1.0) == challenge
    assert table.finish(cid, "alice-browser", 1.0) is None  # once


def test_a_browser_holds_one_challenge_and_a_new_begin_replaces_its_own() -> None:
    table = Logins()
    first, _ = table.begin("b", 0.0)
    second, challenge = table.begin("b", 1.0)
    assert len(table) == 1 and table.finish(first, "b", 2.0) is None and table.finish(second, "b", 2.0) == challenge


def test_the_per_browser_and_global_rates() -> None:
    table = Logins()
    for i in range(logins.PER_CLIENT):
        table.begin("flooder", i * 0.01)
    with pytest.raises(AirlockError) as refused:
        table.begin("flooder", 1.0)
    assert refused.value.code is ErrorCode.RATE_LIMITED
    table.begin("flooder", logins.WINDOW + 0.5)  # a minute later it may again
    table = Logins()
    for i in range(logins.GLOBAL):
        table.begin(f"fresh-{i}", 0.0)
    with pytest.raises(AirlockError) as refused:
        table.begin("operator", 0.5)
    assert refused.value.code is ErrorCode.RATE_LIMITED


def test_a_full_table_refuses_new_begins_and_never_evicts_an_open_challenge() -> None:
    table = Logins()
    cid, challenge = table.begin("operator", 0.0)
    now = 0.0
    for i in range(logins.MAX_OUTSTANDING - 1):
        now = (i // (logins.GLOBAL - 1)) * (logins.WINDOW + 0.1)  # under the global rate, inside the expiry
        table.begin(f"fresh-{i}", now)
    with pytest.raises(AirlockError) as refused:
        table.begin("another", now)
    assert refused.value.code is ErrorCode.BUSY
    assert table.finish(cid, "operator", now) == challenge


def test_an_expired_challenge_is_refused() -> None:
    table = Logins()
    cid, _ = table.begin("b", 0.0)
    assert table.finish(cid, "b", logins.LOGIN_SECONDS + 1) is None

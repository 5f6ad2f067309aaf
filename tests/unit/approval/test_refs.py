"""Exact references (issue 27): which pending request an operator's command names, and --expect."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from airlock.approval import refs
from airlock.approval.pending import Pending
from airlock.approval.rules import Decision
from airlock.approval.signed import Published
from airlock.approval.statement import Statement
from airlock.common.errors import AirlockError, ErrorCode
from airlock.common.peer import Peer

PEER = Peer(pid=1, uid=1000, gid=1000, user="agent", group_ids=(1000,), groups=frozenset({"agent"}))


def _pending(request_id: str, nonce: str = "0" * 32, command: str = "id -u", peer: Peer = PEER) -> Pending:
    loop = asyncio.new_event_loop()
    entry = Pending(
        request_id=request_id,
        operation_id=f"op-{request_id}",
        peer=peer,
        request={},
        decision=Decision("ask", "default", ()),
        digest="d" * 64,
        bound={},
        created=0.0,
        expires=60.0,
    )
    loop.close()
    statement: dict[str, Any] = {
        "host": "h",
        "request": request_id,
        "binding": "b" * 64,
        "expires": 60,
        "nonce": nonce,
        "requester": "agent (uid 1000)",
        "run_as": "root (uid 0)",
        "command": command,
        "reason": "",
    }
    entry.published = Published(request_id, {d: Statement(decision=d, **statement) for d in ("allow", "deny")})
    return entry


def test_only_the_whole_id_of_a_pending_request_is_found() -> None:
    pending = [_pending("deploy-1x")]
    assert refs.exact("deploy-1x", pending) is pending[0]
    for ref in ("deploy-1", "op-deploy-1x", "deploy-1x "):
        with pytest.raises(AirlockError) as err:
            refs.exact(ref, pending)
        assert err.value.code is ErrorCode.NOT_FOUND


def test_a_typed_prefix_finds_one_pending_request() -> None:
    pending = [_pending("deploy-abc"), _pending("build-123")]
    assert refs.by_prefix("dep", pending, set(), False).request_id == "deploy-abc"
    with pytest.raises(AirlockError) as err:
        refs.by_prefix("op-", pending, set(), False)  # never an operation ID
    assert err.value.code is ErrorCode.NOT_FOUND
    with pytest.raises(AirlockError) as err:
        refs.by_prefix("", [*pending, _pending("deploy-abd")], set(), False)
    assert err.value.code is ErrorCode.CONFLICT


def test_a_prefix_that_named_a_request_settled_lately_is_refused() -> None:
    pending = [_pending("deploy-1x")]
    with pytest.raises(AirlockError) as err:
        refs.by_prefix("deploy-1", pending, {"deploy-1"}, False)
    assert err.value.code is ErrorCode.CONFLICT and err.value.details["settled"] == ["deploy-1"]
    with pytest.raises(AirlockError) as err:
        refs.by_prefix("deploy-1", pending, set(), True)  # the memory overflowed: no prefix at all
    assert err.value.code is ErrorCode.CONFLICT
    assert refs.by_prefix("deploy-1", pending, {"build-7"}, False).request_id == "deploy-1x"


def test_expect_is_the_pending_requests_own_and_changes_when_it_is_asked_again() -> None:
    first = _pending("deploy-1", nonce="1" * 32)
    again = _pending("deploy-1", nonce="2" * 32)  # the same ID and command, asked again: a fresh nonce
    other = _pending("deploy-1", nonce="1" * 32, command="sh -c x")
    assert len(first.expect) == 12 and int(first.expect, 16) >= 0
    assert len({first.expect, again.expect, other.expect}) == 3
    assert refs.mismatch(first, None) is None and refs.mismatch(first, first.expect) is None
    refused = refs.mismatch(again, first.expect)
    assert refused is not None and refused.code is ErrorCode.REQUEST_CHANGED
    assert refused.details == {"request_id": "deploy-1", "expected": first.expect, "pending": again.expect}
    assert first.to_dict(0.0)["expect"] == first.expect


@pytest.mark.parametrize("value", ["", "ABCDEF012345", "0123", "0123456789abc", "0123456789a;", 12])
def test_expect_must_be_twelve_lowercase_hex_digits(value: object) -> None:
    with pytest.raises(AirlockError) as err:
        refs.expected({"expect": value})
    assert err.value.code is ErrorCode.INVALID_ARGUMENTS and err.value.details == {"field": "expect"}
    assert refs.expected({}) is None and refs.expected({"expect": "0123456789ab"}) == "0123456789ab"


def test_the_ledger_remembers_settled_ids_and_says_when_it_forgot_some() -> None:
    from airlock.approval import signed
    from airlock.approval.signers import Signers

    ledger = signed.Ledger(Signers(Path("/nonexistent")))
    for i in range(signed.RECENT + 1):
        entry = _pending(f"r-{i}")
        assert entry.published is not None
        published = ledger.publish(entry.request_id, entry.published.statements)
        ledger.settle(published, "withdrawn")
    found, unsure = ledger.settled_since(0.0)
    assert "r-0" not in found and f"r-{signed.RECENT}" in found and len(found) == signed.RECENT
    assert unsure  # r-0 settled within the window and was forgotten: prefixes are refused
    assert ledger.settled_since(1e12) == (set(), False)


def test_two_agents_one_id_expect_says_which() -> None:
    mine, theirs = _pending("deploy-1", nonce="1" * 32), _pending("deploy-1", nonce="2" * 32)
    with pytest.raises(AirlockError) as err:
        refs.exact("deploy-1", [mine, theirs])
    assert err.value.code is ErrorCode.CONFLICT
    assert refs.exact("deploy-1", [mine, theirs], theirs.expect) is theirs


OTHER = Peer(pid=2, uid=1001, gid=1001, user="other", group_ids=(1001,), groups=frozenset({"other"}))


def test_an_id_two_agents_have_pending_is_named_by_agent_or_by_expect_never_bare() -> None:
    mine = _pending("deploy-1", nonce="1" * 32)
    theirs = _pending("deploy-1", nonce="2" * 32, peer=OTHER)
    both = [theirs, mine]
    with pytest.raises(AirlockError) as err:
        refs.exact("deploy-1", both)
    assert err.value.code is ErrorCode.CONFLICT and "agent/deploy-1, other/deploy-1" in err.value.message
    assert err.value.details["references"] == ["agent/deploy-1", "other/deploy-1"]
    assert err.value.details["owners"] == [
        {"user": "agent", "uid": 1000, "expect": mine.expect},
        {"user": "other", "uid": 1001, "expect": theirs.expect},
    ]
    assert refs.exact("other/deploy-1", both) is theirs and refs.exact("1000/deploy-1", both) is mine
    assert refs.exact("deploy-1", both, mine.expect) is mine
    with pytest.raises(AirlockError) as err:
        refs.exact("deploy-1", both, "0" * 12)  # a digest neither has: still which one is unknown
    assert err.value.code is ErrorCode.CONFLICT
    for ref in ("nobody/deploy-1", "other/deploy-2", "other/op-deploy-1"):
        with pytest.raises(AirlockError) as err:
            refs.exact(ref, both)
        assert err.value.code is ErrorCode.NOT_FOUND
    # A qualified reference names one request: its --expect is then checked (`mismatch`), not used to choose.
    assert refs.exact("other/deploy-1", both, mine.expect) is theirs
    assert refs.named("deploy-9", both) is None


def test_a_prefix_of_an_id_two_agents_have_pending_is_refused_with_the_owners() -> None:
    both = [_pending("deploy-1", nonce="1" * 32), _pending("deploy-1", nonce="2" * 32, peer=OTHER)]
    with pytest.raises(AirlockError) as err:
        refs.by_prefix("deploy", both, set(), False)
    assert err.value.code is ErrorCode.CONFLICT
    assert err.value.details["references"] == ["agent/deploy-1", "other/deploy-1"]

"""Session tokens: hashed, expiring, revocable; every failure is the same refusal."""

from __future__ import annotations

import pytest

from airlock.approval.tokens import TokenStore, new_token, token_hash
from airlock.common.errors import AirlockError


def refusal(store: TokenStore, token: str, now: float) -> dict[str, object]:
    with pytest.raises(AirlockError) as caught:
        store.check(token, 1000, now)
    return caught.value.to_dict()


def test_a_token_stands_for_its_session_until_it_expires() -> None:
    store = TokenStore()
    token = new_token()
    store.issue(token, "nightly", 1000, 60, now=1000)
    assert store.check(token, 1000, 1059.9) == "nightly"
    assert store.live(1059.9) == 1
    expired = refusal(store, token, 1060)
    assert (
        expired
        == refusal(store, "alt_unknown", 1000)
        == {"code": "unauthorized", "message": "unauthorized", "details": {}}
    )
    assert store.live(1060) == 0


def test_only_hashes_are_kept() -> None:
    store = TokenStore()
    token = new_token()
    store.issue(token, "s", 1000, 60, now=0)
    assert token not in repr(store.__dict__)
    assert token_hash(token) in store._by_hash


def test_revoke_one_or_a_whole_session() -> None:
    store = TokenStore()
    a, b, c = new_token(), new_token(), new_token()
    for t, s in ((a, "x"), (b, "x"), (c, "y")):
        store.issue(t, s, 1000, 60, now=0)
    assert store.revoke_token(a) == 1 and store.revoke_token(a) == 0
    assert refusal(store, a, 1)["code"] == "unauthorized"
    assert store.revoke_session("x") == 1  # b; a was already revoked
    assert store.check(c, 1000, 1) == "y"
    # A sweep on the next issue keeps revoked entries until they expire.
    store.issue(new_token(), "z", 1000, 60, now=2)
    assert refusal(store, b, 3)["code"] == "unauthorized"


def test_tokens_are_long_and_distinct() -> None:
    tokens = {new_token() for _ in range(100)}
    assert len(tokens) == 100 and all(len(t) >= 40 for t in tokens)


def test_a_token_is_accepted_only_from_the_uid_it_was_issued_for() -> None:
    store = TokenStore()
    token = new_token()
    store.issue(token, "sandbox", 1001, 60, now=0)
    assert store.check(token, 1001, 1) == "sandbox"
    # Another agent that read the token gets the refusal an unknown token gets.
    assert refusal_as(store, token, 1002, 1) == refusal(store, "alt_unknown", 1)
    assert refusal_as(store, token, 0, 1)["code"] == "unauthorized"  # not even root


def refusal_as(store: TokenStore, token: str, uid: int, now: float) -> dict[str, object]:
    with pytest.raises(AirlockError) as caught:
        store.check(token, uid, now)
    return caught.value.to_dict()

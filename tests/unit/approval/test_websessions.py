"""approval/websessions.py: the console sessions sign-ins made, ended by revocation (issue 46)."""

from __future__ import annotations

from airlock.approval.websessions import WebSessions


def test_a_session_is_found_by_its_token_until_it_expires_and_only_its_hash_is_kept() -> None:
    table = WebSessions()
    token, session = table.open("alice", "cred-a", 60.0, 0.0)
    assert table.get(token, 30.0) == session and token not in repr(table)
    assert table.get(token, 61.0) is None and table.get("x" * 43, 1.0) is None and table.get(None, 1.0) is None


def test_ending_by_credential_or_account_leaves_the_others() -> None:
    table = WebSessions()
    phone, _ = table.open("alice", "cred-phone", 60.0, 0.0)
    laptop, _ = table.open("alice", "cred-laptop", 60.0, 0.0)
    bob, _ = table.open("bob", "cred-bob", 60.0, 0.0)
    assert len(table.end(lambda s: s.credential_id == "cred-phone")) == 1
    assert table.get(phone, 1.0) is None and table.get(laptop, 1.0) is not None
    assert len(table.end(lambda s: s.account == "alice")) == 1
    assert table.get(laptop, 1.0) is None and table.get(bob, 1.0) is not None
    assert [s.account for s in table.live(1.0)] == ["bob"]

"""A job as another account (issue 48) is shown as that account on every surface a person reads, never as root."""

from __future__ import annotations

from airlock.cli import show, watch
from airlock.common.render import Style
from airlock.common.sentence import sentence
from airlock.relay import message as msg

NAMES = {0: "root", 33: "www-data", 1001: "agent"}


def user_of(uid: object) -> str:
    return NAMES[uid] if isinstance(uid, int) and uid in NAMES else str(uid)


SPEC = {"stages": [["/usr/bin/id", "-un"]], "privileged": True, "uid": 1001, "user": 33}


def test_the_console_shows_the_account() -> None:
    pending = {
        "request_id": "r-1",
        "peer": {"user": "agent", "uid": 1001, "pid": 7},
        "privileged": True,
        "run_as": {"uid": 33, "user": "www-data"},
        "stages": [{"argv": ["id", "-un"], "binary": "/usr/bin/id"}],
    }
    text = watch.describe(pending, Style(False), 1, 1)
    assert "www-data (uid 33, privileged: another account)" in text and "root (privileged)" not in text
    root = watch.describe(pending | {"run_as": {"uid": 0, "user": "root"}}, Style(False), 1, 1)
    assert "root (privileged)" in root


def test_show_names_the_account() -> None:
    assert show._runs_as({"privileged": True, "user": 33}) == "www-data (uid 33, privileged: another account)"
    assert show._runs_as({"privileged": True}) == "root (privileged)"


def test_the_relays_message_names_the_account() -> None:
    event = {
        "seq": 1,
        "time": "2027-01-15T08:00:00Z",
        "kind": "approval.pending",
        "request_id": "r-1",
        "peer_uid": 1001,
        "payload": {"rule": "default", "timeout_seconds": 60.0, "request": {"spec": SPEC, "privileged": True}},
    }
    assert msg.pending_message(event, "db1", user_of, 0.0)["run_as"] == "www-data"


def test_the_journald_sentence_names_the_account() -> None:
    said = sentence("exec.started", {"spec": SPEC, "uid": 33, "cwd": "/"}, "r-1", 1001, user_of)
    assert said is not None and "USER=www-data" in said
    decided = sentence(
        "approval.decided",
        {"decision": "allow", "rule": "svc", "by": "policy", "privileged": True, "run_as": 33},
        "r-1",
        1001,
        user_of,
    )
    assert decided is not None and "USER=www-data" in decided

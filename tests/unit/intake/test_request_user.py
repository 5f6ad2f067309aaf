"""An exec's ``user`` field (issue 48: sudo -u, airlock run --user): whom the job runs as, checked in intake."""

from __future__ import annotations

import time

import pytest

from airlock.common import config
from airlock.common.errors import AirlockError
from airlock.common.peer import Peer
from airlock.intake.request import native_exec

AGENT = Peer(pid=1, uid=1000, gid=1000, user="deploy", group_ids=(1000,), groups=frozenset({"deploy"}))
ACCOUNTS = {"root": 0, "deploy": 1000, "postgres": 101}


def request(**args: object) -> object:
    body = {"argv": ["id"], "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} | args
    return native_exec("r1", body, AGENT, config.defaults(), time.time(), ACCOUNTS.get)


def test_another_account_is_a_privileged_job_as_that_uid() -> None:
    spec = request(user="postgres").spec  # type: ignore[attr-defined]
    assert spec.privileged and spec.user == 101 and spec.run_as == 101
    assert spec.to_dict()["user"] == 101


def test_root_and_the_requester_are_the_jobs_they_always_were() -> None:
    root = request(user="root").spec  # type: ignore[attr-defined]
    mine = request(user="deploy").spec  # type: ignore[attr-defined]
    assert (root.privileged, root.user, root.run_as) == (True, None, 0)
    assert (mine.privileged, mine.user, mine.run_as) == (False, None, 1000)
    # Root's digest is unchanged by the new field: replay keys and tickets stay what they were.
    assert "user" not in root.to_dict() and root.digest() == request().spec.digest()  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ({"user": "nosuch"}, "no such account 'nosuch'"),
        ({"user": "postgres", "privileged": False}, "a job as another account is privileged"),
        ({"user": ""}, "user"),
        # sudo's env_reset holds for another account's job as for root's.
        ({"user": "postgres", "env": {"TZ": "/etc/passwd"}}, "env.TZ"),
    ],
)
def test_refused(args: dict[str, object], words: str) -> None:
    with pytest.raises(AirlockError) as refused:
        request(**args)
    assert words in refused.value.message

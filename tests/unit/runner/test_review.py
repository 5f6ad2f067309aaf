"""Issue 34: how the runner starts the reviewer -- its identity and its unit's sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from typing import Any

import pytest

from airlock.common import config as cfg
from airlock.runner import review


def settings(**approval: Any) -> cfg.Config:
    base = cfg.defaults()
    return dataclasses.replace(base, approval=dataclasses.replace(base.approval, **approval))


def test_never_root_and_never_a_missing_user() -> None:
    assert "root" in str(review.identity(settings(reviewer_user="root")))
    assert "root" in str(review.identity(settings(reviewer_user="0")))
    assert "no user" in str(review.identity(settings(reviewer_user="no-such-user-xyz")))


@pytest.mark.skipif(os.geteuid() != 0, reason="only root may start it as another user")
def test_nobody_is_a_reviewer_user() -> None:
    assert review.identity(settings(reviewer_user="nobody")) == (65534, 65534)


def test_the_unit_is_confined() -> None:
    props = {name: value for name, _, value in review.properties(settings(reviewer_command=("/r",)), 999, 999)}
    assert props["User"] == "999" and props["SupplementaryGroups"] == []
    assert props["NoNewPrivileges"] is True and props["CapabilityBoundingSet"] == 0
    assert props["ProtectSystem"] == "strict" and props["ProtectHome"] == "yes" and props["PrivateTmp"] is True
    assert props["PrivateNetwork"] is True
    assert "-/run/airlock" in props["InaccessiblePaths"] and "-/etc/airlock" in props["InaccessiblePaths"]
    assert props["ExecStart"] == [("/r", ["/r"], False)]
    networked = review.properties(settings(reviewer_command=("/r",), reviewer_network=True), 999, 999)
    assert "PrivateNetwork" not in {name for name, _, _ in networked}


def test_nothing_runs_without_a_command_or_a_safe_program() -> None:
    assert asyncio.run(review.review(settings(), {}, systemd=False))["ran"] is False
    missing = settings(reviewer_command=("/nonexistent/reviewer",), reviewer_user="nobody")
    assert asyncio.run(review.review(missing, {}, systemd=False))["ran"] is False

"""A refused airlock.yaml never stops a service under systemd (issue 44): the last accepted copy, else defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from airlock.common import daemon
from airlock.common.config import ConfigError

GOOD = "approval:\n  timeout_seconds: 42\n"
TYPO = "approval:\n  timeout_secs: 42\n"


def test_an_accepted_file_is_kept_and_a_refused_one_runs_on_the_copy(tmp_path: Path) -> None:
    config, state = tmp_path / "airlock.yaml", tmp_path / "state"
    config.write_text(GOOD)
    accepted = daemon.load_or_keep(config, state)
    assert accepted.approval.timeout_seconds == 42 and accepted.refused == ""
    config.write_text(TYPO)
    kept = daemon.load_or_keep(config, state)
    assert kept.approval.timeout_seconds == 42  # the operator's setting survives the typo
    assert "timeout_secs" in kept.refused and "airlock.yaml:2:3" in kept.refused, kept.refused
    assert kept.source.endswith("(last accepted copy)")
    assert (state / daemon.KEPT_CONFIG).stat().st_mode & 0o077 == 0  # the service's own


def test_with_no_copy_a_refused_file_runs_on_the_defaults_and_says_so(tmp_path: Path) -> None:
    config = tmp_path / "airlock.yaml"
    config.write_text(TYPO)
    fallback = daemon.load_or_keep(config, tmp_path / "state")
    assert fallback.source == "<built-in defaults>" and "timeout_secs" in fallback.refused
    assert fallback.approval.timeout_seconds != 42


def test_without_a_state_directory_a_refused_file_is_still_an_error(tmp_path: Path) -> None:
    config = tmp_path / "airlock.yaml"
    config.write_text(TYPO)
    with pytest.raises(ConfigError, match="timeout_secs"):
        daemon.load_or_keep(config, None)

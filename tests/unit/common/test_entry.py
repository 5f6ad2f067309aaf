"""The services' commands (airlock/entry.py) and the collector they pause for the start."""

from __future__ import annotations

import gc
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from airlock import entry
from airlock.common.notify import Notifier

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def collector_restored() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


def test_every_service_command_runs_its_service_through_the_entry() -> None:
    """What the .deb installs as /usr/libexec/airlock/airlock-NAME pauses the collector first, then loads NAME."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    services = {name: target for name, target in scripts.items() if name != "airlock"}
    assert services == {f"airlock-{name}": f"airlock.entry:{name}" for name in entry.SERVICES}
    for name, module in entry.SERVICES.items():
        assert callable(getattr(entry, name))
        assert callable(__import__(module, fromlist=["main"]).main), module


def test_ready_resumes_the_collector_the_start_paused(collector_restored: None) -> None:
    gc.disable()
    Notifier({}).ready("serving")
    assert gc.isenabled()  # a service never runs without its cycle collector once it serves
    assert gc.get_freeze_count() > 0  # what the start built is out of the collector's sight


def test_ready_leaves_a_running_collector_as_it_is() -> None:
    frozen = gc.get_freeze_count()
    Notifier({}).ready("serving")  # a service started some other way (a test, python -m airlock.journal)
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_an_unknown_service_name_is_refused_with_its_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "airlock.entry", "nosuch"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    assert "usage: python -m airlock.entry {intake," in result.stderr and "Traceback" not in result.stderr


def test_a_service_started_through_the_entry_reads_its_options() -> None:
    """`python -m airlock.entry journal --help` is the journal's own parser (dev up's argv)."""
    result = subprocess.run(
        [sys.executable, "-m", "airlock.entry", "journal", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "--config" in result.stdout

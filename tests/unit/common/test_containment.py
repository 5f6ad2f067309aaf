"""Containment modes: one enum, one registry, and the setting that names them."""

from __future__ import annotations

import pytest

from airlock.common import config as configuration
from airlock.common import containment
from airlock.common.containment import Containment
from airlock.common.errors import AirlockError


def test_every_mode_is_in_the_registry_and_the_setting_takes_each_or_auto() -> None:
    assert set(containment.MODES) == set(Containment)
    assert containment.SETTING == ("auto", "service", "scope", "process-group")
    for value in containment.SETTING:
        configuration.parse_text(f"runner:\n  containment: {value}\n", "test.yaml")
    with pytest.raises(configuration.ConfigError):
        configuration.parse_text("runner:\n  containment: chroot\n", "test.yaml")


def test_auto_resolves_to_a_mode_and_a_mode_to_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(containment, "systemd_is_running", lambda: False)
    assert containment.resolve("auto") is Containment.PROCESS_GROUP
    assert containment.resolve("scope") is Containment.SCOPE
    assert not Containment.PROCESS_GROUP.systemd and Containment.SERVICE.systemd and Containment.SCOPE.systemd


def test_a_job_spec_holds_the_enum_and_refuses_an_unknown_mode() -> None:
    import dataclasses

    from airlock.runner.identity import Identity
    from airlock.runner.jobspec import JobSpec

    me = Identity(uid=0, gid=0, groups=(0,), user="root", home="/root")
    job = JobSpec("op", "exec", (("true",),), me, {}, "/", None, 1.0, None, 16, 1.0, (), "scope")  # type: ignore[arg-type]
    assert job.containment is Containment.SCOPE
    with pytest.raises(AirlockError, match="containment must be one of service, scope, process-group"):
        dataclasses.replace(job, containment="chroot")  # type: ignore[arg-type]

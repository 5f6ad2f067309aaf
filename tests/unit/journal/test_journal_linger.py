"""The journal's stop waits for exactly the airlock services that are stopping (issue 50)."""

from __future__ import annotations

from airlock.journal.linger import PEERS, stopping

ALL_ACTIVE = "active\nactive\nactive\n"


def test_nothing_stopping_when_the_journal_stops_alone() -> None:
    # `systemctl restart airlock-journal`: its own job is listed, the others are serving.
    assert stopping(ALL_ACTIVE, "812 airlock-journal.service stop running\n") == []


def test_a_deactivating_service_is_waited_for() -> None:
    assert stopping("deactivating\nactive\ninactive\n", "") == ["airlock-intake.service"]


def test_a_queued_stop_job_is_waited_for_before_the_service_leaves_active() -> None:
    # A shutdown's stop job may wait on the service's own ordering: still active, already going.
    jobs = "900 airlock-runner.service stop waiting\n901 airlock-journal.service stop running\n"
    assert stopping(ALL_ACTIVE, jobs) == ["airlock-runner.service"]
    assert stopping(ALL_ACTIVE, "77 airlock-approval.service restart running\n") == ["airlock-approval.service"]


def test_start_jobs_and_other_units_are_not_stops() -> None:
    jobs = "5 airlock-approval.service start running\n6 airlock-web.service stop running\n7 garbage\n\n"
    assert stopping("inactive\nactivating\ninactive\n", jobs) == []


def test_every_peer_in_unit_order() -> None:
    jobs = "1 airlock-runner.service stop waiting\n"
    assert stopping("deactivating\ndeactivating\nactive\n", jobs) == list(PEERS)

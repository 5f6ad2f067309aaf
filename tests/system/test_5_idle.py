"""Socket-activated services exit when idle; the next request starts them."""

from __future__ import annotations

import time
import uuid


def test_services_exit_when_idle_and_come_back(system) -> None:
    system.set_config("services:\n  idle_exit_seconds: 2\n")
    system.restart_services()
    try:
        r = system.airlock(
            "run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/true"
        )
        assert r.returncode == 0, r
        first = {s: system.main_pid(s) for s in system.SERVICES}
        assert all(first.values()), first  # the request started all four

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(system.active(s) != "inactive" for s in system.SERVICES):
            time.sleep(0.5)
        states = {s: system.active(s) for s in system.SERVICES}
        assert set(states.values()) == {"inactive"}, states
        for service in system.SERVICES:  # a clean exit, not a failure or a watchdog kill
            assert system.c.unit_property(service, "Result") == "success", service
            assert system.c.unit_property(service, "ExecMainStatus") == "0", service
        for socket in system.SOCKETS:
            assert system.active(socket) == "active", socket

        r = system.airlock(
            "run", "--no-privilege", "--operation-id", f"systest-{uuid.uuid4().hex}", "--", "/usr/bin/id", "-un"
        )
        assert (r.returncode, r.stdout.strip()) == (0, system.AGENT), r
        again = {s: system.main_pid(s) for s in system.SERVICES}
        assert all(again.values()) and all(again[s] != first[s] for s in system.SERVICES), (first, again)
    finally:
        system.restore_config()
        system.restart_services()

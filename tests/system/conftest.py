"""System tests: the Debian package on a booted Debian 12 with a real systemd.

One container boot per session (`system`): the .deb is installed with apt,
three users are created — ``agent1`` (group airlock), ``op1`` (group
airlock-admin) and ``outsider`` (neither) — and a policy.d file allows the
commands the tests run.  The modules are numbered because they share that
container and the last one upgrades and purges the package.

Run with ``make test-system`` (builds the .deb first).  Environment:
``AIRLOCK_DEB`` (the package to test, default the newest dist/*.deb),
``AIRLOCK_SYSTEST_DIR`` (the cache, default /var/tmp/airlock-systest),
``AIRLOCK_SYSTEST_KEEP=1`` (keep the container's root afterwards).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nspawn import Container, Unavailable, booted, cannot_run

REPO = Path(__file__).resolve().parents[2]
AGENT, OPERATOR, OUTSIDER = "agent1", "op1", "outsider"
SOCKETS = (
    "airlock.socket",
    "airlock-operator.socket",
    "airlock-approval.socket",
    "airlock-runner.socket",
    "airlock-journal.socket",
    "airlock-exectree.socket",
)
SERVICES = (
    "airlock-intake.service",
    "airlock-approval.service",
    "airlock-runner.service",
    "airlock-journal.service",
    "airlock-exectree.service",
)

# Allow rules for what the tests run; everything else keeps the shipped
# default (ask).  Paths are canonical (/bin/sh is /usr/bin/dash on Debian 12).
POLICY = """\
rules:
  - name: systest-user-commands
    decision: allow
    groups: [airlock]
    privileged: false
    commands:
      - [/usr/bin/id, "..."]
      - [/usr/bin/true]
      - [/usr/bin/echo, "..."]
      - [/usr/bin/sleep, "..."]
      - [/usr/bin/dash, "..."]
      - [/usr/bin/cat, "..."]
      - [/usr/bin/wc, "..."]
  - name: systest-root-commands
    decision: allow
    groups: [airlock]
    privileged: true
    commands:
      - [/usr/bin/id, "..."]
      - [/usr/bin/cat, /etc/shadow]
      - [/usr/bin/dash, -c, "..."]
  - name: systest-forbidden
    decision: deny
    commands:
      - [/usr/bin/rm, "..."]
"""


def _deb() -> Path:
    if os.environ.get("AIRLOCK_DEB"):
        return Path(os.environ["AIRLOCK_DEB"]).resolve()
    debs = sorted((REPO / "dist").glob("airlock_*_all.deb"), key=lambda p: p.stat().st_mtime)
    if not debs:
        cannot_run("no dist/airlock_*_all.deb: run `make test-system` (it builds the package first)")
    return debs[-1]


class System:
    """The booted container with airlock installed, and helpers the tests share."""

    AGENT, OPERATOR, OUTSIDER = AGENT, OPERATOR, OUTSIDER
    SOCKETS, SERVICES = SOCKETS, SERVICES

    def __init__(self, container: Container, deb: Path) -> None:
        self.c = container
        self.deb = deb
        self.deb_inside = f"/root/{deb.name}"

    # airlock commands ---------------------------------------------------------------

    def airlock(self, *args: str, user: str = AGENT, check: bool = False, timeout: float = 60.0):
        return self.c.run(["airlock", *args], user=user, check=check, timeout=timeout)

    def run_json(
        self,
        *argv: str,
        user: str = AGENT,
        privileged: bool = False,
        extra: tuple[str, ...] = (),
        timeout: float = 60.0,
    ):
        """`airlock run --json`: (exit code, the response envelope)."""
        opts = [] if privileged else ["--no-privilege"]
        r = self.c.run(
            ["airlock", "run", "--json", *opts, *extra, "--", *argv], user=user, check=False, timeout=timeout
        )
        lines = [line for line in r.stdout.splitlines() if line.strip()]
        try:
            envelope = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            envelope = {}
        return r.returncode, envelope, r

    def audit_verify(self, *, lifecycle: bool = False) -> str:
        """The chain checks out; with ``lifecycle``, every request's story is one the table allows too."""
        r = self.airlock("audit", "verify", *(["--lifecycle"] if lifecycle else []), user=OPERATOR)
        assert r.returncode == 0, f"airlock audit verify failed:\n{r}"
        assert r.stdout.startswith("ok:"), r.stdout
        if lifecycle:
            assert "lifecycle: ok;" in r.stdout, r.stdout
        return r.stdout

    # configuration -------------------------------------------------------------------

    def set_config(self, extra_yaml: str) -> None:
        """The shipped airlock.yaml plus ``extra_yaml`` (sections it leaves commented)."""
        shipped = (REPO / "config" / "airlock.yaml").read_text()
        self.c.write("/etc/airlock/airlock.yaml", shipped + "\n" + extra_yaml)

    def restore_config(self) -> None:
        self.c.write("/etc/airlock/airlock.yaml", (REPO / "config" / "airlock.yaml").read_text())

    def restart_services(self) -> None:
        """Stop every airlock service: the sockets start them again with the new config.

        Tests restart the services far more often than anyone would: systemd's start limit (5 starts
        in 10 s) is reset here so that one test's restarts never fail the next test's sockets.
        """
        self.c.run(["systemctl", "stop", *SERVICES])
        self.c.run(["systemctl", "reset-failed", *SERVICES, *SOCKETS], check=False)
        self.c.run(["systemctl", "start", *SOCKETS])

    def active(self, unit: str) -> str:
        return self.c.run(["systemctl", "is-active", unit], check=False).stdout.strip()

    def main_pid(self, unit: str) -> int:
        return int(self.c.unit_property(unit, "MainPID") or 0)


@pytest.fixture(scope="session")
def system() -> Iterator[System]:
    deb = _deb()
    started = time.monotonic()
    try:
        with booted(keep=os.environ.get("AIRLOCK_SYSTEST_KEEP") == "1") as container:
            system = System(container, deb)
            shutil.copy(deb, container.root / "root" / deb.name)
            r = container.run(
                ["apt-get", "install", "-y", "--no-install-recommends", system.deb_inside], check=False, timeout=300
            )
            if r.returncode != 0:  # a dependency is not in the cached root: fetch the lists once
                container.run(["apt-get", "update", "-qq"], timeout=300)
                container.run(["apt-get", "install", "-y", "--no-install-recommends", system.deb_inside], timeout=300)
            container.run(["useradd", "--create-home", "--groups", "airlock", AGENT])
            container.run(["useradd", "--create-home", "--groups", "airlock-admin", OPERATOR])
            container.run(["useradd", "--create-home", OUTSIDER])
            container.write("/etc/airlock/policy.d/50-systest.yaml", POLICY)
            print(f"[systest] installed {deb.name} in {time.monotonic() - started:.1f}s since boot start", flush=True)
            yield system
    except Unavailable as exc:
        cannot_run(exc)


def all_events(system) -> list[dict]:
    """Every journal event the operator can page through (`airlock events --after`), oldest first."""
    events: list[dict] = []
    after = 0
    while True:
        r = system.airlock("events", "--after", str(after), "--json", user=system.OPERATOR, check=True)
        page = json.loads(r.stdout.strip().splitlines()[-1])["data"]["events"]
        if not page:
            return events
        events += page
        after = page[-1]["seq"]

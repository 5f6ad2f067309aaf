"""What a fresh `apt-get install ./airlock_*.deb` leaves on a booted Debian 12."""

from __future__ import annotations

import re


def test_only_the_sockets_are_enabled_and_listening(system) -> None:
    for socket in system.SOCKETS:
        assert system.c.run(["systemctl", "is-enabled", socket]).stdout.strip() == "enabled"
        assert system.active(socket) == "active", system.c.run(["systemctl", "status", socket], check=False)
    for service in system.SERVICES:
        # static: no [Install]; started by its socket only
        assert system.c.run(["systemctl", "is-enabled", service], check=False).stdout.strip() == "static"
    assert system.c.run(["systemctl", "is-enabled", "airlock-jobs.slice"], check=False).stdout.strip() == "static"


def test_install_started_no_service(system) -> None:
    # Nothing has connected yet in this session: no service ran at install.
    for service in system.SERVICES:
        assert system.c.unit_property(service, "NRestarts") == "0"
        assert system.c.unit_property(service, "ExecMainStartTimestampMonotonic") == "0", service


def test_socket_files_owners_and_modes(system) -> None:
    out = system.c.run(
        [
            "stat",
            "-c",
            "%n %a %U %G %F",
            "/run/airlock",
            "/run/airlock/agent.sock",
            "/run/airlock/operator.sock",
            "/run/airlock/internal",
            "/run/airlock/internal/approval.sock",
            "/run/airlock/internal/runner.sock",
            "/run/airlock/internal/journal.sock",
            "/run/airlock/internal/exectree.sock",
        ]
    ).stdout.splitlines()
    assert out == [
        "/run/airlock 755 root root directory",
        "/run/airlock/agent.sock 660 root airlock socket",
        "/run/airlock/operator.sock 660 root airlock-admin socket",
        "/run/airlock/internal 750 root airlock-svc directory",
        "/run/airlock/internal/approval.sock 660 root airlock-intake socket",
        "/run/airlock/internal/runner.sock 660 root airlock-svc socket",
        "/run/airlock/internal/journal.sock 660 root airlock-svc socket",
        "/run/airlock/internal/exectree.sock 600 root root socket",  # the runner (root) alone
    ]


def test_system_users_and_groups(system) -> None:
    for user in ("airlock-intake", "airlock-approval", "airlock-journal", "airlock-exectree"):
        entry = system.c.run(["getent", "passwd", user]).stdout.strip().split(":")
        assert int(entry[2]) < 1000, entry  # a system user
        assert entry[6] in ("/usr/sbin/nologin", "/sbin/nologin"), entry
    assert system.c.run(["id", "-nG", "airlock-intake"]).stdout.split() == ["airlock-intake", "airlock-svc"]
    assert system.c.run(["id", "-nG", "airlock-approval"]).stdout.split() == ["airlock-approval", "airlock-svc"]
    assert system.c.run(["id", "-nG", "airlock-journal"]).stdout.split() == ["airlock-journal"]
    assert system.c.run(["id", "-nG", "airlock-exectree"]).stdout.split() == ["airlock-exectree"]
    for group in ("airlock", "airlock-admin", "airlock-svc"):
        system.c.run(["getent", "group", group])


def test_conffiles_and_default_policy(system) -> None:
    conffiles = system.c.run(["dpkg-query", "-W", "-f=${Conffiles}\\n", "airlock"]).stdout
    assert "/etc/airlock/airlock.yaml" in conffiles
    shown = system.c.run(["airlock", "config", "show", "--json"]).stdout
    assert '"airlock-admin"' in shown
    assert re.search(r"^\s+default: ask$", system.c.run(["cat", "/etc/airlock/airlock.yaml"]).stdout, re.M)


def test_units_verify_clean_with_bookworms_systemd(system) -> None:
    units = [f"/lib/systemd/system/{u}" for u in (*system.SOCKETS, *system.SERVICES, "airlock-jobs.slice")]
    r = system.c.run(["systemd-analyze", "verify", "--man=no", *units], check=False)
    assert (r.returncode, r.stdout + r.stderr) == (0, ""), r


def test_security_exposure_on_bookworm(system) -> None:
    for service, limit in (
        ("airlock-intake", 1.0),
        ("airlock-approval", 1.0),
        ("airlock-journal", 1.0),
        ("airlock-runner", 1.5),  # issue 47: the exec trees' rights are airlock-exectree's
        ("airlock-exectree", 2.0),
    ):
        out = system.c.run(["systemd-analyze", "security", "--no-pager", f"{service}.service"]).stdout
        level = float(re.search(r"Overall exposure level for \S+: ([0-9.]+)", out).group(1))
        print(f"{service}: {level}")
        assert level <= limit, out


def test_man_page_and_catalog_installed(system) -> None:
    system.c.run(["test", "-f", "/usr/share/man/man1/airlock.1.gz"])
    system.c.run(["test", "-f", "/usr/lib/systemd/catalog/airlock.catalog"])
    # systemd's dpkg trigger compiled the catalog into journald's database
    r = system.c.run(["journalctl", "--list-catalog", "--no-pager"])
    assert "airlock" in r.stdout.lower()

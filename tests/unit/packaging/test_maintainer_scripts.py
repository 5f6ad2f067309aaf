"""The Debian maintainer scripts, run as dpkg runs them, against a temporary root (issue 44, item 6).

``DPKG_ROOT`` is how dpkg points maintainer scripts at a root other than /
(dpkg --root with --force-script-chrootless); the scripts honour it, so each
test builds the files a host would have under a temporary directory and runs
the real packaging/debian script with /bin/sh.  What the booted package does
end to end is tests/system/test_8_upgrade_purge.py's.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

DEBIAN = Path(__file__).resolve().parents[3] / "packaging" / "debian"
STATE = (
    "/var/lib/airlock",
    "/var/lib/airlock-approval",
    "/var/lib/airlock-intake",
    "/var/lib/airlock-notify",
    "/var/lib/airlock-runner",
)
KEY = "/etc/airlock/checkpoint_ed25519_key"


def _run(script: str, root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DPKG_ROOT": str(root)}
    return subprocess.run(
        ["/bin/sh", "-e", str(DEBIAN / script), *args], env=env, capture_output=True, text=True, timeout=30
    )


def _put(root: Path, path: str, text: str = "x\n") -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A root with what the package ships in /etc/airlock/policy.d."""
    _put(tmp_path, "/etc/airlock/airlock.yaml", "policy: {default: ask}\n")
    _put(tmp_path, "/etc/airlock/policy.d/README")
    _put(tmp_path, "/etc/airlock/policy.d/50-examples.yaml.example")
    return tmp_path


def test_a_fresh_install_warns_of_rule_files_it_did_not_ship(shipped: Path) -> None:
    _put(shipped, "/etc/airlock/policy.d/60-root-allow.yaml", "rules: []\n")
    _put(shipped, "/etc/airlock/policy.d/10 spaced.yaml", "rules: []\n")
    fresh = _run("airlock.postinst", shipped, "configure", "")
    assert fresh.returncode == 0, fresh.stderr
    assert "WARNING: /etc/airlock/policy.d already holds rule files this package did not ship" in fresh.stderr
    assert "airlock:   /etc/airlock/policy.d/60-root-allow.yaml" in fresh.stderr, fresh.stderr
    assert "airlock:   /etc/airlock/policy.d/10 spaced.yaml" in fresh.stderr, fresh.stderr
    assert "README" not in fresh.stderr and "example" not in fresh.stderr, fresh.stderr
    # an upgrade names them too, without the alarm
    upgrade = _run("airlock.postinst", shipped, "configure", "0.1.0")
    assert upgrade.returncode == 0 and "WARNING" not in upgrade.stderr
    assert "/etc/airlock/policy.d/60-root-allow.yaml" in upgrade.stderr and "in force" in upgrade.stderr


def test_a_fresh_install_with_only_what_it_ships_says_nothing_and_makes_no_key_outside_the_root(
    shipped: Path,
) -> None:
    fresh = _run("airlock.postinst", shipped, "configure", "")
    assert (fresh.returncode, fresh.stderr) == (0, ""), fresh.stderr
    # under DPKG_ROOT the key is not made (chown would name the outer system's users)
    assert not (shipped / KEY.lstrip("/")).exists()


def test_purge_removes_every_services_state_and_the_key_and_names_what_it_keeps(shipped: Path) -> None:
    for directory in STATE:
        _put(shipped, f"{directory}/data")
    _put(shipped, KEY)
    _put(shipped, KEY + ".pub")
    os.remove(shipped / "etc/airlock/airlock.yaml")  # dpkg removes the conffiles before postrm purge
    for name in ("README", "50-examples.yaml.example"):
        os.remove(shipped / "etc/airlock/policy.d" / name)
    local = _put(shipped, "/etc/airlock/policy.d/60-root-allow.yaml", "rules: []\n")
    r = _run("airlock.postrm", shipped, "purge")
    assert r.returncode == 0, r.stderr
    for directory in STATE:
        assert not (shipped / directory.lstrip("/")).exists(), directory
        assert directory in r.stderr, r.stderr
    assert not (shipped / KEY.lstrip("/")).exists() and not (shipped / (KEY.lstrip("/") + ".pub")).exists()
    assert f"deleted this host's checkpoint key {KEY}" in r.stderr, r.stderr
    assert "kept the system users and groups" in r.stderr
    assert local.exists() and "/etc/airlock/policy.d/60-root-allow.yaml" in r.stderr, r.stderr
    assert "in force again after a reinstall" in r.stderr


def test_remove_keeps_state_and_configuration(shipped: Path) -> None:
    """Control: only purge deletes state; remove leaves it and says nothing."""
    for directory in STATE:
        _put(shipped, f"{directory}/data")
    _put(shipped, KEY)
    r = _run("airlock.postrm", shipped, "remove")
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert all((shipped / d.lstrip("/") / "data").exists() for d in STATE)
    assert (shipped / KEY.lstrip("/")).exists()


def test_the_package_ships_the_example_reviewer_and_says_jobs_are_services() -> None:
    """The example the docs name goes to /usr/share/doc/airlock/examples/ (dh_installexamples);
    the description says what runner.containment's auto gives as root: a transient service."""
    examples = (DEBIAN / "airlock.examples").read_text().split()
    assert examples == ["docs/examples/reviewer-example.py"]
    assert (DEBIAN.parents[1] / examples[0]).is_file()
    description = (DEBIAN / "control").read_text()
    assert "transient systemd service" in description and "scope per job" not in description

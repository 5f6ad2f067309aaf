"""sudo(8)'s option table, row by row: what each option does when an agent types it on a host with airlock (issue 48).

Each row names sudo's option (short and long, as sudo 1.9's manual lists them),
a line an agent would type with it, and airlock's behaviour: the exit status and
what the agent reads.  Every row runs end to end: the agent is a real account
with no sudo rights, its `sudo` is airlock's (first on its PATH), and the
requests go to a live stack whose policy allows reads and app files as root,
asks for the rest, and refuses dd.  Refused options never reach airlock and
exit 1 with ``sudo: …`` and what airlock can do instead.
"""

from __future__ import annotations

import os
import pty
import subprocess
import time
from collections.abc import Iterator

import pytest
from sudo_live import Agent, needs_root, sudo_agent

from airlock.cli import sudoargs

pytestmark = needs_root

# (sudo's option, the line, exit status, text the agent reads on stdout or stderr)
TABLE: list[tuple[str, str, int, str]] = [
    ("(none): run a command as root", "sudo id -un", 0, "root"),
    ("-A, --askpass", "sudo -A id", 1, "there is no password with airlock"),
    ("-a, --auth-type", "sudo -a pam id", 1, "no authentication types"),
    ("-B, --bell", "sudo -B id -un", 0, "root"),
    ("-b, --background", "sudo -b sleep 1", 1, "sudo CMD &"),
    ("-C, --close-from", "sudo -C 5 id", 1, "never inherit descriptors"),
    ("-c, --login-class", "sudo -c daemon id", 1, "no login classes"),
    ("-D, --chdir", "sudo -D /etc pwd", 0, "/etc"),
    ("--chdir=DIR", "sudo --chdir=/usr pwd", 0, "/usr"),
    ("-E, --preserve-env", "LANG=C.UTF-8 sudo -E printenv LANG", 0, "C.UTF-8"),
    ("--preserve-env=LIST", "TZ=UTC sudo --preserve-env=TZ printenv TZ", 0, "UTC"),
    (
        "--preserve-env=LIST, a variable env.allow does not list",
        "FOO=1 sudo --preserve-env=FOO env",
        1,
        "not allowed to preserve the environment variable FOO",
    ),
    ("-e, --edit", "printf 'a=1\\n' | sudo -e $ROOT/allowed/edit.conf", 0, ""),
    ("-g, --group (without -u: as yourself, sudo(8) says)", "sudo -g $(id -gn) id -un", 0, "alsudo"),
    ("-g, --group (the -u account's own)", "sudo -u root -g root id -gn", 0, "root"),
    ("-g, --group (another)", "sudo -g daemon id", 1, "own group"),
    ("-H, --set-home", "sudo -H printenv HOME", 0, "/root"),
    ("-h, --help", "sudo -h", 0, "usage: sudo"),
    ("-h HOST, --host", "sudo --host=db1 id", 1, "this host only"),
    ("-i, --login", "sudo -i", 1, "no login shells"),
    ("-K, --remove-timestamp", "sudo -K", 0, ""),
    ("-k, --reset-timestamp", "sudo -k", 0, ""),
    ("-k with a command", "sudo -k id -un", 0, "root"),
    ("-l, --list", "sudo -l", 0, "may ask airlock"),
    ("-l COMMAND (allowed)", "sudo -l id", 0, "/usr/bin/id"),
    ("-l COMMAND (refused)", "sudo -l dd if=/dev/zero", 1, ""),
    ("-ll COMMAND", "sudo -ll dd if=/dev/zero", 1, "rule never"),
    ("-N, --no-update", "sudo -N id -un", 0, "root"),
    ("-n, --non-interactive (allowed)", "sudo -n true", 0, ""),
    ("-n, --non-interactive (a person would be asked)", "sudo -n systemctl restart nginx", 1, "a password is required"),
    ("-P, --preserve-groups", "sudo -P id", 1, "own groups"),
    ("-p, --prompt", "sudo -p 'pw:' id -un", 0, "root"),
    ("-R, --chroot", "sudo -R /srv id", 1, "another root directory"),
    ("-r, --role", "sudo -r sysadm_r id", 1, "SELinux roles"),
    ("-S, --stdin", "echo secret | sudo -S id", 1, "there is no password with airlock"),
    ("-s, --shell", "sudo -s", 1, "no interactive shells"),
    ("-T, --command-timeout", "sudo -T 1 sleep 5", 143, "timed out"),
    ("-t, --type", "sudo -t sysadm_t id", 1, "SELinux types"),
    ("-U, --other-user", "sudo -l -U bob", 1, "only for the account that asks"),
    ("-u, --user root", "sudo -u root id -un", 0, "root"),
    ("-u #0", "sudo -u '#0' id -un", 0, "root"),
    ("-u, --user (the agent itself)", "sudo -u $(id -un) id -un", 0, "alsudo"),
    ("-u, --user (an account that does not exist)", "sudo -u nosuchuser id", 1, "unknown user nosuchuser"),
    ("-V, --version", "sudo -V", 0, "Sudo version"),
    ("-v, --validate", "sudo -v", 0, ""),
    ("--, end of options", "sudo -- id -un", 0, "root"),
    (
        "VAR=value (env.allow lists it)",
        "sudo DEBIAN_FRONTEND=noninteractive printenv DEBIAN_FRONTEND",
        0,
        "noninteractive",
    ),
    ("VAR=value (env.allow does not)", "sudo FOO=1 env", 1, "not allowed to set the following environment"),
    ("an unknown option", "sudo -Z id", 1, "invalid option -- 'Z'"),
    ("no command", "sudo", 1, "usage: sudo"),
    ("su through sudo", "sudo su -", 1, "does not switch users"),
]


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    with sudo_agent() as made:
        yield made


def test_every_option_of_sudo_has_a_row() -> None:
    """The table covers sudo's whole option table (sudoargs.OPTIONS is sudo 1.9's)."""
    rows = " ".join(option for option, *_ in TABLE)
    missing = [
        f"-{short}" if short else f"--{long}"
        for short, long, _arg, _what in sudoargs.OPTIONS
        if (f"-{short}," if short else f"--{long}") not in rows
    ]
    assert not missing


@pytest.mark.parametrize(("option", "line", "status", "text"), TABLE, ids=[row[0] for row in TABLE])
def test_option(agent: Agent, option: str, line: str, status: int, text: str) -> None:
    ran = agent.run(line)
    assert ran.code == status, (option, ran)
    assert text in ran.out + ran.err, (option, ran)
    # sudo's own failures: `sudo: …` (a refused `sudo -l CMD` is silent, as sudo's is).
    if status == 1 and text and text in ran.err:
        assert ran.err.startswith("sudo: "), ran.err


def test_sudo_n_never_asks_a_person(agent: Agent) -> None:
    """`sudo -n` of a command a person would decide: sudo's "a password is required", nobody asked, nothing ran."""
    # awk is in no rule: a person would decide.
    line = f"""sudo awk 'BEGIN {{ print 1 > "{agent.root_dir}/asked" }}'"""
    ran = agent.run(line.replace("sudo ", "sudo -n ", 1))
    assert ran.code == 1 and ran.err.splitlines()[0] == "sudo: a password is required", ran
    assert "airlock would ask an operator (rule default)" in ran.err
    assert agent.pending() == [] and not (agent.root_dir / "asked").exists()
    # The control: without -n the same line does wait for a person.
    proc = agent.start(line)
    try:
        entry = agent.decide_next("deny")
        assert entry["stages"][0]["argv"][0] == "awk"
    finally:
        proc.communicate(timeout=60)
    assert proc.returncode == 1 and not (agent.root_dir / "asked").exists()


def test_output_streams_as_the_job_prints_it(agent: Agent) -> None:
    """The first line reaches the agent while the job still runs, as sudo's own output would."""
    proc = agent.start('exec sudo sh -c "echo first; sleep 3; echo second"')
    assert proc.stdout is not None
    started = time.monotonic()
    first = proc.stdout.readline()
    took = time.monotonic() - started
    rest, _ = proc.communicate(timeout=60)
    assert (first, rest, proc.returncode) == (b"first\n", b"second\n", 0)
    assert took < 2.5, f"the first line came only after {took:.1f}s"


def test_a_program_that_needs_the_terminal_is_refused_at_a_terminal(agent: Agent) -> None:
    """With a terminal on stdin, an editor or a bare shell would wait for keys nobody can type into a job."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", "sudo vim /etc/hosts; echo status=$?"],
            stdin=follower,
            capture_output=True,
            user=agent.user.pw_uid,
            group=agent.user.pw_gid,
            extra_groups=[],
            env=agent.env(),
            cwd=agent.user.pw_dir,
            timeout=60,
        )
    finally:
        os.close(leader)
        os.close(follower)
    assert b"status=1" in done.stdout
    assert b"sudo: vim needs a terminal: airlock's jobs have no terminal" in done.stderr
    assert agent.pending() == []

"""`sudo` as agents write it, end to end (issue 48): package installs, service restarts, tee with heredocs, pipes.

Each line is typed by a real agent account with no sudo rights, through
``sh -c`` as an agent's tool runs it, with airlock's `sudo` first on its PATH
and a live stack behind it.  The policy (sudo_live.POLICY) allows reads and app
files as root, asks a person for the rest (package installs, services), and
refuses dd and rm -rf.  Where a person is asked, the test's operator approves
or denies; the agent reads sudo's words, and the exit status is the command's
(sudo's own failures exit 1).  Files written under ``$ROOT`` (a folder only
root may write) prove the job ran as root.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from sudo_live import Agent, needs_root, sudo_agent

pytestmark = needs_root


@dataclass(frozen=True)
class Case:
    line: str
    status: int = 0
    text: str = ""  # on stdout or stderr
    person: str | None = None  # the operator's answer: "approve" or "deny"; None: nobody is asked
    files: dict[str, str] = field(default_factory=dict)  # under $ROOT, root's, holding this text


HEREDOC = """sudo tee $ROOT/site.conf > /dev/null <<'EOF'
server {
    listen 80;
}
EOF
sudo cat $ROOT/site.conf"""

CORPUS: list[Case] = [
    # Packages: a person decides.
    Case("sudo apt-get install -y -s bash", 0, "bash", person="approve"),
    Case("sudo apt-get install -y nginx", 1, "sudo: sorry, airlock's policy does not allow", person="deny"),
    Case("sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -s coreutils", 0, "coreutils", person="approve"),
    Case("sudo apt install -y -s bash 2>/dev/null", 0, "bash", person="approve"),
    Case("sudo apt-get -y remove nginx", 1, "sorry", person="deny"),
    Case("sudo -n apt-get install -y curl", 1, "sudo: a password is required"),
    Case("sudo apt-cache policy bash", 0, "Installed"),
    Case("sudo dpkg-query -W -f='${Package}\\n' bash", 0, "bash"),
    Case("sudo apt-get install -y -s definitely-no-such-package", 100, "Unable to locate package", person="approve"),
    # Services.
    Case("sudo systemctl restart nginx", 1, "sorry", person="deny"),
    Case("sudo systemctl enable --now nginx", 1, "sorry", person="deny"),
    Case("sudo -n systemctl reload nginx", 1, "a password is required"),
    Case("sudo service nginx restart", 1, "sorry", person="deny"),
    Case("sudo journalctl -u nginx -n 50 --no-pager", 1, "sorry", person="deny"),
    # tee, heredocs and redirections: the agent's stdin goes with the request.
    Case(
        "echo 'server_tokens off;' | sudo tee $ROOT/nginx.conf",
        0,
        "server_tokens off;",
        files={"nginx.conf": "server_tokens off;"},
    ),
    Case(
        "echo 'x=1' | sudo tee -a $ROOT/app.env > /dev/null && echo 'y=2' | sudo tee -a $ROOT/app.env >/dev/null",
        0,
        "",
        files={"app.env": "x=1\ny=2\n"},
    ),
    Case(HEREDOC, 0, "listen 80;", files={"site.conf": "server {\n    listen 80;\n}\n"}),
    Case("cat <<EOF | sudo tee $ROOT/motd\nwelcome to $(hostname)\nEOF", 0, "welcome to", files={"motd": "welcome"}),
    Case(
        "printf '%s\\n' a b c | sudo tee $ROOT/list >/dev/null && sudo wc -l $ROOT/list",
        0,
        "3 ",
        files={"list": "a\nb\nc\n"},
    ),
    Case('echo "127.0.0.1 app.local" | sudo tee -a $ROOT/hosts', 0, "app.local", files={"hosts": "app.local"}),
    # sh -c with pipes and redirections.
    Case('sudo sh -c "echo hi > $ROOT/redirect.txt"', 0, "", files={"redirect.txt": "hi"}),
    Case('sudo sh -c "ls / | sort | head -3"', 0, "bin"),
    Case('sudo bash -c "cd $ROOT && echo one > a && cat a"', 0, "one", files={"a": "one"}),
    Case('sudo sh -c "id -u; exit 7"', 7, "0"),
    Case("sudo sh -c 'echo oops >&2; exit 2'", 2, "oops"),
    Case('sudo sh -c "grep -c ^root: /etc/shadow"', 0, "1"),
    Case('sudo sh -c "echo data | tee $ROOT/piped | wc -c"', 0, "5", files={"piped": "data"}),
    # Probes an agent makes before it relies on sudo.
    Case("sudo -n true", 0),
    Case("sudo -n true 2>/dev/null && echo yes || echo no", 0, "yes"),
    Case("sudo -v", 0),
    Case("sudo -nv", 0),
    Case("sudo -l", 0, "may ask airlock"),
    Case("sudo -n -l", 0, "may ask airlock"),
    Case("sudo -l cat", 0, "/usr/bin/cat"),
    Case("sudo -k; sudo -n id -u", 0, "0"),
    Case("sudo -V | head -1", 0, "Sudo version"),
    # Reads only root may make.
    Case("sudo cat /etc/shadow | head -1", 0, "root:"),
    Case("sudo head -n 1 /etc/shadow", 0, "root:"),
    Case("sudo stat -c %U /etc/shadow", 0, "root"),
    Case("sudo whoami", 0, "root"),
    Case("sudo test -r /etc/shadow && echo readable", 0, "readable"),
    Case("sudo ls -la /root", 0, "."),
    # Files and ownership.
    Case(
        "sudo mkdir -p $ROOT/app/conf && sudo touch $ROOT/app/conf/ready && sudo ls $ROOT/app/conf",
        0,
        "ready",
        files={"app/conf/ready": ""},
    ),
    Case("sudo cp /etc/hostname $ROOT/copied && sudo chmod 600 $ROOT/copied && sudo stat -c %a $ROOT/copied", 0, "600"),
    # sed reads a file under /tmp, which others could swap after approval's check: a person decides (issue 27).
    Case(
        "echo a=1 | sudo tee $ROOT/sed.conf >/dev/null && sudo sed -i 's/a=1/a=2/' $ROOT/sed.conf"
        " && cat $ROOT/sed.conf",
        0,
        "a=2",
        person="approve",
    ),
    Case("sudo install -m 0644 /etc/hostname $ROOT/installed && stat -c %U:%a $ROOT/installed", 0, "root:644"),
    Case("sudo ln -sf /etc/hostname $ROOT/link && readlink $ROOT/link", 0, "/etc/hostname"),
    Case("sudo touch $ROOT/mine && sudo chown $(id -un) $ROOT/mine && stat -c %U $ROOT/mine", 0, "alsudo"),
    # As another account.
    Case("sudo -u $(id -un) id -un", 0, "alsudo"),
    Case("sudo -u root id -un", 0, "root"),
    # A rule's run_as (sudo's Runas_Spec) allows nobody and www-data; the job really is theirs.
    Case("sudo -u www-data id -un", 0, "www-data"),
    Case("sudo -u nobody id -un", 0, "nobody"),
    Case("sudo -u '#65534' whoami", 0, "nobody"),
    Case("sudo -u www-data printenv HOME USER", 0, "/var/www\nwww-data"),
    Case("sudo -u nobody cat /etc/shadow", 1, "Permission denied"),
    Case("sudo -u nobody -g nogroup id -gn", 0, "nogroup"),
    # No rule names postgres: a person decides, shown "runs as postgres".
    Case("sudo -u postgres psql -c 'select 1'", 1, "sorry", person="deny"),
    Case("sudo -u nobody touch $ROOT/by-nobody", 1, "Permission denied", person="approve"),
    Case("sudo -u nosuchuser id", 1, "sudo: unknown user nosuchuser"),
    # The environment: env.allow decides, as for airlock run.
    Case("DEBIAN_FRONTEND=noninteractive sudo -E printenv DEBIAN_FRONTEND", 0, "noninteractive"),
    Case("sudo http_proxy=http://proxy:3128 apt-get update", 1, "not allowed to set the following environment"),
    Case("sudo env | grep -c ^HOME=/root", 0, "1"),
    # Refused, with what airlock can do instead.
    Case("sudo -i", 1, "no login shells"),
    Case("sudo -s", 1, "no interactive shells"),
    Case("sudo su -", 1, "does not switch users"),
    Case("sudo su postgres -c psql", 1, "does not switch users"),
    Case("echo hunter2 | sudo -S apt-get update", 1, "there is no password with airlock"),
    Case("sudo -b sleep 10", 1, "background"),
    Case("sudo dd if=/dev/zero of=/dev/null count=1", 1, "denied by policy rule 'never'"),
    Case("sudo rm -rf $ROOT/app", 1, "do not try variants"),
    Case("sudo no-such-command --now", 1, "sudo: no-such-command: command not found"),
    # sudoedit: the file read as root, edited as the agent, written by the runner.
    Case("printf 'listen 8080\\n' | sudoedit $ROOT/allowed/site.conf", 0, "", files={"allowed/site.conf": "8080"}),
    Case(
        "printf 'listen 8080\\n' | sudoedit $ROOT/allowed/s2.conf && "
        "SUDO_EDITOR='sed -i s/8080/8081/' sudoedit $ROOT/allowed/s2.conf && cat $ROOT/allowed/s2.conf",
        0,
        "8081",
    ),
    Case(
        "printf 'x\\n' | sudo -e $ROOT/allowed/same.conf && printf 'x\\n' | sudoedit $ROOT/allowed/same.conf",
        0,
        "unchanged",
    ),
    Case("printf 'x\\n' | sudoedit $ROOT/elsewhere.conf", 1, "left unchanged", person="deny"),
    # Slower than a request stays fresh (limits.freshness_seconds is 3 here): the request is dated when sent.
    Case("(echo early; sleep 4; echo late) | sudo tee $ROOT/late", 0, "late", files={"late": "early\nlate\n"}),
    Case(
        'SUDO_EDITOR="sh -c \'sleep 4; echo slow >> \\"\\$1\\"\' sh" sudoedit $ROOT/allowed/slow.conf',
        0,
        "",
        files={"allowed/slow.conf": "slow"},
    ),
]


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    with sudo_agent() as made:
        yield made


def test_the_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 50


@pytest.mark.parametrize("case", CORPUS, ids=[c.line.splitlines()[0][:60] for c in CORPUS])
def test_agent_line(agent: Agent, case: Case) -> None:
    if case.person is None:
        ran = agent.run(case.line)
        assert agent.pending() == [], "nobody should have been asked"
    else:
        ran, entry = agent.run_deciding(case.line, case.person)
        assert entry["peer"]["user"] == agent.user.pw_name
        as_other = re.match(r"sudo -u (\S+)", case.line)
        account = as_other.group(1) if as_other else "root"
        assert entry["run_as"]["user"] == account, entry["run_as"]  # what the person is shown
    assert ran.code == case.status, ran
    assert case.text in ran.out + ran.err, ran
    for name, text in case.files.items():
        path = agent.root_dir / name
        assert path.stat().st_uid == 0, f"{name} is not root's"
        assert text in path.read_text(), path.read_text()

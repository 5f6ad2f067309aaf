"""sudo's command line, read the way sudo(8) reads it, for the agents' `sudo` (issue 48).

Pure: no I/O.

An agent types ``sudo [-u USER] [-n] [-E] [-D DIR] [--] CMD …`` because that is
the privilege it was trained on.  `parse` reads that line with sudo's own rules
(getopt's ``+`` mode: options stop at the first word that is not one, short
options cluster, ``-uUSER`` and ``-u USER`` are one, long options may be
abbreviated as getopt_long allows, ``VAR=value`` words before the command set
the job's environment) and gives an `Invocation` the front (`cli/sudo.py`)
turns into an airlock request, or raises `Refusal` with sudo's style of
message and a sentence saying what airlock can do instead.  Every option of
sudo 1.9's table is here, accepted or refused with its reason (the
conformance test tests/conformance/test_sudo_options.py walks the table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# The modes a line can ask for.
RUN, LIST, EDIT, VALIDATE, RESET, VERSION, HELP = "run", "list", "edit", "validate", "reset", "version", "help"

_ENV_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_TIMEOUT = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?")
# Programs that are a login, a shell or a screen, not one command: they need the terminal airlock does not give.
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "fish", "csh", "tcsh"})
SCREENS = frozenset({"vi", "vim", "nvim", "nano", "emacs", "less", "more", "top", "htop", "visudo", "vipw", "mc"})
SU = frozenset({"su", "sudo", "sudoedit", "login", "runuser", "pkexec", "doas"})

USAGE = """usage: sudo -h | -K | -k | -V
usage: sudo -v [-Nkn] [-g group] [-u user]
usage: sudo -l [-Nkn] [-g group] [-u user] [command [arg ...]]
usage: sudo [-EHkNn] [-D directory] [-g group] [-T timeout] [-u user] [VAR=value] [--] command [arg ...]
usage: sudo -e [-kNn] [-D directory] [-g group] [-T timeout] [-u user] file ...
(airlock's sudo: each command is a request that airlock's policy allows, an operator approves, or refuses)"""


class Refusal(Exception):
    """A line airlock will not turn into a request: sudo's words, then what airlock can do instead."""

    def __init__(self, message: str, instead: str = "", *, usage: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.instead = instead
        self.usage = usage

    def lines(self) -> list[str]:
        """What the front prints on stderr, each line ``sudo: …`` (sudo's own style)."""
        out = [f"sudo: {self.message}"]
        if self.instead:
            out.append(f"sudo: {self.instead}")
        if self.usage:
            out.append(USAGE)
        return out


@dataclass(frozen=True, slots=True)
class Invocation:
    """What one sudo line asks for, in airlock's terms (nothing resolved or checked against the system yet)."""

    mode: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # VAR=value words before the command
    user: str | None = None  # -u (None: root)
    group: str | None = None  # -g
    preserve_env: bool = False  # -E / --preserve-env
    preserve_names: tuple[str, ...] = ()  # --preserve-env=LIST
    set_home: bool = False  # -H (airlock's jobs always get the target's HOME)
    non_interactive: bool = False  # -n: never wait for a person
    chdir: str | None = None  # -D
    timeout_seconds: int | None = None  # -T
    list_level: int = 0  # -l count


# sudo 1.9's options: (short, long, takes an argument, what airlock does).  `what` is a
# handler name below, or "refuse:" + the reason airlock gives.
_NOTHING_TO_TYPE = "there is no password with airlock: a person (or the policy) approves each request instead"
OPTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("A", "askpass", "", "refuse:-A: " + _NOTHING_TO_TYPE + "; drop -A"),
    ("a", "auth-type", "req", "refuse:-a: airlock has no authentication types; drop -a"),
    ("B", "bell", "", "ignore"),
    (
        "b",
        "background",
        "",
        "refuse:-b: airlock waits for a job and returns its output and exit status;"
        " put it in your own shell's background instead (sudo CMD &), or start a unit: sudo systemd-run CMD",
    ),
    ("C", "close-from", "req", "refuse:-C: airlock's jobs never inherit descriptors; drop -C"),
    ("c", "login-class", "req", "refuse:-c: airlock has no login classes; drop -c"),
    ("D", "chdir", "req", "chdir"),
    ("E", "preserve-env", "opt", "preserve_env"),
    ("e", "edit", "", "edit"),
    ("g", "group", "req", "group"),
    ("H", "set-home", "", "set_home"),
    ("h", "help", "", "help"),
    ("", "host", "req", "refuse:--host: airlock runs commands on this host only; use ssh to reach another"),
    (
        "i",
        "login",
        "",
        "refuse:-i: airlock has no login shells: each request is one command, decided on its own;"
        " run the command itself (sudo CMD), or several in one: sudo sh -c 'CMD1 && CMD2'",
    ),
    ("K", "remove-timestamp", "", "reset_all"),
    ("k", "reset-timestamp", "", "reset"),
    ("l", "list", "", "list"),
    ("N", "no-update", "", "ignore"),
    ("n", "non-interactive", "", "non_interactive"),
    ("P", "preserve-groups", "", "refuse:-P: airlock's jobs run with the target account's own groups; drop -P"),
    ("p", "prompt", "req", "ignore"),
    ("R", "chroot", "req", "refuse:-R: airlock does not run commands in another root directory; drop -R"),
    ("r", "role", "req", "refuse:-r: airlock has no SELinux roles; drop -r"),
    ("S", "stdin", "", "refuse:-S: " + _NOTHING_TO_TYPE + "; drop -S (a command's own input is piped as usual)"),
    (
        "s",
        "shell",
        "",
        "refuse:-s: airlock has no interactive shells: each request is one command, decided on its"
        " own; run the command itself (sudo CMD), or several in one: sudo sh -c 'CMD1 && CMD2'",
    ),
    ("T", "command-timeout", "req", "timeout"),
    ("t", "type", "req", "refuse:-t: airlock has no SELinux types; drop -t"),
    ("U", "other-user", "req", "refuse:-U: airlock answers only for the account that asks; drop -U"),
    ("u", "user", "req", "user"),
    ("V", "version", "", "version"),
    ("v", "validate", "", "validate"),
)
_BY_SHORT = {short: row for row in OPTIONS for short in [row[0]] if short}
_LONG_NAMES = tuple(row[1] for row in OPTIONS)


def _long(word: str) -> tuple[tuple[str, str, str, str], str | None]:
    """A ``--name[=value]`` word: its row (getopt_long's unique prefixes too) and attached value."""
    name, eq, value = word[2:].partition("=")
    exact = [row for row in OPTIONS if row[1] == name]
    found = exact or ([row for row in OPTIONS if row[1].startswith(name)] if name else [])
    if len(found) != 1:
        what = "ambiguous" if len(found) > 1 else "unrecognized"
        raise Refusal(f"{what} option '--{name}'", usage=True)
    return found[0], (value if eq else None)


def parse(argv: list[str], *, program: str = "sudo") -> Invocation:
    """sudo's command line (without argv[0]) as an `Invocation`; `Refusal` for what airlock will not do.

    ``program`` is the name it was called by: ``sudoedit`` is ``sudo -e``.
    """
    fields: dict[str, object] = {}
    modes: list[str] = [EDIT] if program == "sudoedit" else []
    lists = 0
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-") or word == "-":
            break
        if word.startswith("--"):
            row, value = _long(word)
            if row[2] == "req" and value is None:
                if i + 1 >= len(argv):
                    raise Refusal(f"option '--{row[1]}' requires an argument", usage=True)
                i += 1
                value = argv[i]
            elif row[2] == "" and value is not None:
                raise Refusal(f"option '--{row[1]}' doesn't allow an argument", usage=True)
            lists += _apply(row, value, fields, modes)
            i += 1
            continue
        j = 1
        while j < len(word):
            letter = word[j]
            row_or_none = _BY_SHORT.get(letter)
            if row_or_none is None:
                raise Refusal(f"invalid option -- '{letter}'", usage=True)
            row = row_or_none
            value = None
            if letter == "h" and j + 1 < len(word):
                raise Refusal("-h HOST: airlock runs commands on this host only; use ssh to reach another")
            if row[2] == "req":
                value = word[j + 1 :]
                if not value:
                    if i + 1 >= len(argv):
                        raise Refusal(f"option requires an argument -- '{letter}'", usage=True)
                    i += 1
                    value = argv[i]
                j = len(word)
            else:
                j += 1
            lists += _apply(row, value, fields, modes)
        i += 1
    rest = argv[i:]
    return _finish(rest, fields, sorted(set(modes)), lists, program)


def _apply(row: tuple[str, str, str, str], value: str | None, fields: dict[str, object], modes: list[str]) -> int:
    """One option's effect on the fields and modes; returns 1 for each -l (it counts)."""
    what = row[3]
    if what.startswith("refuse:"):
        raise Refusal(what[len("refuse:") :])
    if what == "ignore":
        return 0
    if what in ("edit", "help", "version", "validate", "reset_all"):
        modes.append({"reset_all": RESET}.get(what, what))
        return 0
    if what == "list":
        modes.append(LIST)
        return 1
    if what == "reset":
        fields["reset"] = True
        return 0
    if what == "preserve_env":
        if value is None:
            fields["preserve_env"] = True
        else:
            names = tuple(n for n in value.split(",") if n)
            fields["preserve_names"] = tuple(fields.get("preserve_names", ())) + names  # type: ignore[arg-type]
        return 0
    if what in ("set_home", "non_interactive"):
        fields[what] = True
        return 0
    assert value is not None
    if what == "timeout":
        fields["timeout_seconds"] = parse_timeout(value)
    elif what == "chdir":
        fields["chdir"] = value
    else:  # user, group
        if not value:
            raise Refusal(f"option '--{row[1]}' requires a non-empty argument", usage=True)
        fields[what] = value
    return 0


def parse_timeout(value: str) -> int:
    """sudo's ``-T``: seconds, or ``[[[[d]h]m]s]`` (``1h30m``, ``90s``, ``2d``)."""
    found = _TIMEOUT.fullmatch(value) if value else None
    if found is None or not any(found.groups()):
        raise Refusal(f"invalid timeout value: {value!r}", "give seconds, or a span like 90s, 5m, 1h30m")
    d, h, m, s = (int(x) if x else 0 for x in found.groups())
    seconds = ((d * 24 + h) * 60 + m) * 60 + s
    if seconds <= 0:
        raise Refusal(f"invalid timeout value: {value!r}", "give a timeout of one second or more")
    return seconds


def _finish(rest: list[str], fields: dict[str, object], modes: list[str], lists: int, program: str) -> Invocation:
    reset = bool(fields.pop("reset", False))
    if len(modes) > 1:
        names = {EDIT: "-e", HELP: "-h", VERSION: "-V", VALIDATE: "-v", RESET: "-K", LIST: "-l"}
        raise Refusal(f"Only one of the {', '.join(names[m] for m in modes)} options may be specified", usage=True)
    mode = modes[0] if modes else None
    if mode in (HELP, VERSION, RESET) and (rest or fields or reset or lists):
        raise Refusal("-h, -K and -V take no other options and no command", usage=True)
    if mode in (HELP, VERSION, RESET):
        return Invocation(mode)
    if mode == VALIDATE:
        if rest:
            raise Refusal("-v takes no command", usage=True)
        return Invocation(VALIDATE, non_interactive=bool(fields.get("non_interactive")))
    env: list[tuple[str, str]] = []
    if mode != EDIT:
        while rest and _ENV_WORD.match(rest[0]):
            name, _, value = rest[0].partition("=")
            env.append((name, value))
            rest = rest[1:]
    if mode is None:
        if not rest:
            if reset:
                return Invocation(RESET)  # `sudo -k` alone: forget cached credentials (there are none)
            raise Refusal("a command is required", usage=True)
        mode = RUN
    if mode == EDIT and not rest:
        raise Refusal(f"{program}: a file to edit is required", usage=True)
    if mode == RUN:
        _check_command(rest)
    return Invocation(
        mode,
        command=tuple(rest),
        env=tuple(env),
        user=fields.get("user"),  # type: ignore[arg-type]
        group=fields.get("group"),  # type: ignore[arg-type]
        preserve_env=bool(fields.get("preserve_env")),
        preserve_names=tuple(fields.get("preserve_names", ())),  # type: ignore[arg-type]
        set_home=bool(fields.get("set_home")),
        non_interactive=bool(fields.get("non_interactive")),
        chdir=fields.get("chdir"),  # type: ignore[arg-type]
        timeout_seconds=fields.get("timeout_seconds"),  # type: ignore[arg-type]
        list_level=lists,
    )


def _check_command(command: list[str]) -> None:
    """Commands that are a switch of user (su and its kin), never one command airlock can decide."""
    name = command[0].rsplit("/", 1)[-1]
    if name in SU:
        raise Refusal(
            f"{name}: airlock does not switch users or open login sessions: each request is one command, "
            "decided on its own",
            "run the command itself (sudo CMD), as another account with sudo -u ACCOUNT CMD",
        )


def needs_terminal(command: tuple[str, ...]) -> str | None:
    """Why ``command`` needs a terminal (an interactive shell, an editor, a pager), or None.

    The front asks only when its stdin is a terminal: airlock's jobs have no
    terminal, so such a program would wait for input nobody can type.
    """
    if not command:
        return None
    name = command[0].rsplit("/", 1)[-1]
    if name in SHELLS and not any(arg == "-c" or (arg.startswith("-") and "c" in arg[1:]) for arg in command[1:]):
        if len(command) == 1 or command[1].startswith("-"):
            return f"{name} without -c is an interactive shell"
    if name in SCREENS:
        return f"{name} needs a terminal"
    return None

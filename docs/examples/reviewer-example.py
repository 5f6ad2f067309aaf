#!/usr/bin/python3 -I
"""An example airlock reviewer (approval.reviewer_command; docs/policy.md, "The reviewer").

It reads one request's statement as JSON on stdin and prints one JSON line:
{"decision": "allow" | "deny" | "ask", "reason": "..."}.

- deny anything that names /etc/shadow or /etc/gshadow (an argument, a path,
  a file operation), however the path is spelled;
- allow read-only `systemctl status` and `journalctl` for any unit, when every
  stage of the pipeline is one of those: journalctl's arguments are resolved
  as its getopt_long resolves them (abbreviations, combined short options),
  then only an exact allowlist of options passes;
- ask a person about everything else.

Where its answer decides is the policy's business (a rule's `reviewer:`), not
this script's: the same answer on a rule without `reviewer: allow` is only
shown to operators.  Install it root-owned and not writable by anyone else
(the runner refuses it otherwise), outside /etc/airlock (hidden from the
reviewer's sandbox), e.g. /usr/local/lib/airlock/reviewer.
"""

import json
import os.path
import re
import sys

SECRETS = ("/etc/shadow", "/etc/gshadow")

# A reviewer must read argv as the program will (docs/policy.md): journalctl parses it with
# getopt_long, which takes any unambiguous abbreviation of a long option (--rot is --rotate,
# --director=X is --directory=X), combined short options (-rD DIR is -r -D DIR), a short
# option's value attached or in the next argument, and options after the matches.  So the
# example resolves every argument with journalctl's own option table first, then allows only
# options on an exact allowlist.  The table is systemd 252's (src/journal/journalctl.c,
# Debian 12): long name -> 0 (no value), 1 (a value: =X or the next argument), 2 (only =X).
JOURNALCTL_LONG = {
    "help": 0, "version": 0, "no-pager": 0, "pager-end": 0, "follow": 0, "force": 0, "output": 1,
    "all": 0, "full": 0, "no-full": 0, "lines": 2, "no-tail": 0, "new-id128": 0, "quiet": 0,
    "merge": 0, "this-boot": 0, "boot": 2, "list-boots": 0, "dmesg": 0, "system": 0, "user": 0,
    "directory": 1, "file": 1, "root": 1, "image": 1, "header": 0, "identifier": 1, "priority": 1,
    "facility": 1, "grep": 1, "case-sensitive": 2, "setup-keys": 0, "interval": 1, "verify": 0,
    "verify-key": 1, "disk-usage": 0, "cursor": 1, "cursor-file": 1, "after-cursor": 1,
    "show-cursor": 0, "since": 1, "until": 1, "unit": 1, "user-unit": 1, "field": 1, "fields": 0,
    "catalog": 0, "list-catalog": 0, "dump-catalog": 0, "update-catalog": 0, "reverse": 0,
    "machine": 1, "utc": 0, "flush": 0, "relinquish-var": 0, "smart-relinquish-var": 0, "sync": 0,
    "rotate": 0, "vacuum-size": 1, "vacuum-files": 1, "vacuum-time": 1, "no-hostname": 0,
    "output-fields": 1, "namespace": 1,
}  # fmt: skip
# Its short options ("hefo:aln::qmb::kD:p:g:c:S:U:t:u:NF:xrM:"), each as the long option it is.
JOURNALCTL_SHORT = {
    "h": "help", "e": "pager-end", "f": "follow", "o": "output", "a": "all", "l": "full", "n": "lines",
    "q": "quiet", "m": "merge", "b": "boot", "k": "dmesg", "D": "directory", "p": "priority", "g": "grep",
    "c": "cursor", "S": "since", "U": "until", "t": "identifier", "u": "unit", "N": "fields", "F": "field",
    "x": "catalog", "r": "reverse", "M": "machine",
}  # fmt: skip
# The options a read-only journalctl may use, exactly (after resolution).  Everything else asks:
# what writes or deletes (--rotate, --vacuum-*, --flush, --sync, --relinquish-var, --setup-keys,
# --update-catalog, --cursor-file), follows forever (--follow) or reads another root or machine
# (--directory, --file, --root, --image, --machine), and whatever a new journalctl may add.
JOURNALCTL_READ_ONLY = frozenset(
    {
        "help", "version", "no-pager", "pager-end", "output", "all", "full", "no-full", "lines", "no-tail",
        "quiet", "merge", "boot", "list-boots", "dmesg", "system", "user", "header", "identifier", "priority",
        "facility", "grep", "case-sensitive", "verify", "disk-usage", "cursor", "after-cursor", "show-cursor",
        "since", "until", "unit", "user-unit", "field", "fields", "catalog", "list-catalog", "dump-catalog",
        "reverse", "utc", "no-hostname", "output-fields", "namespace",
    }
)  # fmt: skip
# systemctl status: only these arguments that start with "-", spelled exactly (no abbreviation,
# no combination), so the program reads them as the example does; anything else asks.
SYSTEMCTL_STATUS_OPTIONS = frozenset({"--no-pager", "--full", "-l", "--all", "-a", "--quiet", "-q", "--no-legend"})


# -n and -b without a value read the next argument as their value when it parses (journalctl.c).
NEXT_IF_NUMBER = frozenset({"lines", "boot"})
NUMBER = re.compile(r"all|[+-]?[0-9]+")


def names_secret(text: str) -> bool:
    for word in text.replace("=", " ").split():
        if word.startswith("/") and os.path.normpath(word).startswith(SECRETS):
            return True
    return any(secret in text for secret in SECRETS)


def getopt_long(args: list, short: dict, long: dict) -> list | None:
    """The options ``args`` gives, as glibc's getopt_long resolves them: [(long name, value)], or None
    where the program would refuse the command line (unknown, ambiguous, a value missing or unwanted).

    Exact long names win, else a unique prefix; short options combine (-rD DIR) and take a value
    attached (-DDIR) or as the next argument (-D DIR; an optional value only attached); arguments
    that are no option are skipped (getopt permutes them); ``--`` ends the options.
    """
    out, index = [], 0
    while index < len(args):
        arg = args[index]
        index += 1
        if arg == "--":
            break
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            hits = [name] if name in long else [n for n in long if n.startswith(name)]
            if not name or len(hits) != 1:
                return None
            full = hits[0]
            takes = long[full]
            if takes == 0 and eq:
                return None
            if takes == 1 and not eq:
                if index >= len(args):
                    return None
                value, index = args[index], index + 1
            elif takes == 2 and not eq and full in NEXT_IF_NUMBER and index < len(args):
                if NUMBER.fullmatch(args[index]):
                    value, index, eq = args[index], index + 1, "="
            out.append((full, value if (eq or takes == 1) else None))
        elif arg.startswith("-") and arg != "-":
            at = 1
            while at < len(arg):
                letter = arg[at]
                at += 1
                if letter not in short:
                    return None
                full = short[letter]
                takes = long[full]
                if takes == 0:
                    out.append((full, None))
                    continue
                rest = arg[at:]
                if rest:
                    out.append((full, rest))
                elif takes == 1:
                    if index >= len(args):
                        return None
                    out.append((full, args[index]))
                    index += 1
                else:
                    value = None
                    # journalctl's own rule: -n / -b without a value take the next argument when it is
                    # a count or a boot offset (-n 20, -b -1).
                    if index < len(args) and full in NEXT_IF_NUMBER and NUMBER.fullmatch(args[index]):
                        value, index = args[index], index + 1
                    out.append((full, value))
                break
    return out


def read_only(stage: dict) -> str | None:
    """Why this stage is read-only, or None."""
    argv = stage.get("argv") or []
    binary = stage.get("binary") or ""
    args = argv[1:]
    if binary == "/usr/bin/systemctl":
        if any(a.startswith("-") and a not in SYSTEMCTL_STATUS_OPTIONS for a in args):
            return None
        verbs = [a for a in args if not a.startswith("-")]
        return "systemctl status" if verbs[:1] == ["status"] else None
    if binary == "/usr/bin/journalctl":
        options = getopt_long(args, JOURNALCTL_SHORT, JOURNALCTL_LONG)
        if options is None or any(name not in JOURNALCTL_READ_ONLY for name, _ in options):
            return None
        return "journalctl (read-only options)"
    return None


def answer(statement: dict) -> tuple[str, str]:
    texts = [statement.get("command") or ""]
    texts += [arg for stage in statement.get("stages") or [] for arg in stage.get("argv") or []]
    file = statement.get("file") or {}
    texts.append(file.get("path") or "")
    if any(names_secret(text) for text in texts):
        return "deny", "touches /etc/shadow or /etc/gshadow"
    stages = statement.get("stages") or []
    if stages and not file:
        why = [read_only(stage) for stage in stages]
        if all(why):
            return "allow", "read-only: " + ", ".join(sorted(set(w for w in why if w)))
    return "ask", "not on the reviewer's list"


def main() -> int:
    try:
        statement = json.load(sys.stdin)
        decision, reason = answer(statement)
    except Exception as exc:  # anything unexpected: a person decides
        decision, reason = "ask", f"reviewer error: {type(exc).__name__}"
    print(json.dumps({"decision": decision, "reason": reason}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

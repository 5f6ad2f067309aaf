#!/usr/bin/python3 -I
"""An example airlock reviewer (approval.reviewer_command; docs/policy.md, "The reviewer").

It reads one request's statement as JSON on stdin and prints one JSON line:
{"decision": "allow" | "deny" | "ask", "reason": "..."}.

- deny anything that names /etc/shadow or /etc/gshadow (an argument, a path,
  a file operation), however the path is spelled;
- allow read-only `systemctl status` and `journalctl` for any unit, when every
  stage of the pipeline is one of those;
- ask a person about everything else.

Where its answer decides is the policy's business (a rule's `reviewer:`), not
this script's: the same answer on a rule without `reviewer: allow` is only
shown to operators.  Install it root-owned and not writable by anyone else
(the runner refuses it otherwise), outside /etc/airlock (hidden from the
reviewer's sandbox), e.g. /usr/local/lib/airlock/reviewer.
"""

import json
import os.path
import sys

SECRETS = ("/etc/shadow", "/etc/gshadow")
# journalctl options that write, delete, follow forever or read another root.
JOURNALCTL_NOT_READ_ONLY = (
    "--rotate",
    "--vacuum",
    "--flush",
    "--sync",
    "--relinquish-var",
    "--smart-relinquish-var",
    "--setup-keys",
    "--update-catalog",
    "--cursor-file",
    "--follow",
    "-f",
    "--root",
    "--image",
    "--directory",
    "-D",
    "--file",
)
# systemctl options that reach somewhere else.
SYSTEMCTL_ELSEWHERE = ("--root", "--host", "-H", "--machine", "-M", "--image")


def names_secret(text: str) -> bool:
    for word in text.replace("=", " ").split():
        if word.startswith("/") and os.path.normpath(word).startswith(SECRETS):
            return True
    return any(secret in text for secret in SECRETS)


def read_only(stage: dict) -> str | None:
    """Why this stage is read-only, or None."""
    argv = stage.get("argv") or []
    binary = stage.get("binary") or ""
    args = argv[1:]
    if binary == "/usr/bin/systemctl":
        if any(a.startswith(SYSTEMCTL_ELSEWHERE) for a in args):
            return None
        verbs = [a for a in args if not a.startswith("-")]
        return "systemctl status" if verbs[:1] == ["status"] else None
    if binary == "/usr/bin/journalctl":
        if any(a.startswith(JOURNALCTL_NOT_READ_ONLY) for a in args):
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

"""The `airlock` command: a thin client of the two front doors.

Agents use `airlock run` (agent.sock); operators use the other commands
(operator.sock).  ``--json`` prints the daemon's envelope verbatim.  Exit
codes for operator commands: 0 success, 1 a daemon error or negative outcome,
2 usage.  `airlock run` exits with the command's own code (see its help).

This module assembles the parser and dispatches; each command group lives in
its own module (agentcmds, operator, events, tokens, policy, audit, watch,
dev, fleet, remote, signing), and cli/quick.py is `airlock run`'s short path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airlock import __version__

# Only what every command needs is imported here: `airlock run` is on an
# agent's hot path, and each command imports the rest when it runs.
from airlock.cli import agentcmds, agenthooks, events, fleet, operator, passkey, passkeyfleet, running, show, tokens
from airlock.cli import output as output_cli
from airlock.cli import policy as policy_cli
from airlock.cli.devargs import dev_up_arguments
from airlock.common.validate import parse_duration
from airlock.gateway import cli as gateway_cli
from airlock.mcp import cli as mcp_cli


def _stats(ns: argparse.Namespace) -> int:
    from airlock.cli import stats

    return stats.cmd_stats(ns)


def _policy_suggest(ns: argparse.Namespace) -> int:
    from airlock.cli import suggest

    return suggest.cmd_policy_suggest(ns)


def cmd_dev_up(ns: argparse.Namespace) -> int:
    from airlock.cli import dev

    return dev.up(Path(ns.runtime_dir), Path(ns.config) if ns.config else None, web=ns.web)


# --- the parser -------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="airlock",
        description="airlock: a privileged-command gateway for AI agents. Agents ask with `airlock run`; "
        "operators approve, audit and steer with the other commands.",
    )
    p.add_argument("--version", action="version", version=f"airlock {__version__}")
    # reference/004: "`--json` on any command" -- so also before the command
    # (`airlock --json status`); a dest of its own, since a subcommand's
    # default would overwrite a shared one.
    p.add_argument(
        "--json", dest="global_json", action="store_true", help="print the daemon's response envelopes verbatim"
    )
    fleet.add_global_arguments(p)
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    def op(name: str, help_text: str) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_text, description=help_text)
        sp.add_argument(
            "--socket", help="operator socket (default: $AIRLOCK_OPERATOR_SOCKET, else /run/airlock/operator.sock)"
        )
        sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
        return sp

    run = sub.add_parser(
        "run",
        help="run a command through airlock",
        description="Send a command to airlock and run it once policy or an operator approves. "
        "Exit status: the command's own (128+N if killed by signal N); 126 denied; 124 approval timed out; "
        "125 any airlock error.",
    )
    run.add_argument("--socket", help="agent socket (default: $AIRLOCK_SOCKET, else /run/airlock/agent.sock)")
    run.add_argument("--no-privilege", action="store_true", help="run as yourself instead of root")
    run.add_argument("--user", metavar="ACCOUNT", help="run as this account instead of root (a rule's run_as)")
    run.add_argument("--reason", help="why, for the operator and the audit record")
    run.add_argument("--session", help="your session name (policy may match it)")
    run.add_argument("--cwd", help="working directory (absolute)")
    run.add_argument("--env", action="append", metavar="NAME=VALUE", help="set an allowed environment variable")
    run.add_argument(
        "--timeout", type=_duration, metavar="DURATION", help="kill the command after this long: 90, 90s, 5m, 2h"
    )
    run.add_argument(
        "--operation-id",
        help="a stable ID: a retry with the same ID replays instead of running twice "
        "(default: a fresh ID for each call, so the same command typed twice runs twice)",
    )
    run.add_argument(
        "--token-file",
        metavar="FILE",
        help="read the session token from FILE (yours, mode 600); default: $AIRLOCK_TOKEN",
    )
    # Refused with an explanation: a token on the command line is readable by every local user.
    run.add_argument("--token", help=argparse.SUPPRESS)
    run.add_argument("--json", action="store_true", help="print the response envelope verbatim")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    run.set_defaults(func=agentcmds.cmd_run)

    can = sub.add_parser(
        "can",
        help="ask what the policy would do with a command (an agent's `sudo -l`); nothing runs",
        description="Ask airlock what it would do with this command if you ran it: run it at once, ask an "
        "operator, refuse it, or not find it; which rule decides and why.  Nothing runs and nothing is "
        "journaled.  Exit status: 0 it would run at once; 1 an operator would be asked; 126 it would be "
        "refused; 127 a program was not found; 125 any airlock error.",
    )
    can.add_argument("--socket", help="agent socket (default: $AIRLOCK_SOCKET, else /run/airlock/agent.sock)")
    can.add_argument("--no-privilege", action="store_true", help="ask about running it as yourself, not root")
    can.add_argument("--user", metavar="ACCOUNT", help="ask about running it as this account (a rule's run_as)")
    can.add_argument("--session", help="your session name (policy may match it)")
    can.add_argument("--cwd", help="working directory (absolute)")
    can.add_argument("--env", action="append", metavar="NAME=VALUE", help="an environment variable you would set")
    can.add_argument("--token-file", metavar="FILE", help="read the session token from FILE (default: $AIRLOCK_TOKEN)")
    can.add_argument("--json", action="store_true", help="print the response envelope verbatim")
    can.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")
    can.set_defaults(func=agentcmds.cmd_can, reason=None, timeout=None, operation_id=None, token=None)

    hook = sub.add_parser(
        "agent-hook",
        help="the hook an agent's tool runs before a shell command: allows airlock's sudo, blocks any other",
        description="Read the JSON hook payload of Claude Code (PreToolUse/PermissionRequest), Codex "
        "(PermissionRequest) or Gemini CLI (BeforeTool) on stdin and answer it: a command typing sudo is "
        "allowed when airlock's sudo is first on PATH, denied otherwise; unreadable input is blocked (exit 2). "
        "docs/agents.md has the settings for each agent.",
    )
    hook.add_argument("agent", choices=agenthooks.AGENTS)
    hook.add_argument("--agent-bin", default=agenthooks.AGENT_BIN, help="where airlock's sudo is installed")
    hook.set_defaults(func=lambda ns: agenthooks.main(ns.agent, ns.agent_bin))

    op("status", "show whether airlock is on hold and how much is pending").set_defaults(func=operator.cmd_status)
    op("pending", "list requests waiting for an operator").set_defaults(func=operator.cmd_pending)
    op("running", "list the jobs running now (what kill takes)").set_defaults(func=running.cmd_running)
    for verb, text in (("approve", "approve a pending request"), ("deny", "deny a pending request")):
        sp = op(verb, text)
        sp.add_argument(
            "id", help="the whole request ID (on a terminal also a unique prefix of a pending one: shown, then asked)"
        )
        sp.add_argument("--reason", help="recorded in the audit journal")
        sp.add_argument(
            "--expect",
            metavar="DIGEST",
            help="act only if the request pending under ID is the one this digest names (every approve line has it)",
        )
        sp.add_argument("--yes", "-y", action="store_true", help="on a terminal: do not show the request and ask")
        signed = sp.add_mutually_exclusive_group()
        signed.add_argument(
            "--sign",
            metavar="KEYFILE",
            help="sign the request's statement with this OpenSSH key (ssh-keygen -Y sign) and submit it",
        )
        signed.add_argument(
            "--signature",
            metavar="FILE",
            help="submit a signature made elsewhere over `airlock statement ID` ('-': stdin)",
        )
        sp.add_argument("--principal", help="the signer's principal in allowed_signers (default: found from the key)")
        if verb == "approve":
            sp.add_argument(
                "--grant",
                metavar="DURATION",
                help="also let the same requester run this again without asking for this long (90s, 30m, 8h)",
            )
            sp.add_argument(
                "--scope",
                choices=("command", "rule"),
                default="command",
                help="what the grant covers: the exact same command (default) or anything the rule allows",
            )
            sp.add_argument(
                "--uses",
                type=_uses,
                metavar="N",
                help="with --grant: the grant is used up after N requests (it still ends at its time)",
            )
        sp.set_defaults(func=operator.cmd_decide, verb=verb)
    sp = op("grants", "list live time-boxed grants, or revoke one (grants revoke GRANT_ID)")
    sp.add_argument("action", nargs="?", choices=("list", "revoke"), default="list")
    sp.add_argument("grant_id", nargs="?")
    sp.add_argument("--reason", help="recorded in the audit journal")
    sp.set_defaults(func=operator.cmd_grants)
    sp = op("statement", "print the exact statement a signer signs to approve (or deny) a pending request")
    sp.add_argument("id", help="the whole request ID")
    sp.add_argument("--expect", metavar="DIGEST", help="only if the request pending under ID is the one it names")
    sp.add_argument("--deny", action="store_true", help="the statement that denies it")
    sp.set_defaults(func=operator.cmd_statement)
    sp = op("hold", "make every request wait for an operator (emergency brake)")
    sp.add_argument("--reason", required=True)
    sp.set_defaults(func=operator.cmd_hold)
    op("release", "lift a hold").set_defaults(func=operator.cmd_release)
    sp = op("events", "show the audit events feed")
    sp.add_argument("--after", type=int, help="events after this sequence number")
    sp.add_argument("--tail", type=int, help="the newest N events (wins over --after)")
    sp.add_argument("--limit", type=int, help="at most this many per page (1-256, default 64)")
    sp.add_argument("--follow", "-f", action="store_true", help="keep printing new events as they come")
    sp.add_argument("--interval", type=float, default=1.0, help=argparse.SUPPRESS)
    sp.set_defaults(func=events.cmd_events)
    sp = op("show", "a request's whole story: who, what, why, decision, outcome, events")
    sp.add_argument("ref", help="request ID, operation ID, or a unique prefix of a pending request's ID")
    sp.add_argument("--output", action="store_true", help="print the job's stored output (redacted, checked)")
    sp.add_argument(
        "--stdin",
        action="store_true",
        help="print a pending request's whole stdin (operators only; escaped on a terminal, raw into a pipe)",
    )
    sp.set_defaults(func=show.cmd_show)
    sp = op("logs", "a job's output; with --follow, a running job's output as it comes, until it ends")
    sp.add_argument("ref", help="request ID or operation ID")
    sp.add_argument("--follow", "-f", action="store_true", help="stream a running job's output until it ends")
    sp.set_defaults(func=output_cli.cmd_logs)
    sp = op("cancel", "cancel an operation (deny it if pending, stop it if running)")
    sp.add_argument("operation_id")
    sp.add_argument("--reason", help="recorded in the audit journal")
    sp.set_defaults(func=operator.cmd_cancel)
    sp = op("kill", "signal a running job: the whole job (its units' cgroups, or its process groups)")
    sp.add_argument("ref", help="the running job's request ID or operation ID (AGENT/ID when agents share it)")
    sp.add_argument("--signal", "-s", default=None, help="TERM (default), KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT")
    sp.add_argument("--reason", help="recorded in the audit journal")
    sp.set_defaults(func=operator.cmd_kill)
    sp = op("wait", "block until an operation settles; exit 0 only if it ran and exited 0")
    sp.add_argument("operation_id", help="operation ID (or request ID)")
    sp.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (exit 1)")
    sp.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    sp.set_defaults(func=operator.cmd_wait)
    sp = op("watch", "live approval console: y approves, any other key denies")
    fleet.add_watch_arguments(sp)
    sp.set_defaults(func=operator.cmd_watch)

    token = sub.add_parser("token", help="issue and revoke agents' session tokens")
    token_sub = token.add_subparsers(dest="token_command", metavar="SUBCOMMAND", required=True)
    for name, text in (
        ("issue", "issue a token for a session (printed alone on stdout)"),
        ("revoke", "revoke one token, or every token of a session"),
    ):
        sp = token_sub.add_parser(name, help=text, description=text)
        sp.add_argument("--socket", help="operator socket")
        sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
        sp.add_argument("--reason", help="recorded in the audit journal")
        if name == "issue":
            sp.add_argument("--session", required=True, help="the session name the token stands for")
            sp.add_argument(
                "--user",
                required=True,
                help="the agent account (name or uid) the token is for; no other uid can use it",
            )
            sp.add_argument("--ttl", default="1h", help="lifetime: 90s, 30m, 1h, 2d (default 1h)")
        else:
            sp.add_argument("token", nargs="?", help="the token to revoke")
            sp.add_argument("--session", help="revoke every token of this session")
        sp.set_defaults(func=tokens.cmd_token)

    pk = sub.add_parser("passkey", help="operators' passkeys for the web console (enroll, list, revoke, signout)")
    pk_sub = pk.add_subparsers(dest="passkey_command", metavar="SUBCOMMAND", required=True)
    for name, text in (
        ("enroll", "print a one-time link to register a passkey for USER, wait until it is registered"),
        ("list", "list enrolled passkeys (of USER) and their live console sessions"),
        ("revoke", "revoke a passkey at once, ending its console sessions (root, or its own account)"),
        ("signout", "end every web console session of USER now (root, an operator, or USER)"),
    ):
        sp = pk_sub.add_parser(name, help=text, description=text)
        sp.add_argument("--socket", help="operator socket")
        sp.add_argument("--json", action="store_true", help="print the daemon's response envelope verbatim")
        if name == "enroll":
            sp.add_argument("user", help="the operator (or observer) account the passkey will be")
            sp.add_argument("--no-wait", action="store_true", help="print the link and return at once")
        elif name == "list":
            sp.add_argument("user", nargs="?", help="only this account's passkeys")
        elif name == "signout":
            sp.add_argument("user", help="the account whose console sessions end")
            sp.add_argument("--reason", help="recorded in the audit journal")
        else:
            sp.add_argument("credential_id", help="as `airlock passkey list` shows it")
            sp.add_argument("--reason", help="recorded in the audit journal")
        sp.set_defaults(func=passkey.cmd_passkey)
    passkeyfleet.add_parsers(pk_sub)  # issue 49: carry, export, import

    audit = sub.add_parser("audit", help="verify and inspect the audit journal")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="SUBCOMMAND", required=True)
    anchors_help = (
        "journald, an anchors file, or none (default: journald if readable, and the anchors file beside the database)"
    )
    for name, text in (
        (
            "verify",
            "check the hash chain (from the last verified point; --full: all of it) and the database against "
            "its anchors; name the first bad record",
        ),
        ("head", "print the newest sequence number and hash (keep them off the host)"),
        ("export", "print every audit event as JSON lines"),
        ("acknowledge", "accept a mismatch with the anchors and start a new chain segment (journal stopped; root)"),
    ):
        sp = audit_sub.add_parser(name, help=text, description=text)
        if name != "acknowledge":
            sp.add_argument("--socket", help="operator socket")
        if name != "export":
            sp.add_argument("--json", action="store_true")
        if name == "verify":
            sp.add_argument("--from", dest="from_seq", type=int, help="start at this sequence number")
            sp.add_argument("--anchor", help="the hash `airlock audit head` printed for the record at --from")
            sp.add_argument(
                "--full",
                action="store_true",
                help="walk the whole chain (default: from the last verified point), every sealed segment too "
                "(beside the live one and archived), each on its own and linked into one chain",
            )
            sp.add_argument(
                "--lifecycle",
                action="store_true",
                help="also fold every request's events through the lifecycle table and name each "
                "request whose story it forbids",
            )
            fleet.add_verify_arguments(sp)
            sp.add_argument(
                "--segment",
                metavar="FILE",
                help="check one sealed segment file on its own (no daemon needed; read access to the file)",
            )
        if name in ("verify", "acknowledge"):
            sp.add_argument("--anchors", metavar="journald|FILE|none", help=anchors_help)
            sp.add_argument("--config", help="airlock.yaml to read (default /etc/airlock/airlock.yaml)")
        if name == "acknowledge":
            sp.add_argument("--reason", required=True, help="why, recorded in the new segment's first record")
            sp.add_argument("--database", help="the journal database (default: the configured state_dir's)")
        if name == "export":
            sp.add_argument("--since", help="only events at or after this ISO 8601 time")
            sp.add_argument("--format", choices=["jsonl"], default="jsonl", help="output format (jsonl)")
        sp.set_defaults(func=events.cmd_audit)
    sp = audit_sub.add_parser(
        "archive",
        help="list sealed and archived segments; delete what is past the archive's limits (--confirm)",
        description="list sealed and archived segments and what retention would do; with --confirm delete the "
        "archived segments past the archive's limits (journal.archive_delete_when: confirmed), each deletion "
        "journaled with the segment's range and final hash",
    )
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--confirm", action="store_true", help="delete the archived segments past the limits now")
    sp.add_argument(
        "--shipped",
        metavar="SEQ:HASH",
        help="the newest record a collector holds for this host (from `airlock fleet verify`): archived segments "
        "up to it may go when journal.archive_delete_when is shipped",
    )
    sp.set_defaults(func=events.cmd_audit)
    fleet.register_audit(audit_sub)

    policy = sub.add_parser("policy", help="inspect the policy")
    policy_sub = policy.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    sp = policy_sub.add_parser(
        "check",
        help="show the decision for a command without running it, or check the policy files (--files)",
        description="With a command: what the running approval service would decide for it (as --user, "
        "default you; the answer names the user). With --files: the policy on disk (or the PATHs given) "
        "checked without any service, every error printed, exit 1 if any -- run it before a reload.",
    )
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true")
    sp.add_argument(
        "--files",
        nargs="*",
        metavar="PATH",
        default=None,
        help="check these policy files or directories (none: airlock.yaml's policy and policy.d) offline",
    )
    sp.add_argument("--config", help="with --files: configuration file (default: /etc/airlock/airlock.yaml)")
    sp.add_argument("--quiet", action="store_true", help="with --files: print only errors")
    sp.add_argument("--user", help="as this user (default: you)")
    sp.add_argument("--session")
    sp.add_argument("--cwd", help="the request's working directory (rules may pin it)")
    sp.add_argument("--stdin-file", help="the request's stdin, read from this file (rules may pin its sha256)")
    group = sp.add_mutually_exclusive_group()
    group.add_argument("--privileged", dest="privileged", action="store_true", default=True)
    group.add_argument("--no-privilege", dest="privileged", action="store_false")
    sp.add_argument("command", nargs=argparse.REMAINDER)
    sp.set_defaults(func=policy_cli.cmd_policy_check)
    sp = policy_sub.add_parser(
        "shadow",
        help="how each mode: shadow rule's decisions compare with the real ones (from the journal)",
        description="how each mode: shadow rule's decisions compare with the real ones (from the journal)",
    )
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--json", action="store_true")
    sp.add_argument("--since", type=_duration, help="only requests decided in this last while: 24h, 7d")
    sp.set_defaults(func=policy_cli.cmd_policy_shadow)
    sp = policy_sub.add_parser(
        "suggest",
        help="propose allow rules for commands operators approved repeatedly (a file to review; nothing is applied)",
        description="Read the audit journal (root or an operator) and print a policy.d file of allow rules for "
        "the commands operators approved at least --min times: placeholders where arguments varied, a comment "
        "with the counts and who approved.  Never for file operations, pipelines, flagged path arguments or "
        "anything denied in the window.",
    )
    sp.add_argument("--socket", help="operator socket")
    sp.add_argument("--since", default="7d", help="approvals within this long (90m, 24h, 7d; default 7d)")
    sp.add_argument("--min", type=int, default=5, help="approvals a command needs before it is suggested (default 5)")
    sp.add_argument("--output", metavar="FILE", help="write the file here instead of stdout")
    sp.set_defaults(func=_policy_suggest)

    sp = op("stats", "numbers from the journal: decisions, who decided, asks per hour, time to a decision")
    sp.add_argument("--since", default="24h", help="the window: 90m, 24h, 7d (default 24h)")
    sp.set_defaults(func=_stats)

    cfg = sub.add_parser("config", help="show the effective configuration")
    cfg_sub = cfg.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    sp = cfg_sub.add_parser("show", help="print every setting with its effective value")
    sp.add_argument("--config", help="configuration file (default: /etc/airlock/airlock.yaml)")
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=policy_cli.cmd_config_show)
    sp = cfg_sub.add_parser(
        "check", help="check airlock.yaml and the policy files without a running service (exit 1 on errors)"
    )
    sp.add_argument("--config", help="configuration file (default: /etc/airlock/airlock.yaml)")
    sp.add_argument("--quiet", action="store_true", help="print only errors")
    sp.set_defaults(func=policy_cli.cmd_config_check)

    dev = sub.add_parser("dev", help="run the whole stack in the foreground for development")
    dev_sub = dev.add_subparsers(dest="dev_command", metavar="SUBCOMMAND", required=True)
    sp = dev_sub.add_parser("up", help="start all four services with sockets under a runtime folder")
    dev_up_arguments(sp)
    sp.set_defaults(func=cmd_dev_up)
    mcp_cli.register(sub)
    gateway_cli.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    ns = p.parse_args(argv)
    if not getattr(ns, "func", None):
        p.print_help(sys.stderr)
        return 2
    if ns.global_json:
        if not hasattr(ns, "json"):
            p.error(f"--json is not available for {ns.cmd}")
        ns.json = True
    command = getattr(ns, "command", None)
    if isinstance(command, list) and command and command[0] == "--":
        ns.command = command[1:]
    if getattr(ns, "remote_hosts", None):
        from airlock.cli import remote

        return remote.run_remote(ns, sys.argv[1:] if argv is None else argv)
    try:
        return int(ns.func(ns))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())


def _uses(text: str) -> int:
    """--uses: a whole number of uses, 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of uses: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError("--uses must be 1 or more")
    return value


def _duration(text: str) -> float:
    """A duration as every airlock option takes it (90, 90s, 30m, 8h, 2d), or a usage error."""
    try:
        seconds = float(text)
    except ValueError:
        try:
            return parse_duration(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (like 90s, 30m, 8h)")
    return seconds

"""`sudo` and `sudoedit` for agent accounts (issue 48): sudo's command line, sent as an airlock request.

Installed as /usr/lib/airlock/agent-bin/sudo (and sudoedit), first on the PATH
of the agent group's members only (packaging/debian/airlock-agent.sh).  The line
is read by `sudoargs.parse`; a run becomes the very request `airlock run`
sends (`agentcmds.run_args`, `client.call`), with stdin piped along, output
written as it streams, and the command's exit status as ours.  sudo's own
failures (a refusal, a denial, nobody approved, airlock unreachable) are
``sudo: …`` on stderr and exit 1, as sudo's are, each with what airlock can
do instead.
"""

from __future__ import annotations

import argparse
import base64
import os
import pwd
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from airlock import __version__
from airlock.cli import agentcmds, sudoops
from airlock.cli.sudoargs import (
    EDIT,
    HELP,
    LIST,
    RESET,
    USAGE,
    VALIDATE,
    VERSION,
    Invocation,
    Refusal,
    needs_terminal,
    parse,
)
from airlock.cli.sudoedit import edit
from airlock.cli.sudostdin import read_stdin
from airlock.cli.waiting import waiting_message
from airlock.common import client, render, validate
from airlock.common.codec import iso_utc
from airlock.common.envrule import refusal as env_refusal

EXIT_FAILURE = 1  # sudo's own failures


def main(argv: list[str] | None = None, program: str | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    name = program or os.path.basename(sys.argv[0]) or "sudo"
    try:
        return _main(parse(words, program="sudoedit" if name == "sudoedit" else "sudo"))
    except Refusal as refused:
        for line in refused.lines():
            print(line, file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_FAILURE


def _main(inv: Invocation) -> int:
    if inv.mode == HELP:
        print(USAGE)
        return 0
    if inv.mode == VERSION:
        print(f"Sudo version 1.9 (airlock {__version__}: each command is an airlock request)")
        return 0
    if inv.mode in (VALIDATE, RESET):
        return 0  # airlock caches no credentials: nothing to validate, extend or forget
    if inv.mode == EDIT:
        return edit(inv, _request_base(inv, target_for(inv)))
    args = _request_base(inv, target_for(inv))
    if inv.mode == LIST:
        return _list(inv, args)
    return _run(inv, args)


@dataclass(frozen=True, slots=True)
class Target:
    """Whom the job runs as: root, the agent itself (not privileged), or another account (``user``)."""

    privileged: bool
    user: str | None = None  # another account's name (issue 48: a rule's run_as must allow it)


def target_for(inv: Invocation) -> Target:
    """``-u`` and ``-g`` as airlock's request says them (sudo's Runas_Spec: root unless -u).

    As sudo(8) says of ``-g``: without ``-u`` the command runs as the invoking
    user, with that group.
    """
    me = pwd.getpwuid(os.getuid())
    account = me if inv.user is None else _account(inv.user)
    if inv.user is None:
        target = Target(inv.group is None)
    elif account is None:
        raise Refusal(f"unknown user {inv.user}")
    elif account.pw_uid == 0:
        target = Target(True)
    elif account.pw_uid == me.pw_uid:
        target = Target(False)
    else:
        target = Target(True, account.pw_name)
    if inv.group is not None:
        gid = _gid(inv.group)
        if gid is None:
            raise Refusal(f"unknown group {inv.group}")
        own = account.pw_gid if account is not None else -1
        if gid != own:
            raise Refusal(
                f"airlock runs a job with its account's own groups; not as group {inv.group}",
                "drop -g (a job runs with its account's own groups: root's, yours, or the -u account's)",
            )
    return target


def _account(name: str) -> pwd.struct_passwd | None:
    try:
        return pwd.getpwuid(int(name[1:])) if name.startswith("#") else pwd.getpwnam(name)
    except (KeyError, ValueError):
        return None


def _gid(name: str) -> int | None:
    import grp

    try:
        return int(name[1:]) if name.startswith("#") else grp.getgrnam(name).gr_gid
    except (KeyError, ValueError):
        return None


def _namespace(inv: Invocation, target: Target, env: dict[str, str], cwd: str | None) -> argparse.Namespace:
    """`airlock run`'s options for this line: the request is built by the code that builds airlock run's."""
    return argparse.Namespace(
        token=None,
        command=list(inv.command) or ["true"],
        no_privilege=not target.privileged,
        user=target.user,
        reason=os.environ.get("AIRLOCK_REASON") or None,
        session=os.environ.get("AIRLOCK_SESSION") or None,
        cwd=cwd,
        timeout=inv.timeout_seconds,
        env=[f"{k}={v}" for k, v in env.items()],
        operation_id=None,
    )


def _request_base(inv: Invocation, target: Target) -> dict[str, Any]:
    """The exec request's fields but stdin and the operation.

    sudo's cwd is where the agent is, unless -D; a job as another account
    starts in that account's home instead (it may not enter the agent's).
    """
    env = _environment(inv, target.privileged)
    cwd = inv.chdir
    if cwd is None and target.user is None:
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = None
    elif cwd is not None and not cwd.startswith("/"):
        raise Refusal(f"-D {cwd}: give an absolute directory")
    args = agentcmds.run_args(_namespace(inv, target, env, cwd))
    if args is None:
        raise Refusal("could not build the request")
    args.pop("operation_id", None)
    return args


def _environment(inv: Invocation, privileged: bool) -> dict[str, str]:
    """sudo's env_reset, airlock's way: nothing but what the line sets (VAR=value), or -E keeps (env.allow)."""
    env: dict[str, str] = {}
    if inv.preserve_env or inv.preserve_names:
        allow = _hello().get("env_allow") or []
        names = (
            [n for n in os.environ if validate.env_allowed(n, tuple(allow))]
            if inv.preserve_env
            else list(inv.preserve_names)
        )
        for name in names:
            value = os.environ.get(name)
            if value is None:
                continue
            if not validate.env_allowed(name, tuple(allow)) or (privileged and env_refusal(name, value)):
                if inv.preserve_env:
                    continue  # -E keeps what may be kept, as sudo's env_delete drops the rest
                raise Refusal(
                    f"sorry, you are not allowed to preserve the environment variable {name}",
                    f"airlock's env.allow lists what a request may set: {', '.join(allow) or 'nothing'}",
                )
            env[name] = value
    env.update(dict(inv.env))
    return env


_HELLO: dict[str, Any] = {}


def _hello() -> dict[str, Any]:
    """intake's hello (env.allow, the retry window), once per run."""
    if not _HELLO:
        try:
            _raw, reply = client.call(client.agent_socket(None), "hello", {}, token=_token(), timeout=30)
        except client.ClientError as exc:
            raise Refusal(f"airlock is unreachable: {exc}") from None
        _HELLO.update(reply.get("data") or {"env_allow": [], "retry_window_seconds": 600})
    return _HELLO


def _token() -> str | None:
    return os.environ.get("AIRLOCK_TOKEN") or None


def _list(inv: Invocation, args: dict[str, Any]) -> int:
    """``sudo -l [CMD]``: airlock's `can` (nothing runs); without a command, what this account may do."""
    me = pwd.getpwuid(os.getuid()).pw_name
    if not inv.command:
        print(
            f"User {me} may ask airlock to run commands on {socket.gethostname()}:\n"
            "    (root) each command: airlock's policy runs it at once, asks an operator, or refuses it\n"
            f"    ({me}) each command, as yourself: sudo -u {me} CMD\n"
            "Ask about one command with: sudo -l CMD (sudo -ll CMD says which rule decides)"
        )
        return 0
    args.pop("stream", None)
    try:
        _raw, reply = client.call(client.agent_socket(None), "can", args, token=_token(), timeout=60)
    except client.ClientError as exc:
        raise Refusal(f"airlock is unreachable: {exc}") from None
    if not reply.get("ok"):
        return _failed(inv, reply.get("error") or {})
    data = reply.get("data") or {}
    stages = data.get("stages") or []
    if any(s.get("not_found") for s in stages):
        print(f"sudo: {render.sanitise(inv.command[0])}: command not found", file=sys.stderr)
        return EXIT_FAILURE
    if inv.list_level > 1:
        print(agentcmds.explained(data))
    elif data.get("decision") in ("allow", "ask"):
        binary = stages[0].get("binary") if stages else inv.command[0]
        print(" ".join([render.sanitise(binary), *(render.sanitise(a) for a in inv.command[1:])]))
    return 0 if data.get("decision") in ("allow", "ask") else EXIT_FAILURE


def _run(inv: Invocation, args: dict[str, Any]) -> int:
    if os.isatty(0):
        why = needs_terminal(inv.command)
        if why is not None:
            raise Refusal(
                f"{why}: airlock's jobs have no terminal",
                "give the commands themselves (sudo sh -c 'CMD1; CMD2'), or edit a file with sudoedit FILE",
            )
        stdin = None
    else:
        stdin = read_stdin()
    if stdin:
        args["stdin"] = base64.b64encode(stdin).decode()
    if inv.non_interactive:
        args["wait"] = False
    args["join"] = True
    return send(inv, args, stdin)


def send(inv: Invocation, args: dict[str, Any], stdin: bytes | None) -> int:
    """Send the exec request (named for its retries), write its output as it streams; the command's status."""
    hello = _hello()
    window = float(hello.get("retry_window_seconds") or 600)
    now = time.time()
    key = sudoops.intent(
        os.getuid(),
        str(args.get("session") or os.environ.get("AIRLOCK_SESSION") or ""),
        tuple(args["argv"]),
        args.get("cwd"),
        str(args.get("user") or ("root" if args.get("privileged", True) else os.getuid())),
        dict(args.get("env") or {}),
        stdin,
    )
    records = sudoops.load()
    record = sudoops.choose(key, now, window, records)
    records[key] = record
    sudoops.save(records, now, window)
    args["operation_id"] = record.operation_id
    args["time"] = iso_utc()  # fresh: reading stdin may have taken a while
    streamed = False

    def on_event(_raw: bytes, event: dict[str, Any]) -> None:
        nonlocal streamed
        kind = event.get("event")
        if kind == "pending_approval":
            print(f"sudo: {waiting_message(event)}", file=sys.stderr)
        elif kind in ("stdout", "stderr") and isinstance(event.get("data"), str):
            streamed = True
            out = sys.stdout if kind == "stdout" else sys.stderr
            out.buffer.write(base64.b64decode(event["data"]))
            out.flush()

    try:
        _raw, reply = client.call(client.agent_socket(None), "exec", args, token=_token(), on_event=on_event)
    except KeyboardInterrupt:
        _cancel(record.operation_id)  # as sudo forwards SIGINT: withdraw it, or stop the job
        return 130
    except client.ClientError as exc:
        raise Refusal(f"airlock is unreachable: {exc}") from None
    if not reply.get("ok"):
        return _failed(inv, reply.get("error") or {})
    data = reply.get("data") or {}
    if not streamed:  # a replay (the retry of a job that ran while nobody listened), or nothing streamed
        for stage in data.get("stages", []):
            sys.stderr.buffer.write(base64.b64decode(stage.get("stderr") or ""))
        sys.stderr.flush()
        sys.stdout.buffer.write(base64.b64decode(data.get("stdout") or ""))
        sys.stdout.flush()
    records = sudoops.load()
    records[key] = sudoops.Record(record.operation_id, record.started, True, record.seq)
    sudoops.save(records, time.time(), window)
    if data.get("timed_out"):
        print(f"sudo: the command timed out ({data.get('timeout_reason')})", file=sys.stderr)
    return agentcmds.exit_status(data)


def _cancel(operation_id: str) -> None:
    try:
        client.call(client.agent_socket(None), "cancel", {"operation_id": operation_id}, token=_token(), timeout=30)
    except client.ClientError:
        pass


def _failed(inv: Invocation, error: dict[str, Any]) -> int:
    """sudo's words for a request airlock did not run, and what the agent can do instead; exit 1."""
    code = error.get("code")
    message = render.sanitise(error.get("message"))
    details = error.get("details") or {}
    command = render.sanitise(" ".join(inv.command))
    field = str(details.get("field") or "")
    if code == "approval_required":
        lines = [
            "a password is required",
            f"airlock would ask an operator (rule {render.sanitise(details.get('rule'))}) before running this; "
            "without -n, sudo waits for their decision",
        ]
    elif code == "denied":
        lines = [
            f"sorry, airlock's policy does not allow {command}: {message}",
            "nothing ran; do not try variants to get around it (ask the person you work for)",
        ]
    elif code == "approval_timeout":
        lines = [f"nobody approved {command} in time: {message}", "nothing ran; ask again later, or ask a person"]
    elif code == "command_not_found":
        lines = [f"{render.sanitise(inv.command[0] if inv.command else '')}: command not found"]
    elif code == "invalid_arguments" and field.startswith("env."):
        lines = [
            f"sorry, you are not allowed to set the following environment variables: {field[4:]}",
            message,
        ]
    elif code == "withdrawn":
        lines = [f"the request was withdrawn: {message}"]
    else:
        lines = [f"airlock: {code}: {message}"]
    for line in lines:
        print(f"sudo: {line}", file=sys.stderr)
    return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())

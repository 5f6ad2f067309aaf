"""The `airlock` command's entry point: `airlock run` as typed, on a short path (issue 21).

`airlock run -- CMD ...` is on an agent's hot path, and importing the whole
CLI (argparse, the config table, the renderers) costs more than the request
itself.  So the console script starts here: when the command line is a plain
``run`` with only the flags below, it is sent from this module, which imports
nothing but ``sys`` and the C parts of ``os``, ``socket`` and ``json``; anything else (another
command, ``--help``, a flag this path does not know, a malformed value) goes
to `airlock.cli.main` unchanged, which parses and answers it as before.

Same request, same output, same exit codes as `agentcmds.cmd_run` (the tests run
both): the command's own exit code, 126 denied, 124 approval timeout, 125 any
other airlock error.
"""

from __future__ import annotations

import sys

# The C halves of `os`, `socket` and `json` (issue 37): importing the modules
# around them pulls in enum, re, selectors and collections, ~10 ms on a 2-core
# machine against ~7 ms for the interpreter itself (under -S nothing has
# imported them yet).  The parser below is the very scanner json.loads runs;
# the encoder covers what a request holds.
from _json import encode_basestring_ascii as _quote
from _json import make_scanner as _make_scanner
from _socket import AF_UNIX, SOCK_STREAM
from _socket import socket as _socket
from posix import environ as _environ
from posix import urandom as _urandom

# common.client.AGENT_SOCKET, repeated so `run` imports nothing of airlock (a test checks they agree).
AGENT_SOCKET = "/run/airlock/agent.sock"

TYPE_CHECKING = False  # not typing's: importing typing costs ~2 ms, a tenth of this path
if TYPE_CHECKING:
    from typing import Any

EXIT_DENIED = 126
EXIT_APPROVAL_TIMEOUT = 124
EXIT_AIRLOCK_ERROR = 125
MAX_REPLY = 128 * 1024 * 1024  # as client.MAX_REPLY

# Flags the short path takes: name -> the request key (None: a switch handled below).
_VALUED = {
    "--reason": "reason",
    "--session": "session",
    "--cwd": "cwd",
    "--operation-id": "operation_id",
    "--token-file": "token_file",
    "--socket": "socket",
    "--timeout": "timeout",
    "--env": "env",
    "--user": "user",
}
_SWITCHES = ("--no-privilege", "--json")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parsed = _parse_run(args)
    if parsed is None:
        if sys.flags.no_site:
            # The .deb's /usr/bin/airlock runs with -S (fast `run`); the rest of the CLI gets site as usual.
            import site

            site.main()
        if args[:2] == ["dev", "up"] and not {"-h", "--help"} & set(args[2:]):
            # Its own short path (issue 50): the whole stack waits for this process before it starts.
            return _dev_up(args[2:])
        from airlock.cli.main import main as full

        return full(argv)
    try:
        return _run(*parsed)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


def _dev_up(args: list[str]) -> int:
    """`airlock dev up ARGS` without the rest of the CLI, whose imports (every command group's, the
    operator door's typed messages) were ~60 ms of CPU before the first service could start."""
    import argparse
    from pathlib import Path

    from airlock.cli.dev import up
    from airlock.cli.devargs import dev_up_arguments

    parser = argparse.ArgumentParser(prog="airlock dev up", description="run the whole stack in the foreground")
    dev_up_arguments(parser)
    ns = parser.parse_args(args)
    try:
        return up(Path(ns.runtime_dir), Path(ns.config) if ns.config else None, web=ns.web)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # as the full CLI's main
        return 1


def _parse_run(args: list[str]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(options, request args) for a plain `run`, or None for the full CLI to handle."""
    if len(args) < 2 or args[0] != "run":
        return None
    opts: dict[str, Any] = {"json": False, "no_privilege": False, "env": {}}
    i = 1
    while i < len(args):
        word = args[i]
        if word == "--":
            i += 1
            break
        if not word.startswith("-"):
            break
        if word in _SWITCHES:
            opts[word[2:].replace("-", "_")] = True
            i += 1
            continue
        name, eq, value = word.partition("=")
        if name not in _VALUED:
            return None  # --help, a typo, an abbreviation: argparse's answer
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        key = _VALUED[name]
        if key == "env":
            env_name, sep, env_value = value.partition("=")
            if not sep:
                return None  # the full CLI explains it
            opts["env"][env_name] = env_value
        elif key == "timeout":
            try:
                opts["timeout"] = float(value)
            except ValueError:
                return None
        else:
            opts[key] = value
    command = args[i:]
    if not command:
        return None
    request: dict[str, Any] = {"argv": command, "privileged": not opts["no_privilege"], "time": _now()}
    for key in ("reason", "session", "cwd", "user"):
        if opts.get(key):
            request[key] = opts[key]
    if opts.get("timeout"):
        request["timeout_ms"] = int(opts["timeout"] * 1000)
    if opts["env"]:
        request["env"] = opts["env"]
    # A new intent each time, as agentcmds.cmd_run: its own operation ID unless one is given.
    request["operation_id"] = opts.get("operation_id") or f"cli-{_uuid4()}"
    request["stream"] = True
    return opts, request


def _run(opts: dict[str, Any], request: dict[str, Any]) -> int:
    path = opts.get("socket") or _getenv("AIRLOCK_SOCKET") or AGENT_SOCKET
    token = _getenv("AIRLOCK_TOKEN") or None
    if opts.get("token_file"):
        from airlock.common.tokenfile import TokenFileError, read_token_file

        try:
            token = read_token_file(opts["token_file"])
        except TokenFileError as exc:
            _err(str(exc))
            return EXIT_AIRLOCK_ERROR
    envelope = {"v": 1, "id": _uuid4(), "verb": "exec", "args": request, "token": token}
    raw, reply = _call(path, _dumps(envelope).encode() + b"\n", opts["json"])
    if raw is None:
        _err(reply["message"])
        if opts["json"]:
            error = {"code": "daemon_unavailable", "message": reply["message"], "details": {}}
            sys.stdout.write(_dumps({"id": None, "ok": False, "error": error}) + "\n")
            sys.stdout.flush()
        return EXIT_AIRLOCK_ERROR
    if opts["json"]:
        sys.stdout.buffer.write(raw + b"\n")
        sys.stdout.flush()
    if not reply.get("ok"):
        error = reply.get("error") or {}
        code = error.get("code")
        from airlock.cli.exitcodes import for_error, refused_token, wrong_door

        if not opts["json"]:
            _err(f"{code}: {error.get('message')}")
            hint = wrong_door(code, path, operator_command=False) or refused_token(code, token is not None)
            if hint is not None:
                _err(hint)
        return for_error(code)
    data = reply.get("data") or {}
    if not opts["json"]:
        from binascii import a2b_base64

        for stage in data.get("stages", []):
            sys.stderr.buffer.write(a2b_base64(stage.get("stderr") or ""))
        sys.stderr.flush()
        sys.stdout.buffer.write(a2b_base64(data.get("stdout") or ""))
        sys.stdout.flush()
        if data.get("timed_out"):
            _err(f"the command timed out ({data.get('timeout_reason')})")
    return _exit_status(data)


def _call(path: str, line: bytes, quiet: bool) -> tuple[bytes | None, dict[str, Any]]:
    """Send one request line; return the final reply (raw, object), or (None, {"message": why})."""
    sock = _socket(AF_UNIX, SOCK_STREAM)
    try:
        try:
            sock.connect(path)
        except FileNotFoundError:
            return None, {
                "message": f"no airlock socket at {path} (is airlock running? see `systemctl status airlock.socket`)"
            }
        except PermissionError:
            return None, {
                "message": f"permission denied on {path} (agents need group 'airlock', operators 'airlock-admin')"
            }
        except OSError as exc:
            return None, {"message": f"cannot connect to {path}: {exc.strerror or exc}"}
        try:
            sock.sendall(line)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before it read the request: the refusal is there to read
        buffer = b""
        noticed = False
        while True:
            end = buffer.find(b"\n")
            if end < 0:
                if len(buffer) > MAX_REPLY:
                    return None, {"message": "the daemon sent a malformed reply"}
                try:
                    chunk = sock.recv(1024 * 1024)
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    return None, {"message": "the daemon closed the connection without answering"}
                buffer += chunk
                continue
            frame, buffer = buffer[:end], buffer[end + 1 :]
            obj = _loads(frame)
            if not isinstance(obj, dict):  # None too: not JSON
                return None, {"message": "the daemon sent a malformed reply"}
            if "event" in obj:
                if obj.get("event") == "pending_approval" and not noticed and not quiet:
                    noticed = True
                    from airlock.cli.waiting import waiting_message

                    _err(waiting_message(obj))
                continue
            return frame, obj
    finally:
        sock.close()


class _Scanning:
    """What json's C scanner reads from a JSONDecoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}.__getitem__
    memo: dict[str, str] = {}


_scan = _make_scanner(_Scanning())  # type: ignore[arg-type]  # typeshed names JSONDecoder; it reads these six


def _loads(frame: bytes) -> Any:
    """json.loads(frame) for one reply line, or None when it is not one JSON value."""
    try:
        text = frame.decode("utf-8", "surrogatepass").strip(" \t\n\r")
        value, end = _scan(text, 0)
    except (ValueError, StopIteration, RecursionError):
        return None
    return value if end == len(text) else None


def _dumps(value: Any) -> str:
    """json.dumps(value, separators=(",", ":")) for what a request holds: str, int, bool, None, lists, dicts."""
    if isinstance(value, str):
        return str(_quote(value))
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{_quote(str(k))}:{_dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_dumps(v) for v in value) + "]"
    raise TypeError(f"cannot encode {type(value).__name__}")


def _exit_status(evidence: dict[str, Any]) -> int:
    """As agentcmds.exit_status: the last stage's exit code, or 128+N for signal N."""
    stages = evidence.get("stages") or [{}]
    last = stages[-1]
    if isinstance(last.get("signal"), int) and last.get("exit_code") is None:
        return 128 + int(last["signal"])
    code = last.get("exit_code")
    return int(code) if isinstance(code, int) else EXIT_AIRLOCK_ERROR


def _now() -> str:
    """UTC now as main._now prints it: 2026-12-03T09:15:00.123Z."""
    import time

    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def _uuid4() -> str:
    """A random (version 4) UUID without importing uuid (which imports platform)."""
    b = bytearray(_urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    h = b.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _getenv(name: str) -> str | None:
    """os.environ.get(name); from posix's start-up environment when nothing has imported os to change it."""
    os = sys.modules.get("os")
    if os is not None:
        return os.environ.get(name)  # type: ignore[no-any-return]
    value = _environ.get(name.encode())
    return None if value is None else value.decode(sys.getfilesystemencoding(), "surrogateescape")


def _err(message: str) -> None:
    print(f"airlock: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

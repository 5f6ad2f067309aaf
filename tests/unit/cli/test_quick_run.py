"""`airlock run` on the short path (cli/quick.py) sends what the full CLI sends, and prints and exits alike."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from airlock.cli import main as full
from airlock.cli import quick
from airlock.common import client
from airlock.common.wire.message import Message
from airlock.common.wire.verb import Verb

CASES = [
    ["run", "--", "true"],
    ["run", "true"],
    ["run", "--no-privilege", "--", "ls", "-l", "/"],
    ["run", "--reason", "disk check", "--session=s1", "--cwd", "/tmp", "--", "df", "-h"],
    ["run", "--env", "LANG=C", "--env=TZ=UTC", "--timeout", "2.5", "--", "date"],
    ["run", "--operation-id", "op-1", "--token-file", "@TOKEN_FILE@", "--json", "--", "uptime"],
    ["run", "echo", "--json", "--no-privilege"],  # after the command word, everything is the command's
]

OK = {
    "ok": True,
    "data": {
        "stdout": base64.b64encode(b"out\n").decode(),
        "stages": [{"exit_code": 3, "stderr": base64.b64encode(b"err\n").decode()}],
    },
}


def _sent_by_full(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any]
) -> tuple[dict[str, Any], int]:
    sent: dict[str, Any] = {}

    def call(path: str, verb: Verb[Any, Any], args: Message, **kw: Any) -> tuple[bytes, dict[str, Any]]:
        sent.update(path=path, verb=verb.name, args=args.to_dict(), token=kw.get("token"))
        return json.dumps(reply).encode(), reply

    monkeypatch.setattr(client, "call", call)
    return sent, full.main(argv)


def _sent_by_quick(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, reply: dict[str, Any]
) -> tuple[dict[str, Any], int]:
    sent: dict[str, Any] = {}

    def call(path: str, line: bytes, quiet: bool) -> tuple[bytes, dict[str, Any]]:
        envelope = json.loads(line)
        sent.update(path=path, verb=envelope["verb"], args=envelope["args"], token=envelope["token"])
        return json.dumps(reply).encode(), reply

    monkeypatch.setattr(quick, "_call", call)
    monkeypatch.setattr(full, "main", lambda argv=None: pytest.fail(f"fell back to the full CLI for {argv}"))
    return sent, quick.main(argv)


@pytest.mark.parametrize("argv", CASES, ids=[" ".join(c) for c in CASES])
def test_the_short_path_sends_prints_and_exits_as_the_full_cli(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes], tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("alt_tok\n")
    token_file.chmod(0o600)
    argv = [str(token_file) if word == "@TOKEN_FILE@" else word for word in argv]
    monkeypatch.delenv("AIRLOCK_TOKEN", raising=False)
    monkeypatch.setenv("AIRLOCK_SOCKET", "/nonexistent/agent.sock")
    want, want_rc = _sent_by_full(argv, monkeypatch, OK)
    want_out = capsysbinary.readouterr()
    got, got_rc = _sent_by_quick(argv, monkeypatch, OK)
    got_out = capsysbinary.readouterr()
    for sent in (want, got):
        assert sent["args"].pop("time").endswith("Z")
        op = sent["args"].pop("operation_id")
        assert op == "op-1" or op.startswith("cli-")
    assert got == want
    assert (got_rc, got_out.out, got_out.err) == (want_rc, want_out.out, want_out.err)


@pytest.mark.parametrize(("code", "rc"), [("denied", 126), ("approval_timeout", 124), ("runner_unavailable", 125)])
def test_errors_exit_alike(
    code: str, rc: int, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    reply = {"ok": False, "error": {"code": code, "message": "no"}}
    _, want_rc = _sent_by_full(["run", "--", "true"], monkeypatch, reply)
    want = capsysbinary.readouterr()
    _, got_rc = _sent_by_quick(["run", "--", "true"], monkeypatch, reply)
    got = capsysbinary.readouterr()
    assert want_rc == got_rc == rc and got.err == want.err


@pytest.mark.parametrize(
    "argv",
    [
        ["status"],
        ["run"],
        ["run", "--"],
        ["run", "--help"],
        ["run", "--no-priv", "--", "true"],
        ["run", "--env", "NOEQUALS", "--", "true"],
        ["run", "--timeout", "soon", "--", "true"],
        ["--json", "run", "true"],
    ],
)
def test_anything_else_goes_to_the_full_cli(argv: list[str]) -> None:
    assert quick._parse_run(argv) is None


def test_the_short_path_imports_neither_argparse_nor_the_cli() -> None:
    code = (
        "import sys; from airlock.cli import quick; quick._parse_run(['run', '--', 'true']); "
        "print(sorted(m for m in sys.modules if m in ('argparse', 'typing', 'uuid', 'airlock.cli.main', 'yaml')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # Control: the full CLI does import them.
    code = "import sys; import airlock.cli.main; print('argparse' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "True"
    )


def test_dev_up_starts_without_the_full_cli_or_asyncio_and_reports_as_it_does(tmp_path: Path) -> None:
    # The whole stack waits for dev up before its first service starts (issue 50): its short path
    # imports neither the other commands (the operator door's messages) nor asyncio, and a config
    # it refuses reads as the full CLI's refusal.
    config = tmp_path / "dev.yaml"
    config.write_text("limits:\n  write_timeout_seconds: soon\n")
    args = ["dev", "up", "--runtime-dir", str(tmp_path / "rt"), "--config", str(config)]
    code = (
        "import sys; from airlock.cli import quick; rc = quick.main(sys.argv[1:]); "
        "print(sorted(m for m in sys.modules if m in ('asyncio', 'airlock.cli.main'))); sys.exit(rc)"
    )
    short = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    code = "import sys; from airlock.cli import main; sys.exit(main.main(sys.argv[1:]))"
    full = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert short.stdout.strip() == "[]"
    assert (short.returncode, short.stderr) == (full.returncode, full.stderr) == (2, full.stderr)
    assert "write_timeout_seconds" in full.stderr


def test_an_unreachable_socket_is_reported_as_the_full_cli_does(capsys: pytest.CaptureFixture[str]) -> None:
    rc = quick.main(["run", "--socket", "/nonexistent/agent.sock", "--json", "--", "true"])
    got = capsys.readouterr()
    rc_full = full.main(["run", "--socket", "/nonexistent/agent.sock", "--json", "--", "true"])
    want = capsys.readouterr()
    assert rc == rc_full == 125 and got.out == want.out and got.err == want.err


def test_the_short_path_finds_the_agent_socket_where_the_full_cli_does() -> None:
    assert quick.AGENT_SOCKET == client.AGENT_SOCKET


def test_the_short_path_starts_without_json_socket_or_re() -> None:
    """Issue 37: under the .deb's `python3 -I -S`, `run` imports only C modules beside os and sys."""
    services = str(Path(quick.__file__).resolve().parents[2])
    heavy = ("os", "json", "socket", "re", "enum", "selectors", "collections", "typing", "argparse")
    code = (
        f"import sys; sys.path.append({services!r}); from airlock.cli import quick; "
        "quick._parse_run(['run', '--', 'true']); "
        f"print(sorted(m for m in sys.modules if m in {heavy!r}))"
    )
    out = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # Control: the modules it replaces do import them.
    out = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", "import json, socket, sys; print('re' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "True"


REQUESTS: list[Any] = [
    {
        "v": 1,
        "id": "x",
        "verb": "exec",
        "args": {"argv": ["true"], "privileged": True, "timeout_ms": 2500},
        "token": None,
    },
    {"argv": ["echo", "héllo wörld", "\u2603", "tab\there", 'quote"back\\slash', "\x00\x1f\x7f"], "env": {"A": "1"}},
    {"argv": ["\ud800 lone surrogate", "\U0001f600"], "flag": False, "n": -12345678901234567890, "empty": {}, "l": []},
]


@pytest.mark.parametrize("value", REQUESTS)
def test_the_short_path_encodes_as_json_dumps(value: Any) -> None:
    assert quick._dumps(value) == json.dumps(value, separators=(",", ":"))


REPLIES = [
    b'{"ok":true,"data":{"stdout":"b3V0Cg==","stages":[{"exit_code":0}]}}',
    b' {"ok": false, "error": {"code": "denied", "message": "caf\\u00e9 \xe2\x98\x83"}}\r',
    b'{"a":[1,2.5,-3e10,true,false,null,NaN,Infinity],"a":"last wins"}',
    b'{"s":"\\ud800"}',
]


@pytest.mark.parametrize("frame", REPLIES)
def test_the_short_path_parses_as_json_loads(frame: bytes) -> None:
    got, want = quick._loads(frame), json.loads(frame)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


@pytest.mark.parametrize(
    "frame", [b"", b"{", b'{"ok":true} x', b'{"ok":tru}', b"\xff{}", b"[" * 100_000, b'{"a":1}{"b":2}']
)
def test_the_short_path_refuses_what_json_loads_refuses(frame: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)):
        json.loads(frame)
    assert quick._loads(frame) is None


def test_the_short_path_under_dash_s_reads_the_environment_and_reports_alike() -> None:
    """The .deb's `-I -S` start: AIRLOCK_SOCKET read without `os`, and the unreachable socket answered as before."""
    services = str(Path(quick.__file__).resolve().parents[2])
    code = (
        f"import sys; sys.path.append({services!r}); from airlock.cli import quick; "
        "rc = quick.main(['run', '--json', '--', 'true']); "
        "print(sorted(m for m in sys.modules if m in ('os', 'json', 'socket', 're'))); sys.exit(rc)"
    )
    env = {"AIRLOCK_SOCKET": "/nonexistent/é.sock", "LANG": "C.UTF-8", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", code], capture_output=True, text=True, env=env)
    reply, modules = out.stdout.splitlines()
    assert out.returncode == 125 and modules == "[]"
    assert json.loads(reply)["error"]["code"] == "daemon_unavailable"
    assert "no airlock socket at /nonexistent/é.sock" in out.stderr

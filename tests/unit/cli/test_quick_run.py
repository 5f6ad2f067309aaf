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

    def call(path: str, verb: str, args: dict[str, Any], **kw: Any) -> tuple[bytes, dict[str, Any]]:
        sent.update(path=path, verb=verb, args=args, token=kw.get("token"))
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


def test_an_unreachable_socket_is_reported_as_the_full_cli_does(capsys: pytest.CaptureFixture[str]) -> None:
    rc = quick.main(["run", "--socket", "/nonexistent/agent.sock", "--json", "--", "true"])
    got = capsys.readouterr()
    rc_full = full.main(["run", "--socket", "/nonexistent/agent.sock", "--json", "--", "true"])
    want = capsys.readouterr()
    assert rc == rc_full == 125 and got.out == want.out and got.err == want.err


def test_the_short_path_finds_the_agent_socket_where_the_full_cli_does() -> None:
    assert quick.AGENT_SOCKET == client.AGENT_SOCKET

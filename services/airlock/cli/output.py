"""`airlock show ID --output` and `airlock logs ID [--follow]`: a job's output for an operator (issue 35).

The runner keeps each job's output (redacted, bounded: runner/outputlog.py);
approval reads it for an operator and checks it against the chain
(approval/output.py).  Every line is neutralised before it reaches the
terminal: a job's output is whatever the job printed, escape sequences
included.
"""

from __future__ import annotations

import argparse
import base64
import sys
from typing import Any

from airlock.cli.base import _err, _operator, _unreachable
from airlock.common import client
from airlock.common.render import sanitise
from airlock.common.wire import operator as op

# A follow hears from the runner at least every 10 s (a tick); this long without a byte means it is gone.
FOLLOW_READ_TIMEOUT = 60.0


def neutralise(data: bytes) -> str:
    """Output bytes as terminal text: UTF-8 (invalid bytes escaped), every line sanitised, newlines kept."""
    text = data.decode("utf-8", "backslashreplace")
    return "\n".join(sanitise(line) for line in text.split("\n"))


class _Printer:
    """Prints chunks, with a heading whenever the stream changes (stdout, or a stage's stderr)."""

    def __init__(self) -> None:
        self.current: tuple[str, int] | None = None
        self.at_line_start = True

    def chunk(self, stream: object, stage: object, data: bytes) -> None:
        key = (str(stream), int(stage) if isinstance(stage, int) else 0)
        if key != self.current:
            if not self.at_line_start:
                sys.stdout.write("\n")
            sys.stdout.write(
                f"--- {sanitise(key[0])}" + (f" (stage {key[1] + 1})" if key[0] != "stdout" else "") + " ---\n"
            )
            self.current = key
            self.at_line_start = True
        if data:
            sys.stdout.write(neutralise(data))
            self.at_line_start = data.endswith(b"\n")
        sys.stdout.flush()

    def note(self, text: str) -> None:
        if not self.at_line_start:
            sys.stdout.write("\n")
        sys.stdout.write(f"[airlock: {sanitise(text)}]\n")
        sys.stdout.flush()
        self.at_line_start = True
        self.current = None


def print_stored(data: dict[str, Any]) -> int:
    if data.get("message"):
        print(f"[airlock: {sanitise(data['message'])}]")
    printer = _Printer()
    for chunk in data.get("chunks") or []:
        raw = base64.b64decode(str(chunk.get("data") or ""))
        if chunk.get("stream") == "note":
            printer.note(raw.decode("utf-8", "backslashreplace"))
        else:
            printer.chunk(chunk.get("stream"), chunk.get("stage"), raw)
    if not data.get("file"):
        return 0
    if not printer.at_line_start:
        sys.stdout.write("\n")
    chain = data.get("chain") or {}
    if data.get("verified") and data.get("whole"):
        print(
            f"[airlock: {chain.get('stored_bytes', 0)} bytes stored; the whole log (frames, order, notes) "
            "and every stream's sha256 matches exec.finished]"
        )
    elif data.get("verified"):
        print(
            f"[airlock: {chain.get('stored_bytes', 0)} bytes stored; every stream's sha256 matches exec.finished "
            "(a log kept before whole-log digests: its notes and frame order are not covered)]"
        )
    else:
        mismatches = ", ".join(sanitise(m) for m in data.get("mismatches") or [])
        print(f"[airlock: THE STORED LOG DOES NOT MATCH THE CHAIN: {mismatches}]")
    if data.get("cut"):
        print("[airlock: the job printed more than runner.output_log_max_bytes; the log was cut (so says the chain)]")
    return 0 if data.get("verified") else 1


def cmd_output(ns: argparse.Namespace) -> int:
    """`airlock show ID --output`."""
    rc, data = _operator(ns, op.OUTPUT, op.JobRef(ns.ref))
    if rc != 0 or ns.json:
        return rc
    return print_stored(data)


def cmd_logs(ns: argparse.Namespace) -> int:
    """`airlock logs ID [--follow]`: the stored output, or a running job's output as it comes."""
    if not ns.follow:
        return cmd_output(ns)
    printer = _Printer()

    def on_event(raw: bytes, obj: dict[str, Any]) -> None:
        if ns.json:
            sys.stdout.buffer.write(raw + b"\n")
            sys.stdout.flush()
            return
        fields: dict[str, Any] = obj  # an event's fields are the line's own keys (common/codec.py)
        name = obj.get("event")
        if name in ("stdout", "stderr"):
            printer.chunk(name, fields.get("stage"), base64.b64decode(str(fields.get("data") or "")))
        elif name == "dropped":
            printer.note(f"{fields.get('bytes')} bytes dropped: this reader did not keep up")

    path = client.operator_socket(ns.socket)
    try:
        raw, reply = client.call(path, op.LOGS, op.JobRef(ns.ref), on_event=on_event, timeout=FOLLOW_READ_TIMEOUT)
    except client.ClientError as exc:
        _unreachable(ns, exc)
        return 1
    if ns.json:
        sys.stdout.buffer.write(raw + b"\n")
        return 0 if reply.get("ok") else 1
    if not reply.get("ok"):
        error = reply.get("error") or {}
        _err(f"{error.get('code')}: {error.get('message')}")
        return 1
    data = reply.get("data") or {}
    if not data.get("followed"):
        return print_stored(data)
    printer.note("the job ended")
    return 0

"""Bad input at a live stack: the fuzz corpus of both front doors, slow drips,
vanishing clients and 1,000 idle connections.  Every complete line gets
exactly one well-formed answer, nothing takes a service down, and well-formed
requests are answered correctly afterwards.
"""

from __future__ import annotations

import json
import resource
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stress_support import (
    SERVICES,
    RequestMaker,
    Result,
    Stack,
    Tally,
    audit,
    expected,
    kind_of,
    now_iso,
    run_load,
    running_stack,
    verify_chain,
)

MiB = 1 << 20


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Short read deadlines (from write_config) so drips and idlers are cut off quickly.
    with running_stack(Path(tmp_path_factory.mktemp("bad")) / "s") as s:
        yield s


def exchange(
    path: str, data: bytes, *, drip: float | None = None, half_close: bool = True, timeout: float = 20
) -> tuple[list[Any], str]:
    """Send ``data`` on a fresh connection (all at once or byte by byte) and read to EOF.

    Returns the answer lines (parsed, or the raw bytes if not JSON) and how the
    exchange ended ("eof", "reset" or "timeout").
    """
    end = "eof"
    buf = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        try:
            if drip is None:
                sock.sendall(data)
            else:
                for i in range(len(data)):
                    sock.sendall(data[i : i + 1])
                    time.sleep(drip)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before reading it all (too large, too slow)
        try:
            while chunk := sock.recv(MiB):
                buf += chunk
        except ConnectionResetError:
            end = "reset"
        except TimeoutError:
            end = "timeout"
    out: list[Any] = []
    for line in buf.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)
    return out, end


def well_formed_any(reply: Any) -> bool:
    """An answer in either dialect: native (ok + data/error) or reference/000 (status)."""
    if not isinstance(reply, dict):
        return False
    if isinstance(reply.get("ok"), bool):
        error = reply.get("error")
        return reply["ok"] or (isinstance(error, dict) and isinstance(error.get("code"), str))
    return isinstance(reply.get("status"), str)


def _native(verb: str = "exec", **args: Any) -> dict[str, Any]:
    rid = f"f-{uuid.uuid4().hex[:12]}"
    body = {"argv": ["true"], "privileged": False, "time": now_iso(), "operation_id": f"op-{rid}"} | args
    return {"v": 1, "id": rid, "verb": verb, "args": body, "token": None}


def _legacy(**fields: Any) -> dict[str, Any]:
    return {"id": str(uuid.uuid4()), "pipeline": [["true"]], "privileged": False, "time": now_iso()} | fields


WRONG = [None, True, False, 0, -1, 2**70, 1.5, "", "x", "\u202e", [], [[]], {}, {"a": 1}, 10**30]


def corpus() -> Iterator[tuple[str, bytes]]:
    """(name, bytes) pairs; each is sent on its own connection."""
    good = json.dumps(_native()).encode()
    for cut in (1, 10, len(good) // 2, len(good) - 1):
        yield f"truncated at {cut}, no newline", good[:cut]
        yield f"truncated at {cut}, newline", good[:cut] + b"\n"
    yield "2 MiB line", b'{"v":1,"id":"big","verb":"ping","args":{"x":"' + b"a" * (2 * MiB) + b'"}}\n'
    yield "2 MiB without newline", b"x" * (2 * MiB)
    for depth in (100, 1000, 100_000):
        yield (
            f"nesting {depth}",
            b'{"v":1,"id":"deep","verb":"ping","args":{"x":' + b"[" * depth + b"]" * depth + b"}}\n",
        )
        yield (
            f"object nesting {depth}",
            b'{"v":1,"id":"deepo","verb":"exec","args":' + b'{"a":' * depth + b"1" + b"}" * depth + b"}\n",
        )
    for number in (b"1" * 5000, b"1e999999", b"-1e999999", b"1" * 400 + b".5", b"NaN", b"Infinity"):
        yield f"number {number[:12]!r}", b'{"v":' + number + b',"id":"n","verb":"ping","args":{}}\n'
        yield f"timeout {number[:12]!r}", json.dumps(_native()).encode()[:-1] + b',"x":' + number + b"}\n"
        yield f"legacy timeout {number[:12]!r}", b'{"id":"l","pipeline":[["true"]],"timeout":' + number + b"}\n"
    yield "invalid utf-8", b'{"v":1,"id":"\xff\xfe","verb":"ping","args":{}}\n'
    yield "invalid utf-8 in argv", b'{"v":1,"id":"u8","verb":"exec","args":{"argv":["\xc3\x28"]}}\n'
    yield (
        "lone surrogate escape",
        b'{"v":1,"id":"sur","verb":"exec","args":{"argv":["\\ud800"],"time":"' + now_iso().encode() + b'"}}\n',
    )
    yield "raw NUL", b'{"v":1,"id":"a\x00b","verb":"ping","args":{}}\n'
    yield "NUL only", b"\x00" * 100 + b"\n"
    yield "escaped NUL in argv", json.dumps(_native(argv=["tr\u0000ue"])).encode() + b"\n"
    yield "escaped NUL in env", json.dumps(_native(env={"LANG": "C\u0000"})).encode() + b"\n"
    yield "empty line", b"\n"
    yield "whitespace", b"   \t  \n"
    yield "not an object", b"[1,2,3]\n"
    yield "a string", b'"exec"\n'
    yield "two objects on one line", good + good + b"\n"
    yield "CRLF", good + b"\r\n"
    yield "binary", bytes(b for b in range(256) if b != 0x0A) * 4 + b"\n"
    yield "unknown version", json.dumps(_native() | {"v": 99}).encode() + b"\n"
    # Wrong types in every field, native envelope and args, and the legacy object.
    for key in ("v", "id", "verb", "args", "token"):
        for value in WRONG:
            yield f"native {key}={value!r:.20}", json.dumps(_native() | {key: value}).encode() + b"\n"
    for key in (
        "pipeline",
        "argv",
        "command",
        "privileged",
        "env",
        "protected_env",
        "cwd",
        "stdin",
        "timeout_ms",
        "deadline_ms",
        "max_output_bytes",
        "operation_id",
        "reason",
        "session",
        "host",
        "time",
        "forward_agent",
        "stream",
    ):
        for value in WRONG:
            request = _native()
            request["args"][key] = value
            if key in ("pipeline", "command"):
                del request["args"]["argv"]
            yield f"args.{key}={value!r:.20}", json.dumps(request).encode() + b"\n"
    for key in (
        "id",
        "action",
        "pipeline",
        "privileged",
        "env",
        "timeout",
        "stdin",
        "cwd",
        "reason",
        "session",
        "host",
        "time",
        "forward_agent",
    ):
        for value in WRONG:
            yield f"legacy {key}={value!r:.20}", json.dumps(_legacy(**{key: value})).encode() + b"\n"


def _replay_corpus(path: str) -> tuple[int, Counter[str], list[str]]:
    """Send the whole corpus; returns (lines sent, answers by code, problems)."""
    codes: Counter[str] = Counter()
    problems: list[str] = []
    sent = 0
    for name, data in corpus():
        sent += 1
        replies, end = exchange(path, data)
        if end == "timeout":
            problems.append(f"{name}: no answer (timeout)")
            continue
        if not data.strip(b" \t\n"):
            if replies and not all(well_formed_any(r) for r in replies):
                problems.append(f"{name}: malformed answer {replies!r:.200}")
            codes["(blank: " + ("answered" if replies else "no answer") + ")"] += 1
            continue
        events = [r for r in replies if isinstance(r, dict) and "event" in r]
        replies = [r for r in replies if r not in events]
        if len(replies) != 1 or not well_formed_any(replies[0]):
            problems.append(f"{name}: {len(replies)} answers: {replies!r:.300}")
            continue
        reply = replies[0]
        if reply.get("ok") is False and reply["error"]["code"] == "internal":
            problems.append(f"{name}: internal error: {reply!r:.300}")
        if reply.get("ok") is True or reply.get("status") == "ok":
            codes["ok"] += 1
        else:
            codes[str(reply.get("code") or (reply.get("error") or {}).get("code"))] += 1
    return sent, codes, problems


def _all_alive(stack: Stack, pids: dict[str, int | None]) -> None:
    now = {name: stack.find_service_pid(name) for name in SERVICES}
    assert now == pids, f"a service died or was restarted: {pids} -> {now}"


def _as_results(prefix: str, sent: int, codes: Counter[str]) -> list[Result]:
    from stress_support import Planned

    results = []
    for code, count in codes.items():
        for i in range(count):
            reply = {"id": f"{prefix}{code}{i}", "ok": code == "ok", "error": {"code": code, "message": ""}, "data": {}}
            results.append(Result(Planned(reply["id"], "fuzz", {}), reply=reply))
    return results


@pytest.mark.parametrize("door", ["agent", "operator"])
def test_fuzz_corpus_gets_one_answer_per_line_and_nothing_dies(
    stack: Stack, tally: Tally, door: str, tmp_path: Path
) -> None:
    pids = {name: stack.find_service_pid(name) for name in SERVICES}
    path = stack.agent if door == "agent" else stack.operator
    sent, codes, problems = _replay_corpus(path)
    tally.add(f"fuzz corpus at {door}.sock", _as_results("x", sent, codes))
    assert not problems, f"{len(problems)} of {sent}:\n" + "\n".join(problems[:20])
    _all_alive(stack, pids)
    maker = RequestMaker(tmp_path / "markers")
    _check_healthy(stack, maker)
    assert stack.native("status", path=stack.operator)["ok"] is True


def _check_healthy(stack: Stack, maker: RequestMaker) -> list[Result]:
    import asyncio

    results = asyncio.run(run_load(stack.agent, [maker.make(kind_of(i)) for i in range(18)], 6, timeout=60))
    wrong = [(r.planned.kind, why) for r in results if (why := expected(r)) is not None]
    assert not wrong, wrong
    found = audit(stack, results, maker.markers)
    assert found.lost == [] and found.unaudited == [], found
    return results


def test_slow_drip_clients_are_cut_off_and_others_are_served(stack: Stack, tally: Tally, tmp_path: Path) -> None:
    pids = {name: stack.find_service_pid(name) for name in SERVICES}
    line = json.dumps(_native("ping")).encode() + b"\n"
    outcomes: list[tuple[list[Any], str]] = []

    def drip() -> None:
        # 0.3 s a byte: each read is in time, the whole request is not (4 s).
        outcomes.append(exchange(stack.agent, line, drip=0.3, timeout=30))

    threads = [threading.Thread(target=drip) for _ in range(8)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    maker = RequestMaker(tmp_path / "markers")
    during = _check_healthy(stack, maker)  # served while the drips hold their connections
    for t in threads:
        t.join(60)
    codes = Counter(
        str(r[0].get("error", {}).get("code") if r and isinstance(r[0], dict) else end) for r, end in outcomes
    )
    tally.add("slow drip (8) + served meanwhile", during, extra=codes)
    assert len(outcomes) == 8
    for replies, end in outcomes:
        assert len(replies) == 1 and well_formed_any(replies[0]), (replies, end)
        assert replies[0]["error"]["code"] == "read_timeout", replies
    _all_alive(stack, pids)


def test_clients_that_vanish_mid_request(stack: Stack, tally: Tally, tmp_path: Path) -> None:
    pids = {name: stack.find_service_pid(name) for name in SERVICES}
    vanished = 0
    for i in range(60):
        request = json.dumps(_native(argv=["sleep", "0.2"]) if i % 3 == 0 else _native("ping")).encode() + b"\n"
        data = request if i % 2 else request[: len(request) // 2]
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(stack.agent)
            sock.sendall(data)
        vanished += 1
    time.sleep(1)
    maker = RequestMaker(tmp_path / "markers")
    after = _check_healthy(stack, maker)
    tally.add("vanishing clients (60) + after", after, extra=Counter({"(vanished)": vanished}))
    _all_alive(stack, pids)


def test_1000_idle_connections(stack: Stack, tally: Tally, tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    pids = {name: stack.find_service_pid(name) for name in SERVICES}
    held: list[socket.socket] = []
    try:
        for i in range(1000):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            held.append(sock)
            sock.settimeout(10)
            give_up = time.monotonic() + 10
            while True:
                try:
                    sock.connect(stack.agent if i % 2 == 0 else stack.operator)
                    break
                except BlockingIOError:
                    # The listen backlog is full: the server accepts slower than we connect.
                    if time.monotonic() > give_up:
                        raise
                    time.sleep(0.001)
        # The server answers what it will not serve: busy at once past the connection
        # caps, and an idle client once the handshake deadline (the read deadline, 2 s
        # here) has passed (issue 30).  The operator door says both in reference/004's
        # codes, with the precise one in details.reason (busy: conflict; read_timeout:
        # invalid_request).
        outcome: Counter[str] = Counter()
        deadline = time.monotonic() + 15
        for sock in held:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
                if not data:
                    outcome["closed idle"] += 1
                else:
                    reply = json.loads(data.splitlines()[0])
                    error = reply.get("error") or {}
                    code = (error.get("details") or {}).get("reason") or reply.get("code") or error.get("code")
                    outcome[f"answered {code}"] += 1
            except TimeoutError:
                outcome["still open"] += 1
            except ConnectionResetError:
                outcome["reset"] += 1
    finally:
        for sock in held:
            sock.close()
    maker = RequestMaker(tmp_path / "markers")
    after = _check_healthy(stack, maker)
    tally.add("1,000 idle connections + after", after, extra=outcome)
    assert outcome["still open"] == 0, outcome
    assert set(outcome) <= {"closed idle", "answered busy", "answered read_timeout", "reset"}, outcome
    _all_alive(stack, pids)
    verify = verify_chain(stack)
    assert verify.get("ok") is True, verify

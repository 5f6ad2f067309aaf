"""Two per-exec constants of issue 50, measured alone: a bounded await, and the journal's payload encoding.

    .venv/bin/python bench/cpu_micro.py [--rounds 15] [--n 20000]

CPU time (``time.process_time``) per operation, median over rounds, each
variant alternating with the others in every round so a neighbour's load hits
all alike.  Not part of `make bench`: docs/benchmarks.md (issue 50, CPU per
exec) quotes it for the cuts the end-to-end figures are too noisy to show.

- *bounded await*: ``asyncio.wait_for`` (a Task per await, what ipc and door
  used before), ``asyncio.timeout`` (what they use now), and the await
  unbounded, of a coroutine that yields once.
- *payload encoding*: ``journal.records._canonical_object`` on a
  ``request.received``-shaped payload, beside the three JSON passes it made
  before (encode, parse back, encode again).
- *a line*: ``codec.encode_ok`` and ``codec.parse_object`` (an encoder and a
  decoder built once) beside ``json.dumps``/``json.loads`` with the same
  keywords (which build one per call), on a journal reply's line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable, Coroutine
from typing import Any

from airlock.common.codec import canonical_json, encode_ok, parse_object, reject_constant
from airlock.journal.records import _canonical_object

PAYLOAD = {
    "request": {
        "argv": ["true"],
        "cwd": None,
        "env": {},
        "stdin": None,
        "timeout_seconds": None,
        "run_as": None,
        "privileged": True,
        "pipeline": None,
        "output": None,
    },
    "peer": {"uid": 0, "gid": 0, "pid": 12345, "user": "root", "groups": ["root"]},
    "digest": "a" * 64,
    "session": None,
    "agent": None,
}


async def _step() -> None:
    await asyncio.sleep(0)


async def _wait_for(n: int) -> None:
    for _ in range(n):
        await asyncio.wait_for(_step(), 5)


async def _timeout(n: int) -> None:
    for _ in range(n):
        async with asyncio.timeout(5):
            await _step()


async def _bare(n: int) -> None:
    for _ in range(n):
        await _step()


def _three_passes() -> str:
    data = canonical_json(PAYLOAD)
    return canonical_json(json.loads(data, parse_constant=reject_constant)).decode()


def _now() -> str:
    return _canonical_object("payload", PAYLOAD, 1 << 20)[1]


REPLY = {"seq": 12, "hash": "a" * 64, "mark": None}
LINE = encode_ok("1234-56", REPLY)


def _line_per_call() -> object:
    encoded = json.dumps({"id": "1234-56", "ok": True, "data": REPLY}, separators=(",", ":"), ensure_ascii=False)
    return json.loads(LINE[:-1].decode(), parse_constant=reject_constant), encoded


def _line_now() -> object:
    return parse_object(LINE[:-1]), encode_ok("1234-56", REPLY)


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    assert _three_passes() == _now()
    awaits: dict[str, Callable[[int], Coroutine[Any, Any, None]]] = {
        "asyncio.wait_for": _wait_for,
        "asyncio.timeout": _timeout,
        "unbounded": _bare,
    }
    encodings: dict[str, Callable[[], object]] = {
        "three JSON passes (before)": _three_passes,
        "_canonical_object": _now,
        "json.dumps + json.loads (before)": _line_per_call,
        "encode_ok + parse_object": _line_now,
    }
    samples: dict[str, list[float]] = {name: [] for name in [*awaits, *encodings]}

    async def rounds() -> None:
        for _ in range(args.rounds):
            for name, run in awaits.items():
                start = time.process_time()
                await run(args.n)
                samples[name].append((time.process_time() - start) / args.n * 1e6)
            for name, encode in encodings.items():
                start = time.process_time()
                for _ in range(args.n):
                    encode()
                samples[name].append((time.process_time() - start) / args.n * 1e6)

    asyncio.run(rounds())
    size = len(canonical_json(PAYLOAD))
    print(f"bounded await of a one-yield coroutine, CPU µs per await (median of {args.rounds} rounds):")
    for name in awaits:
        print(f"  {name:<34} {_median(samples[name]):6.1f}")
    print(f"journal payload encoding ({size} bytes), CPU µs per payload:")
    for name in list(encodings)[:2]:
        print(f"  {name:<34} {_median(samples[name]):6.1f}")
    print(f"a reply line ({len(LINE)} bytes) encoded and parsed, CPU µs per line:")
    for name in list(encodings)[2:]:
        print(f"  {name:<34} {_median(samples[name]):6.1f}")


if __name__ == "__main__":
    main()

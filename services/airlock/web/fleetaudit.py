"""The collector's verdict on each host's chain, for the fleet console's page (issue 49).

With ``web.fleet_collector_journal`` (a collector's journal files, as
``systemd-journal-remote`` writes them, mounted or synced onto the bastion)
and ``web.fleet_host_keys`` (one ``airlock audit host-key`` line per host),
the console runs ``airlock audit verify --journal DIR --host-keys FILE
--json`` itself -- the very check an operator runs on the collector, in its
own process (the files can be large; airlock-web does not import the
journal's code) -- every `EVERY_SECONDS`: a host's records count only on the
chain its own key's checkpoints sign.  The page shows the newest verdict and
when it was made.  Without host keys it does not verify at all: a chain
only claimed by name proves nothing (docs/fleet.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from airlock.common.log import get as get_logger

EVERY_SECONDS: Final = 300.0
VERIFY_TIMEOUT: Final = 600.0
MAX_REPORT: Final = 64 * 1024 * 1024
log = get_logger("airlock.web.fleetaudit")


def argv(journal: Path, host_keys: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "airlock",
        "audit",
        "verify",
        "--journal",
        str(journal),
        "--host-keys",
        str(host_keys),
        "--json",
    ]


async def verify(journal: Path, host_keys: Path) -> dict[str, dict[str, Any]]:
    """Each host's verdict (by the name its records carry), as `airlock audit verify --journal` makes it."""
    proc = await asyncio.create_subprocess_exec(
        *argv(journal, host_keys),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), VERIFY_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise RuntimeError(f"airlock audit verify took more than {VERIFY_TIMEOUT:g}s") from None
    if proc.returncode not in (0, 1) or len(out) > MAX_REPORT:  # 0: all good, 1: a mismatch; 2: cannot read
        why = (err.decode("utf-8", "replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(why)
    report = json.loads(out)
    found = {str(h.get("host")): summary(h) for h in report.get("hosts") or [] if isinstance(h, dict)}
    for item in report.get("unproven") or []:
        # Entries that claim a host and that no key proves: not that host's (its chain is judged without
        # them), but worth a flag on its card: someone else's root wrote under its name.
        name = str(item.get("host") or "") if isinstance(item, dict) else ""
        if name in found:
            found[name]["unproven"] += 1
    return found


def summary(host: Mapping[str, Any]) -> dict[str, Any]:
    """What the page shows of one host's report: ok, how far its key proves it, the first problem."""
    problems = [str(p) for p in host.get("problems") or []]
    return {
        "ok": bool(host.get("ok")),
        "records": host.get("records"),
        "last_seq": host.get("last_seq"),
        "proven_to": host.get("proven_to"),
        "key": host.get("key"),
        "first_bad_seq": host.get("first_bad_seq"),
        "problem": problems[0] if problems else "",
        "unproven": 0,
    }


def for_hosts(found: Mapping[str, dict[str, Any]], hosts: Iterable[str], checked: float) -> dict[str, dict[str, Any]]:
    """The verdict of each console host (its name as the collector's records carry it), or why there is none."""
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        bare = host.rpartition("@")[2]  # [USER@]HOST: the records carry the host's own name
        name = next((n for n in found if matches(n, bare)), None)
        verdict = dict(found[name]) if name is not None else {"ok": False, "problem": "no records of this host"}
        out[host] = verdict | {"checked": checked, "name": name}
    return out


async def watching(journal: Path, host_keys: Path, hosts: list[str], into: dict[str, dict[str, Any]]) -> None:
    """Verify the collector now and every `EVERY_SECONDS`, replacing ``into`` whole each time."""
    while True:
        try:
            found = await verify(journal, host_keys)
            fresh = for_hosts(found, hosts, time.time())
        except Exception as exc:  # unreadable files, a broken keys file: said on the page, tried again later
            log.warning("web.fleet.collector_failed", error=str(exc))
            fresh = {h: {"ok": False, "problem": f"cannot verify: {exc}", "checked": time.time()} for h in hosts}
        into.clear()
        into.update(fresh)
        await asyncio.sleep(EVERY_SECONDS)


def matches(name: str, wanted: str) -> bool:
    """A collector's host name (``HOSTNAME/MACHINE-ID``) is the console's host by either part or whole
    (as `airlock audit verify --host` matches)."""
    hostname, _, machine = name.rpartition("/")
    return wanted in (name, hostname, machine)

"""Load: N requests from many clients, a mix of allowed, denied, failing, large and invalid.

Every request gets exactly one well-formed answer, the one its kind must get;
the journal holds exactly the acknowledged work; the chain verifies; the
services' fds and memory do not grow.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from stress_support import (
    RequestMaker,
    Tally,
    audit,
    expected,
    kind_of,
    run_load,
    running_stack,
    service_fds,
    service_rss_mib,
    stress_clients,
    stress_n,
    verify_chain,
    well_formed,
)

# Above this the services leak: a per-request leak of even 1 KiB shows at 20,000.
RSS_GROWTH_BOUND_MIB = 24
FD_GROWTH_BOUND = 8
WARM_UP = 1000  # requests of the load's own mix before the first measure


def test_mixed_load_every_request_one_correct_answer_and_all_audited(tmp_path: Path, tally: Tally) -> None:
    n, clients = stress_n(), stress_clients()
    # Idle connections between services are reused, then closed by the server
    # after read_timeout_seconds and by the client's pool sweep: fds are counted
    # once those have gone, so a pool's size is not mistaken for a leak.
    idle = 2
    with running_stack(tmp_path / "s", limits={"read_timeout_seconds": idle}) as stack:
        maker = RequestMaker(tmp_path / "markers")
        # Warm up with the same mix at the same concurrency, so imports, caches and the high-water
        # mark of buffers held at once (the runner's grew 15-31 MiB in a first 500, then stays)
        # are not counted as growth: what grows after that grows with the requests.
        warm = [maker.make(kind_of(i)) for i in range(min(n, WARM_UP))]
        asyncio.run(run_load(stack.agent, warm, clients))
        time.sleep(idle + 6)  # past the server's cut-off and the pool's 5 s sweep
        fds_before, rss_before = service_fds(stack), service_rss_mib(stack)

        planned = [maker.make(kind_of(i)) for i in range(n)]
        results = asyncio.run(run_load(stack.agent, planned, clients))

        time.sleep(idle + 6)  # past the server's cut-off and the pool's 5 s sweep
        fds_after, rss_after = service_fds(stack), service_rss_mib(stack)
        found = audit(stack, results, maker.markers)
        chain = verify_chain(stack)
        tally.add("load", results, found)

    assert len(results) == n
    malformed = [
        r.planned.request_id for r in results if r.reply is None or not well_formed(r.reply, r.planned.request_id)
    ]
    assert not malformed, f"{len(malformed)} requests without one well-formed answer, e.g. {malformed[:5]}"
    wrong = [(r.planned.kind, why) for r in results if (why := expected(r)) is not None]
    assert not wrong, f"{len(wrong)} wrong answers, e.g. {wrong[:5]}"
    assert found.lost == [], f"acknowledged but not journaled: {found.lost[:5]}"
    assert found.unaudited == [], f"ran without exec.started: {found.unaudited[:5]}"
    assert found.unacknowledged_runs == 0, "the journal holds runs nobody was told about"
    assert chain.get("ok") is True, chain
    for name in fds_before:
        assert fds_after[name] <= fds_before[name] + FD_GROWTH_BOUND, (name, fds_before, fds_after)
        assert rss_after[name] <= rss_before[name] + RSS_GROWTH_BOUND_MIB, (name, rss_before, rss_after)

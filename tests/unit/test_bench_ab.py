"""`make bench-ab BEFORE=...` (bench/exec_ab.py): the verdict per row, the printed table, the JSON bench-doc reads.

Only the pure parts, on made-up figures (no benchmark result is a test
expectation): a time may grow by 5% at most and a rate shrink by 5% at most; a
row the old tree cannot run says so instead of passing; what --json writes is
what `make bench-doc` renders into docs/benchmarks.md's A/B region.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _bench(name: str) -> ModuleType:
    # The bench scripts import one another by name (each is run as a script from bench/).
    if str(REPO / "bench") not in sys.path:
        sys.path.insert(0, str(REPO / "bench"))
    return importlib.import_module(name)


exec_ab = _bench("exec_ab")
bench_doc = _bench("bench_doc")
RUN = {
    "date": "2026-12-06T07:00:00Z",
    "commit": "abc1234",
    "cores": 2,
    "root": True,
    "load_average_start": [0.5, 0.4, 0.3],
    "load_average_end": [1.25, 0.6, 0.4],
}


def _time(before: float, after: float) -> Any:
    return exec_ab.verdict("exec `true` p50", "ms", before, after, rate=False, before_name="10b6343", how="n each")


def _rate(before: float, after: float) -> Any:
    return exec_ab.verdict("exec throughput", "req/s", before, after, rate=True, before_name="10b6343", how="n")


def test_a_time_may_grow_by_five_percent_and_no_more() -> None:
    assert _time(10.0, 10.5).met is True
    slower = _time(10.0, 10.6)
    assert slower.met is False and slower.ratio == pytest.approx(1.06)
    assert _time(10.0, 8.0).met is True  # faster is never a regression
    assert slower.yardstick_value == 10.0 and slower.value == 10.6 and slower.target == "<= 1.05x before"


def test_a_rate_may_shrink_by_five_percent_and_no_more() -> None:
    assert _rate(200.0, 190.0).met is True
    fewer = _rate(200.0, 188.0)
    assert fewer.met is False and fewer.ratio == pytest.approx(0.94)
    assert _rate(200.0, 400.0).met is True
    assert fewer.target == ">= 0.95x before"


def test_a_row_the_old_tree_lacks_has_no_verdict_and_says_why() -> None:
    row = exec_ab.missing("approval round trip p50", "ms", None, before_name="10b6343", why="no approve verb")
    assert row.met is None and row.ratio is None and row.note == "not in 10b6343: no approve verb"
    zero = _time(0.0, 5.0)  # a before of nothing cannot give a ratio, nor a pass
    assert zero.ratio is None and zero.met is None


def test_the_table_prints_before_after_ratio_and_within_per_row() -> None:
    rows = [
        _time(10.0, 10.6),
        _rate(200.0, 210.0),
        exec_ab.missing("approval round trip p50", "ms", None, before_name="10b6343", why="no approve verb"),
        exec_ab.failed("cold start", "ms", "dev up did not become ready"),
    ]
    lines = exec_ab.ab_table(rows).splitlines()
    assert lines[0].split() == ["row", "before", "after", "after/before", "within"]
    assert lines[2].split() == [
        "exec",
        "`true`",
        "p50",
        "10.00",
        "ms",
        "10.60",
        "ms",
        "1.060",
        "NO",
        *"(<= 1.05x before)".split(),
    ]
    assert lines[3].split() == [
        "exec",
        "throughput",
        "200",
        "req/s",
        "210",
        "req/s",
        "1.050",
        "yes",
        *"(>= 0.95x before)".split(),
    ]
    assert lines[4].split()[-3:] == ["not", "in", "before"]
    assert lines[5].split()[-2:] == ["-", "n/a"]
    assert "  cold start: failed: dev up did not become ready" in lines


def test_every_row_alternates_which_tree_goes_first() -> None:
    assert {exec_ab.alternate(i) for i in range(2)} == {("before", "after"), ("after", "before")}


def test_every_step_names_its_rows() -> None:
    """A step that fails still prints its rows: each step has at least one."""
    names = exec_ab.row_names(exec_ab.QUICK)
    assert set(names) == set(exec_ab.ROWS) and all(names.values())


def test_what_json_writes_is_what_bench_doc_renders(tmp_path: Path) -> None:
    rows = [
        _time(10.0, 10.6),
        exec_ab.missing("approval round trip p50", "ms", None, before_name="10b6343", why="no approve verb"),
    ]
    rows[0].samples = [1.0, 2.0]
    run = RUN | {"before": "10b6343", "requests": 150, "quick": True}
    data = json.loads(json.dumps(exec_ab.results(rows, run)))
    assert "samples" not in data["figures"][0] and data["machine"]["before"] == "10b6343"
    text = bench_doc.render_ab(data)
    assert "`make bench-ab BEFORE=10b6343 AB_ARGS=--quick`, 150 exec requests each" in text
    assert "| exec `true` p50 | 10.00 ms | 10.60 ms | 1.06x | <= 1.05x before | **no** |" in text
    assert "| approval round trip p50 | n/a | n/a | — | — | — |" in text
    assert text.endswith("Not compared:\n\n- approval round trip p50: not in 10b6343: no approve verb\n")


def test_a_before_that_is_not_a_services_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert exec_ab.main(["--before", str(tmp_path), "--quick"]) == 2
    assert "is not a services/ folder" in capsys.readouterr().err


def test_the_container_rows_compare_each_tree_with_its_own_yardstick() -> None:
    """bench/container_ab.py: the cold start in ms, the warm run as a ratio to sudo and to systemd-run in the same
    container, each after/before against 1.05 (a container's own speed cancels out of its ratios)."""
    container_ab = _bench("container_ab")
    samples = {
        "before": {"cold": [400, 410, 420], "airlock": [40, 40, 40], "sudo": [8, 8, 8], "systemd_run": [10, 10, 10]},
        "after": {"cold": [430, 440, 450], "airlock": [30, 30, 30], "sudo": [5, 5, 5], "systemd_run": [10, 10, 10]},
    }
    rows = {r["row"]: r for r in container_ab.table(samples)}
    cold = rows["cold start, socket activation (container)"]
    assert (cold["before"], cold["after"], cold["within"]) == (410, 440, False)  # 1.073: regressed
    beside_sudo = rows["airlock run -- true, installed, service containment, warm (container)"]
    assert (beside_sudo["before"], beside_sudo["after"], beside_sudo["within"]) == (5.0, 6.0, False)
    beside_systemd = rows["airlock run -- true beside systemd-run --wait --pipe -q true (container)"]
    assert (beside_systemd["before"], beside_systemd["after"], beside_systemd["within"]) == (4.0, 3.0, True)

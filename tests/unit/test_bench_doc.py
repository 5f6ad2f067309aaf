"""`make bench-doc` (bench/bench_doc.py): docs/benchmarks.md's table of today's figures is the script's output.

Checked on a fixture results file, never on live numbers (no benchmark result is
a test expectation): the rendering, the rewrite between the markers, the file
`make bench` writes (`harness.write_results`), and that the doc has the region.
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


bench_doc = _bench("bench_doc")
harness = _bench("harness")

RUN = {"measured_at": "2026-12-05T10:00:07Z", "load_average": [[0.5, 0.4, 0.3], [1.25, 0.6, 0.4]]}
FIXTURE: dict[str, Any] = {
    "machine": {
        "date": "2026-12-05T10:00:07Z",
        "commit": "abc1234",
        "cores": 2,
        "cpu": "Test CPU",
        "memory_gib": 8.0,
        "kernel": "6.1.0-test",
        "python": "3.11.2",
        "debian": "12.8",
        "root": True,
        "seconds": 300.4,
        "load_average_start": [0.5, 0.4, 0.3],
        "load_average_end": [1.25, 0.6, 0.4],
    },
    "figures": [
        {
            "name": "exec true p50, persistent client",
            "value": 7.5,
            "unit": "ms",
            "target": "<= 0.6x sudo",
            "yardstick": "sudo -n true",
            "yardstick_value": 5.0,
            "ratio": 1.5,
            "met": False,
            "extra": RUN,
        },
        {
            "name": "1024 MiB through cat FILE | wc -c",
            "value": 900.0,
            "unit": "MiB/s",
            "target": ">= 0.8x sh",
            "yardstick": "same in sh",
            "yardstick_value": 1000.0,
            "ratio": 0.9,
            "met": True,
            "extra": RUN,
        },
        {"name": "journal bytes per exec", "value": 4000.5, "unit": "bytes", "extra": RUN},
        {
            "name": "cold start, socket activation (container)",
            "value": None,
            "unit": "ms",
            "target": "<= 300 ms",
            "met": None,
            "extra": {"measured_at": "2026-12-01 09:00 UTC", "load_average": 2.5},
        },
    ],
}
EXPECTED = """\
Measured 2026-12-05 10:00 UTC at abc1234 (`make bench`, 300 s, as root) on 2 cores (Test CPU), 8.0 GiB, \
kernel 6.1.0-test, Python 3.11.2, Debian 12.8; **load average 0.50 at the start and 1.25 at the end**. \
From bench/results.json; `make bench-doc` rewrites this table from the next run.

| figure | value | yardstick | ratio | target | met |
|---|---|---|---|---|---|
| exec true p50, persistent client | 7.50 ms | sudo -n true: 5.00 ms | 1.50x | <= 0.6x sudo | **no** |
| 1024 MiB through cat FILE \\| wc -c | 900 MiB/s | same in sh: 1,000 MiB/s | 0.90x | >= 0.8x sh | yes |
| journal bytes per exec | 4000.5 bytes | — | — | — | — |
| cold start, socket activation (container) (1) | n/a | — | — | <= 300 ms | — |

Measured in another run:

1. cold start, socket activation (container): measured 2026-12-01 09:00 UTC, load average 2.50.
"""


def test_the_table_is_the_scripts_output_for_a_results_file() -> None:
    assert bench_doc.render(FIXTURE) == EXPECTED


def test_make_bench_doc_rewrites_only_the_region(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps(FIXTURE))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# B\n\nbefore\n<!-- bench:figures -->\nold numbers\n<!-- /bench:figures -->\nafter\n")
    argv = ["--results", str(results), "--doc", str(doc)]
    assert bench_doc.main([*argv, "--check"]) == 1  # stale: says so, writes nothing
    assert "old numbers" in doc.read_text()
    assert bench_doc.main(argv) == 0
    assert doc.read_text() == f"# B\n\nbefore\n<!-- bench:figures -->\n{EXPECTED}<!-- /bench:figures -->\nafter\n"
    assert bench_doc.main([*argv, "--check"]) == 0
    assert bench_doc.main(["--results", str(tmp_path / "none.json"), "--doc", str(doc)]) == 2


def test_a_doc_without_exactly_one_region_is_refused() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        bench_doc.rewrite("no region here\n", EXPECTED)


def test_it_reads_what_make_bench_writes(tmp_path: Path) -> None:
    """`harness.write_results` stamps each figure with its run; one kept from an earlier run keeps its own."""
    path = tmp_path / "results.json"
    earlier = FIXTURE["machine"] | {"date": "2026-12-01T09:00:00Z"}
    harness.write_results([harness.Figure("journal bytes per exec", 4000.5, "bytes")], earlier, path)
    harness.write_results(
        [harness.Figure("exec throughput, 16 clients", 610.0, "req/s", ">= 600 req/s", met=True)],
        FIXTURE["machine"],
        path,
    )
    rendered = bench_doc.render(json.loads(path.read_text()))
    assert "| exec throughput, 16 clients | 610 req/s | — | — | >= 600 req/s | yes |" in rendered
    assert "| journal bytes per exec (1) | 4000.5 bytes |" in rendered
    assert "1. journal bytes per exec: measured 2026-12-01 09:00 UTC, load average 0.50 at the start" in rendered


def test_benchmarks_md_opens_with_the_generated_table() -> None:
    doc = (REPO / "docs" / "benchmarks.md").read_text()
    region = doc.split("<!-- bench:figures -->\n", 1)[1].split("<!-- /bench:figures -->", 1)[0]
    assert doc.index("<!-- bench:figures -->") < doc.index("## What each figure means")
    assert region.startswith("Measured ") and "| figure | value | yardstick | ratio | target | met |" in region


def test_an_ab_run_is_rendered_into_its_own_region(tmp_path: Path) -> None:
    """`make bench-ab BEFORE=...` (bench/exec_ab.py --json): its figure and its run land in the A/B region only."""
    results, ab = tmp_path / "results.json", tmp_path / "results-ab.json"
    results.write_text(json.dumps(FIXTURE))
    figure = harness.Figure("exec `true` p50, A/B against 10b6343", 9.9, "ms", "<= 1.05x", "10b6343", 9.5, 1.042, True)
    run = FIXTURE["machine"] | {"before": "10b6343", "requests": 1000}
    ab.write_text(json.dumps({"machine": run, "figures": [vars(figure)]}))
    doc = tmp_path / "benchmarks.md"
    doc.write_text("<!-- bench:figures -->\nx\n<!-- /bench:figures -->\n<!-- bench:ab -->\ny\n<!-- /bench:ab -->\n")
    assert bench_doc.main(["--results", str(results), "--ab", str(ab), "--doc", str(doc)]) == 0
    text = doc.read_text()
    figures, rest = text.split("<!-- /bench:figures -->")
    assert "A/B against" not in figures and figures.count("| figure |") == 1
    assert "| row | before (10b6343) | after (abc1234) | after/before | target | within |" in rest
    assert "| exec `true` p50, A/B against 10b6343 | 9.50 ms | 9.90 ms | 1.04x | <= 1.05x | yes |" in rest
    assert "`make bench-ab BEFORE=10b6343`, 1000 exec requests each" in rest

"""docs/benchmarks.md's table of today's figures, generated from bench/results.json (`make bench-doc`).

`make bench` writes bench/results.json: every figure with its yardstick, ratio,
target and whether it was met, and the machine it ran on with the load around
it.  This rewrites the table between ``<!-- bench:figures -->`` and
``<!-- /bench:figures -->`` in docs/benchmarks.md from that file, so the
numbers a reader finds first are the last run's, with what they were measured
on.  A figure carried over from an earlier run (``--only`` keeps the others;
the container rows come from bench/results-system.json when they were not
re-measured) says when it was measured.  The A/B table (``<!-- bench:ab -->``)
comes the same way from bench/results-ab.json, which `make bench-ab
BEFORE=<commit>` writes.  Nothing is measured here.

    .venv/bin/python bench/bench_doc.py [--results bench/results.json] [--ab bench/results-ab.json]
                                        [--doc docs/benchmarks.md] [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from harness import REPO, RESULTS, fmt

DOC = REPO / "docs" / "benchmarks.md"
AB = REPO / "bench" / "results-ab.json"
MARK = "bench:figures"
AB_MARK = "bench:ab"


def _region(mark: str) -> re.Pattern[str]:
    return re.compile(rf"(<!-- {mark} -->\n)(.*?)(<!-- /{mark} -->)", re.S)


def _cell(text: object) -> str:
    """A table cell: a ``|`` in a figure's name must not end the cell."""
    return str(text).replace("|", "\\|")


def _when(date: str) -> str:
    """``2026-12-04T00:05:12Z`` as a reader says it, ``2026-12-04 00:05 UTC``; any other text as it is."""
    found = re.fullmatch(r"(\d{4}-\d\d-\d\d)T(\d\d:\d\d).*", date)
    return f"{found.group(1)} {found.group(2)} UTC" if found else date


def _load(pair: Any) -> str:
    if isinstance(pair, str):  # said in words (a run transcribed by hand)
        return pair
    if isinstance(pair, list | tuple) and len(pair) == 2 and all(isinstance(v, list | tuple) for v in pair):
        return f"load average {pair[0][0]:.2f} at the start and {pair[1][0]:.2f} at the end"
    if isinstance(pair, int | float):
        return f"load average {pair:.2f}"
    return "load not recorded"


def _ab_how(m: dict[str, Any]) -> str:
    """How an A/B run was made: the commit, a smoke run said as such, the exec requests per tree."""
    quick = " AB_ARGS=--quick" if m.get("quick") else ""
    return f"`make bench-ab BEFORE={m['before']}{quick}`, {m['requests']} exec requests each"


def _machine(m: dict[str, Any]) -> str:
    """One paragraph: when, at which commit, on what, under which load, from which file."""
    at = f" at {m['commit']}" if m.get("commit") else ""
    how = [_ab_how(m) if m.get("before") else "`make bench`"]
    if m.get("seconds"):
        how.append(f"{m['seconds']:.0f} s")
    how.append("as root" if m.get("root") else "not as root (the container rows need root)")
    on = [f"{m['cores']} cores" + (f" ({m['cpu']})" if m.get("cpu") else "")]
    on += [f"{m['memory_gib']} GiB"] if m.get("memory_gib") else []
    on += [
        f"{label} {m[key]}"
        for key, label in (("kernel", "kernel"), ("python", "Python"), ("debian", "Debian"))
        if m.get(key)
    ]
    load = _load([m.get("load_average_start"), m.get("load_average_end")])
    source = m.get("source") or "bench/results.json"
    return (
        f"Measured {_when(m['date'])}{at} ({', '.join(how)}) on {', '.join(on)}; **{load}**. "
        f"From {source}; `make bench-doc` rewrites this table from the next run."
    )


def render(results: dict[str, Any]) -> str:
    """The region's text: the machine, the table, and when each figure from another run was measured."""
    machine = results["machine"]
    rows = ["| figure | value | yardstick | ratio | target | met |", "|---|---|---|---|---|---|"]
    elsewhere: list[str] = []
    for f in results["figures"]:
        name = _cell(f["name"])
        measured = (f.get("extra") or {}).get("measured_at")
        if measured and _when(measured) != _when(machine["date"]):
            load = (f.get("extra") or {}).get("load_average")
            elsewhere.append(f"{len(elsewhere) + 1}. {name}: measured {_when(measured)}, {_load(load)}.")
            name += f" ({len(elsewhere)})"
        yardstick = f"{f['yardstick']}: {fmt(f.get('yardstick_value'), f['unit'])}" if f.get("yardstick") else "—"
        ratio = "—" if f.get("ratio") is None else f"{f['ratio']:.2f}x"
        met = "—" if f.get("met") is None else ("yes" if f["met"] else "**no**")
        value = fmt(f.get("value"), f["unit"])
        rows.append(f"| {name} | {value} | {_cell(yardstick)} | {ratio} | {_cell(f.get('target') or '—')} | {met} |")
    parts = [_machine(machine), "", *rows]
    if elsewhere:
        parts += ["", "Measured in another run:", "", *elsewhere]
    return "\n".join(parts) + "\n"


def render_ab(results: dict[str, Any]) -> str:
    """The A/B region: the run, one row per figure (before, after, after/before, within), then each row
    without a verdict and why (the old tree lacks it, or it failed)."""
    m = results["machine"]
    after = f"after ({m['commit']})" if m.get("commit") else "after"
    rows = [
        f"| row | before ({_cell(m['before'])}) | {after} | after/before | target | within |",
        "|---|---|---|---|---|---|",
    ]
    why: list[str] = []
    for f in results["figures"]:
        ratio = "—" if f.get("ratio") is None else f"{f['ratio']:.2f}x"
        within = "—" if f.get("met") is None else ("yes" if f["met"] else "**no**")
        before, value = fmt(f.get("yardstick_value"), f["unit"]), fmt(f.get("value"), f["unit"])
        rows.append(
            f"| {_cell(f['name'])} | {before} | {value} | {ratio} | {_cell(f.get('target') or '—')} | {within} |"
        )
        if f.get("met") is None and f.get("note"):
            why.append(f"- {_cell(f['name'])}: {f['note']}")
    parts = [_machine(m), "", *rows]
    if why:
        parts += ["", "Not compared:", "", *why]
    return "\n".join(parts) + "\n"


def rewrite(doc: str, table: str, mark: str = MARK) -> str:
    """``doc`` with its ``mark`` region replaced by ``table``; ValueError when it has none."""
    region = _region(mark)
    if len(region.findall(doc)) != 1:
        raise ValueError(f"the doc must hold exactly one <!-- {mark} --> ... <!-- /{mark} --> region")
    return region.sub(lambda m: m.group(1) + table + m.group(3), doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help="a results file `make bench` wrote")
    parser.add_argument("--ab", type=Path, default=AB, help="the A/B results `make bench-ab` wrote (if any)")
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--check", action="store_true", help="only say whether the doc is current (exit 1 if not)")
    args = parser.parse_args(argv)
    ab = args.ab.exists() and f"<!-- {AB_MARK} -->" in args.doc.read_text()
    if not args.results.exists() and not ab:
        print(f"bench-doc: no {args.results}: run `make bench` first", file=sys.stderr)
        return 2
    doc = args.doc.read_text()
    fresh = rewrite(doc, render(json.loads(args.results.read_text()))) if args.results.exists() else doc
    if ab:
        fresh = rewrite(fresh, render_ab(json.loads(args.ab.read_text())), AB_MARK)
    if args.check:
        current = fresh == doc
        print(f"bench-doc: {args.doc} is {'current' if current else 'not current'} with {args.results}")
        return 0 if current else 1
    if fresh != doc:
        args.doc.write_text(fresh)
        print(f"bench-doc: rewrote the figures in {args.doc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

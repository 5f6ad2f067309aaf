# `make bench` and `make stress` (issue 9).  Included by the Makefile.
#
# bench:  prints issue 9's figures beside their yardsticks and writes
#         bench/results.json.  As root it installs sudo if missing and adds a
#         NOPASSWD drop-in for a bench user for the run (removed afterwards).
#         BENCH_ARGS=--quick for a short try-out run.
# bench-doc: rewrites docs/benchmarks.md's table of today's figures from bench/results.json.
# stress: tests/stress against live `airlock dev up` stacks.  Counts come from
#         AIRLOCK_STRESS_N (default 20000) and AIRLOCK_STRESS_CLIENTS (32).
#         test_flood.py (root): one agent floods output and journal bytes beside a victim agent.

BENCH_ARGS ?=
STRESS_ARGS ?=

# As root it also builds the .deb and boots the system tests' Debian 12 container
# for the container rows (issue 37); otherwise those rows say why they are n/a.
bench: $(BIN)/airlock
	@if [ "$$(id -u)" = 0 ]; then $(MAKE) --no-print-directory test-system-deps deb >/dev/null || \
	  echo "bench: could not build the .deb: the container rows will say so"; fi
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python bench/airlock_bench.py $(BENCH_ARGS)

# A/B against the tree before (issues 47, 50: "no row regresses by more than 5%, in one run"): this
# tree and BEFORE (a commit; its services/ and console script exported with git archive), two live
# stacks, every row's samples alternating between them: exec p50/p99, exec throughput (16 clients),
# airlock run -- true, approval round trip, cat | wc -c, cold start.  AB_ARGS=--quick for a smoke
# run, AB_ARGS="--only latency cli" for some rows.  Writes bench/results-ab.json; `make bench-doc`
# renders it into docs/benchmarks.md's A/B table.
BEFORE ?= HEAD~1
AB_ARGS ?=
AB_REQUESTS ?=
bench-ab: $(BIN)/airlock
	@rm -rf build/bench-before && mkdir -p build/bench-before
	git archive "$(BEFORE)" services $$(git ls-tree -r --name-only "$(BEFORE)" packaging/debian/airlock-console) \
	  | tar -x -C build/bench-before
	$(BIN)/python bench/exec_ab.py --before build/bench-before/services $(if $(AB_REQUESTS),--requests $(AB_REQUESTS)) \
	  --before-name "$$(git rev-parse --short "$(BEFORE)")" --json bench/results-ab.json $(AB_ARGS)

# docs/benchmarks.md's table of today's figures, rewritten from bench/results.json (issue 47).
bench-doc: $(BIN)/airlock
	$(BIN)/python bench/bench_doc.py

stress: $(BIN)/airlock
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/stress $(STRESS_ARGS)

# The journal's soak alone (issue 38; also part of `make stress`): AIRLOCK_SOAK_RECORDS (300000) records
# into 4 MiB segments, and a live stack with 256 KiB segments; verify --full at the end, 0 lost, 0 unaudited.
soak: $(BIN)/airlock
	$(BIN)/python -m pytest -q -s -p no:cacheprovider -rs tests/stress/test_soak.py $(STRESS_ARGS)

# The agent door alone (issue 4): ping and exec with 1 and 16 clients beside fork/exec.
bench-door: $(BIN)/airlock
	$(BIN)/python bench/door_bench.py $(BENCH_ARGS)

# Exec latency per containment (issue 22): service vs scope vs process group, in one
# run.  Needs systemd as PID 1: boots the system tests' Debian 12 container (root),
# installs the .deb and runs bench/units_bench.py inside it.
bench-units: $(BIN)/airlock
	@[ "$$(id -u)" = 0 ] || { echo "bench-units: needs root (it boots a container)"; exit 2; }
	$(MAKE) --no-print-directory test-system-deps deb
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python bench/units_container.py $(BENCH_ARGS)

# Cold start under real socket activation (issue 21): boots the system tests'
# Debian 12 container, installs the .deb, stops every airlock service and times
# the first `airlock run -- true` (systemd starts each service on demand), and
# the same command warm, and `airlock run -- true` beside sudo in the container.
# Writes bench/results-system.json; `make bench` measures the same itself as root
# and otherwise prints the file's figures, with their date, when it is there.
bench-system: $(BIN)/airlock
	@[ "$$(id -u)" = 0 ] || { echo "bench-system: needs root (it boots a container)"; exit 2; }
	$(MAKE) --no-print-directory test-system-deps deb
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python bench/cold_container.py --json bench/results-system.json $(BENCH_ARGS)

# The container rows A/B against the tree before (issue 50): that commit's .deb
# built from a clone of it, this tree's .deb, two containers booted side by side
# and their steps alternating (bench/container_ab.py). Root only.
bench-ab-system: $(BIN)/airlock
	@[ "$$(id -u)" = 0 ] || { echo "bench-ab-system: needs root (it boots containers)"; exit 2; }
	@[ -n "$(BEFORE)" ] || { echo "bench-ab-system: say BEFORE=<commit>"; exit 2; }
	$(MAKE) --no-print-directory test-system-deps deb
	rm -rf build/bench-before-tree && git clone -q . build/bench-before-tree && git -C build/bench-before-tree checkout -q "$(BEFORE)"
	$(MAKE) --no-print-directory -C build/bench-before-tree deb
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python bench/container_ab.py \
	  --before "$$(ls -t build/bench-before-tree/dist/*.deb | head -1)" --json bench/results-ab-system.json $(BENCH_ARGS)


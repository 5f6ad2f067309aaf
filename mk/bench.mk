# `make bench` and `make stress` (issue 9).  Included by the Makefile.
#
# bench:  prints issue 9's figures beside their yardsticks and writes
#         bench/results.json.  As root it installs sudo if missing and adds a
#         NOPASSWD drop-in for a bench user for the run (removed afterwards).
#         BENCH_ARGS=--quick for a short try-out run.
# stress: tests/stress against live `airlock dev up` stacks.  Counts come from
#         AIRLOCK_STRESS_N (default 20000) and AIRLOCK_STRESS_CLIENTS (32).

BENCH_ARGS ?=
STRESS_ARGS ?=

bench: $(BIN)/airlock
	$(BIN)/python bench/airlock_bench.py $(BENCH_ARGS)

stress: $(BIN)/airlock
	$(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/stress $(STRESS_ARGS)

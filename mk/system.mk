# System tests (issue 3): the .deb installed in a Debian 12 container booted
# with systemd-nspawn, driven with nsenter.  Needs root; the cached root lives
# in $(AIRLOCK_SYSTEST_DIR) (default /var/tmp/airlock-systest), built once with
# debootstrap.  Without root the tests skip and say why.

SYSTEST_PACKAGES := systemd-container debootstrap util-linux

.PHONY: test-system test-system-deps

test-system-deps:
	@if [ "$$(id -u)" = 0 ]; then :; else echo "test-system: not root: the system tests will skip (they boot a container)"; fi
	$(if $(filter 0,$(shell id -u)),$(call apt-need,$(SYSTEST_PACKAGES)),@true)

test-system: test-system-deps deb $(BIN)/airlock
	@start=$$(date +%s); \
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python -m pytest -v -rs -p no:cacheprovider tests/system; rc=$$?; \
	echo "test-system: $$(( $$(date +%s) - start ))s"; exit $$rc

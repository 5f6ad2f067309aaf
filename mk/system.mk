# System tests (issue 3): the .deb installed in a Debian 12 container booted
# with systemd-nspawn, driven with nsenter.  Needs root: as root this target
# installs its tools, builds the .deb and runs tests/system; otherwise the
# tests skip and say why.  The cached root lives in $AIRLOCK_SYSTEST_DIR
# (default /var/tmp/airlock-systest), built once with debootstrap.

SYSTEST_PACKAGES := systemd-container debootstrap util-linux
# test_9_fleet: the test CA (openssl) and the network zone's bridge (ip)
SYSTEST_PACKAGES += openssl iproute2

.PHONY: test-system test-system-deps

test-system-deps:
	$(call apt-need,$(SYSTEST_PACKAGES))

test-system: $(BIN)/airlock
	@if [ "$$(id -u)" = 0 ]; then \
	  $(MAKE) --no-print-directory test-system-deps deb || exit 1; \
	else \
	  echo "test-system: not root: the system tests boot a container and will skip"; \
	fi; \
	start=$$(date +%s); \
	AIRLOCK_DEB="$(abspath $(DEB_FILE))" $(BIN)/python -m pytest -v -rs --durations=8 -p no:cacheprovider tests/system; rc=$$?; \
	echo "test-system: $$(( $$(date +%s) - start ))s"; exit $$rc

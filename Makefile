# airlock — the two set-up commands are `make run` and `make test`.
# Everything runs on Debian 12's own python3 with Debian's libraries
# (python3-yaml, -structlog, -systemd, -sdnotify): the same versions the
# package depends on.  Test tools come from PyPI into .venv.

SHELL := /bin/bash
PYTHON := /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
# pybuild and our venv must not pick up a pyenv shim or another python3.
export PATH := /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:$(PATH)

DEB_PACKAGES := python3 python3-venv python3-yaml python3-structlog python3-systemd python3-sdnotify \
	python3-dbus python3-aiosmtpd
# ssh-keygen verifies signed approvals (issue 18); issue 19's tests: collector files (systemd-journal-remote), a loopback sshd and tmux (airlock --host, watch)
DEB_PACKAGES += systemd-journal-remote openssh-server openssh-client tmux
# setfacl/getfacl: a privileged write keeps the ACL of the file it replaces (issue 39)
DEB_PACKAGES += acl
# Issue 33: passkeys (WebAuthn) are checked by approval with Debian's python3-fido2 (0.9.1).
DEB_PACKAGES += python3-fido2
# node and npm: the official MCP TypeScript SDK client drives `airlock mcp` in the tests (issue 31);
# a node already on PATH (say from NodeSource, whose nodejs conflicts with Debian's npm) counts
DEB_PACKAGES += nodejs npm
# airlock-web (issue 33): aiohttp serves it (a runtime Depends), and Debian's chromium drives
# the browser test (tests/integration/test_web_browser.py) headless.
DEB_PACKAGES += python3-aiohttp chromium
# The SDK's pinned version (tests/mcp_ts/package-lock.json), installed like the Python test tools.
MCP_TS := tests/mcp_ts

.PHONY: all run test test-deps test-unit test-integration lint fmt deps clean bench bench-ab bench-ab-system bench-doc stress soak

all: test

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  case $$p in nodejs) command -v node >/dev/null && continue;; npm) command -v npm >/dev/null && continue;; esac; \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else \
	    echo "airlock needs these Debian packages; run as root:"; \
	    echo "  apt-get install$$missing"; exit 1; \
	  fi; \
	fi

$(BIN)/airlock: pyproject.toml packaging/debian/airlock-console | deps
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[test]'
	@# `airlock` starts as the .deb's does (python -I -S, issue 37), over this checkout's services/.
	sed -e '1s|.*|#!$(abspath $(BIN))/python3 -IS|' -e 's|"/usr/lib/python3/dist-packages"|"$(CURDIR)/services"|' \
	  packaging/debian/airlock-console > $@.new && chmod 0755 $@.new && mv $@.new $@

venv: $(BIN)/airlock

# npm ci installs exactly the lock file's versions (node_modules is not in git).
$(MCP_TS)/node_modules/.package-lock.json: $(MCP_TS)/package.json $(MCP_TS)/package-lock.json | deps
	npm ci --prefix $(MCP_TS) --no-audit --no-fund --loglevel=error

test-deps: $(BIN)/airlock $(MCP_TS)/node_modules/.package-lock.json

run: $(BIN)/airlock
	$(BIN)/airlock dev up --runtime-dir ./run

# Coverage is measured in the test process (unit tests, clients, the CLI run in
# it); the services `airlock dev up` starts run in child processes and are not.
test: test-deps
	$(BIN)/python -m coverage run -m pytest -q tests/unit tests/integration tests/security tests/conformance
	@echo "coverage: $$($(BIN)/python -m coverage report --format=total)% of services/airlock's lines ran in the test process (see 'coverage report')"

test-unit: $(BIN)/airlock
	$(BIN)/python -m pytest -q tests/unit

test-integration: test-deps
	$(BIN)/python -m pytest -q tests/integration

lint: $(BIN)/airlock
	$(BIN)/ruff check services tests bench
	$(BIN)/ruff format --check services tests bench
	$(BIN)/mypy

# Format the tree (ruff format); `make lint` and tests/unit/test_lint.py check it.
fmt: $(BIN)/airlock
	$(BIN)/ruff format services tests bench

clean:
	rm -rf $(VENV) run dist build .pytest_cache .mypy_cache .ruff_cache .coverage $(MCP_TS)/node_modules

-include mk/*.mk

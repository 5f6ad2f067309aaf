# The Debian package and the unit checks (issue 3).
#   make deb          dist/airlock_<version>_all.deb, then lintian
#   make check-units  systemd-analyze verify + security figures for every unit
# Both install what they need with apt-get when run as root, and otherwise say
# exactly what to install.

DEB_BUILD_PACKAGES := dpkg-dev debhelper dh-python pybuild-plugin-pyproject \
	python3-all python3-setuptools python3-build python3-installer lintian tar
UNIT_CHECK_PACKAGES := systemd procps
# airlock-exectree's stated exposure limit, in tenths (docs/security.md: the exec-tree listener).
EXECTREE_LIMIT := 20
DEB_VERSION = $(shell dpkg-parsechangelog -l packaging/debian/changelog -S Version)
DEB_FILE = dist/airlock_$(DEB_VERSION)_all.deb
# What the package is built with: Debian's own tools, never a pyenv shim.
DEB_ENV := env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8

# $(call apt-need,packages): install missing Debian packages as root, else explain.
define apt-need
	@missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "installing:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else \
	    echo "$@ needs these Debian packages; as root run:"; \
	    echo "  apt-get install --no-install-recommends$$missing"; exit 1; \
	  fi; \
	fi
endef

.PHONY: deb deb-deps check-units check-units-deps

deb-deps:
	$(call apt-need,$(DEB_BUILD_PACKAGES))

# dpkg-buildpackage wants debian/ at the top of the source tree: build in a
# copy under a temporary directory (packaging/debian becomes debian/), so no
# build output ever lands in the checkout except dist/*.deb.
deb: deb-deps
	@set -eu; \
	ver="$(DEB_VERSION)"; \
	pyver=$$(sed -n 's/^version *= *"\(.*\)"/\1/p' pyproject.toml); \
	if [ "$$ver" != "$$pyver" ]; then \
	  echo "deb: packaging/debian/changelog says $$ver but pyproject.toml says $$pyver;"; \
	  echo "     add a changelog entry (dch -c packaging/debian/changelog -v $$pyver)"; exit 1; \
	fi; \
	tmp=$$(mktemp -d "$${TMPDIR:-/tmp}/airlock-deb.XXXXXX"); \
	trap 'rm -rf "$$tmp"' EXIT; \
	src="$$tmp/airlock-$$ver"; mkdir -p "$$src"; \
	tar --exclude-vcs --exclude=./.venv --exclude=./dist --exclude=./run --exclude=./build \
	    --exclude='*.egg-info' --exclude=__pycache__ --exclude=.pytest_cache --exclude=.mypy_cache \
	    --exclude=.ruff_cache --exclude=.hypothesis --exclude=./packaging --exclude=./tests/mcp_ts/node_modules \
	    -cf - . | tar -xf - -C "$$src"; \
	cp -a packaging/debian "$$src/debian"; \
	echo "deb: building airlock $$ver in $$src"; \
	(cd "$$src" && $(DEB_ENV) HOME="$$tmp" dpkg-buildpackage -us -uc -b >"$$tmp/build.log" 2>&1) || \
	  { tail -n 60 "$$tmp/build.log"; echo "deb: dpkg-buildpackage failed (log above)"; exit 1; }; \
	mkdir -p dist; \
	cp "$$tmp/airlock_$${ver}_all.deb" dist/; \
	echo "deb: built dist/airlock_$${ver}_all.deb"; \
	echo "deb: lintian (fails on errors and warnings; info tags are listed in docs/packaging.md):"; \
	$(DEB_ENV) lintian --fail-on error,warning --display-info "$$tmp/airlock_$${ver}_all.deb" \
	  && echo "deb: lintian: no errors, no warnings"

check-units-deps:
	$(call apt-need,$(UNIT_CHECK_PACKAGES))

# systemd-analyze verify needs the units' executables and the targets they
# name: give it a small root with this machine's units, ours, and stub
# executables.  verify exits 0 even on unknown keys, so any output fails.
# Figures: exposure must stay <= 1.0 for intake, approval and journal,
# <= 2.0 for notify (it needs the network), <= 1.5 for web (issue 33) and for the runner
# (issue 47: the exec trees' rights left it), <= EXECTREE_LIMIT for the exec-tree listener
# (docs/security.md says why they cannot go lower).  The limit is systemd-analyze's own
# --threshold exit status (not a pipe's last command's, which let 2.3 pass a 2.5 limit
# unchecked as well as any other figure).
check-units: check-units-deps
	@set -eu; \
	systemd-analyze --version | head -n 1; \
	root=$$(mktemp -d "$${TMPDIR:-/tmp}/airlock-units.XXXXXX"); \
	trap 'rm -rf "$$root"' EXIT; \
	mkdir -p "$$root/lib/systemd" "$$root/usr/libexec/airlock" "$$root/bin" "$$root/usr/bin" "$$root/etc"; \
	printf '#!/bin/sh\n' >"$$root/usr/bin/airlock"; chmod 0755 "$$root/usr/bin/airlock"; \
	cp -a /lib/systemd/system "$$root/lib/systemd/"; \
	cp units/*.socket units/*.service units/*.slice "$$root/lib/systemd/system/"; \
	cp /bin/kill "$$root/bin/"; \
	for s in intake approval runner journal notify web exectree; do \
	  printf '#!/bin/sh\n' >"$$root/usr/libexec/airlock/airlock-$$s"; chmod 0755 "$$root/usr/libexec/airlock/airlock-$$s"; \
	done; \
	units=$$(cd units && ls *.socket *.service *.slice); \
	out=$$(cd "$$root/lib/systemd/system" && systemd-analyze verify --man=no --root="$$root" $$units 2>&1 || true); \
	if [ -n "$$out" ]; then echo "$$out"; echo "check-units: systemd-analyze verify is not clean"; exit 1; fi; \
	echo "verify: clean ($$(echo $$units | wc -w) units)"; \
	if command -v systemd-sysusers >/dev/null; then \
	  mkdir -p "$$root/usr/lib/sysusers.d" && cp units/airlock.sysusers "$$root/usr/lib/sysusers.d/airlock.conf"; \
	  systemd-sysusers --dry-run --root="$$root" airlock.conf >/dev/null 2>"$$root/sysusers.err" || \
	    { cat "$$root/sysusers.err"; echo "check-units: sysusers.d file rejected"; exit 1; }; \
	  echo "sysusers: ok"; \
	fi; \
	fail=0; \
	for s in intake approval journal runner notify web exectree; do \
	  limit=10; [ $$s = runner ] && limit=15; [ $$s = notify ] && limit=20; [ $$s = web ] && limit=15; \
	  [ $$s = exectree ] && limit=$(EXECTREE_LIMIT); \
	  out=$$(systemd-analyze security --offline=yes --root="$$root" --threshold=$$limit "airlock-$$s.service" 2>&1) || fail=1; \
	  line=$$(printf '%s\n' "$$out" | tail -n 1); \
	  echo "security: $$line (limit $$((limit / 10)).$$((limit % 10)))" | sed 's/→ Overall exposure level for //'; \
	done; \
	[ $$fail = 0 ] || { echo "check-units: an exposure level is over its limit"; exit 1; }

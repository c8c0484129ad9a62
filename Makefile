# Build, test and lint targets. `make test` is the project's test command (CI runs it).
SHELL := /bin/bash
VENV  := .venv
PY    := $(VENV)/bin/python
FORGE := scripts/toolchain/node_modules/@foundry-rs/forge-linux-amd64/bin/forge

.PHONY: setup test test-contracts test-python lint gas artifacts demo clean

setup:
	@bash scripts/setup.sh

# The contracts' tests run beside the Python suite, which is spread over PYTEST_WORKERS
# processes (scripts/test.sh); `make test-contracts` and `make test-python` run one each.
PYTEST_WORKERS ?= 3

test: setup
	@bash scripts/test.sh $(PYTEST_WORKERS)

# The native forge binary: the npm wrapper exits 0 even when tests fail.
test-contracts: setup
	$(FORGE) test
	# cold storage, as in real transactions: every hook call fits the core's 500k (3 and 32 members)
	$(FORGE) test --isolate --match-test "test_wholeJobThroughHooks|test_hookGasCap"

test-python: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check sdk node tests scripts
	$(VENV)/bin/ruff format --check sdk node tests scripts
	$(FORGE) fmt --check contracts/src contracts/test

# Rebuild the ABI and bytecode the SDK ships (a test fails while they are stale).
artifacts: setup
	$(PY) scripts/build_artifacts.py

gas: setup
	$(PY) scripts/gas_report.py

# The whole story on a local devnet (see README); options: make demo ARGS="--no-faults".
demo: setup
	$(PY) -m dtrain_node.devnet $(ARGS)

clean:
	rm -rf contracts/out contracts/cache .pytest_cache .ruff_cache

#!/usr/bin/env bash
# `make test`: the contracts' forge tests in the background (their output kept and shown at the
# end) while pytest spreads the Python suite over WORKERS processes (pytest-xdist): most
# end-to-end tests wait on their nodes and the chain, so their waits overlap. Each worker holds
# one running test and one queued (`--maxschedchunk 1`), handed out longest first (tests/conftest.py),
# so every worker stays busy to the end. Fails when either suite fails.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Three workers on two cores: most end-to-end tests wait on windows and nodes, so a third
# worker fills the time the other two wait (and, beside other busy processes, takes the suite's
# share of the cores); docs/benchmarks.md, "Test suite".
workers="${1:-3}"
# The suite starts hundreds of interpreters: each must find torch's and transformers' bytecode
# written by the first (with PYTHONDONTWRITEBYTECODE set, each compiled them again: ~7 s of
# CPU per `dtrain` command).
unset PYTHONDONTWRITEBYTECODE
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
make --no-print-directory test-contracts >"$log" 2>&1 &
forge=$!
# One thread per torch in each worker and in what it starts: the workers already fill the
# cores, and more threads only spin against each other (tests that want more ask for them).
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 \
  .venv/bin/python -m pytest -q -n "$workers" --dist load --maxschedchunk 1
py=$?
wait "$forge"
contracts=$?
echo "---- contracts (forge test)"
if [[ $contracts -eq 0 ]]; then
  grep -E "^Ran [0-9]+ test suites|^Suite result: FAILED" "$log" || tail -n 5 "$log"
else
  cat "$log"
fi
echo "python suite exit $py, contracts exit $contracts"
[[ $py -eq 0 && $contracts -eq 0 ]]

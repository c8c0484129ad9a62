#!/usr/bin/env bash
# Installs everything the project needs on a fresh machine that reaches only the package
# registries: pinned npm tools (forge, anvil, cast, solcjs, OpenZeppelin) and a .venv with the
# project installed editable. Idempotent: each step is skipped while its inputs are unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

fail() { echo "setup: $*" >&2; exit 1; }

command -v python3 >/dev/null || fail "python3 not found; install Python 3.11 or newer"
python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
  || fail "Python 3.11+ required, found $(python3 --version 2>&1)"
command -v node >/dev/null || fail "node not found; install Node.js 20 or newer"
[[ "$(node -p 'process.versions.node.split(".")[0]')" -ge 20 ]] \
  || fail "Node.js 20+ required, found $(node --version)"
command -v npm >/dev/null || fail "npm not found; install npm (comes with Node.js)"
python3 -c 'import venv' 2>/dev/null || fail "python3 venv module missing (apt-get install python3-venv)"
command -v gcc >/dev/null || fail "gcc not found (libp2p builds fastecdsa): apt-get install gcc"
# libp2p pins fastecdsa 2.3.2, which compiles against GMP.
if ! echo '#include <gmp.h>' | gcc -E - >/dev/null 2>&1; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing libgmp-dev (GMP headers for fastecdsa)"
    (apt-get install -y -q libgmp-dev >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q libgmp-dev >/dev/null; }) \
      || fail "could not install libgmp-dev; install it and rerun"
  else
    fail "GMP headers missing (libp2p builds fastecdsa): apt-get install libgmp-dev"
  fi
fi
# The job page's browser test drives Debian's Chromium (playwright cannot download one here).
if [[ ! -x /usr/bin/chromium ]]; then
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium (headless browser of the job page test)"
    (apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }) \
      || fail "could not install chromium; install it and rerun"
  else
    fail "/usr/bin/chromium missing (the job page test drives it): apt-get install chromium"
  fi
fi

stamp_ok() { [[ -f "$1" && "$(cat "$1")" == "$2" ]]; }

# npm toolchain
npm_key="$(cat scripts/toolchain/package.json scripts/toolchain/package-lock.json | sha256sum | cut -c1-16)"
forge_bin="scripts/toolchain/node_modules/@foundry-rs/forge-linux-amd64/bin/forge"
if ! stamp_ok .setup-stamp-npm "$npm_key" || [[ ! -x "$forge_bin" ]]; then
  echo "setup: installing npm toolchain (forge, anvil, cast, solcjs, OpenZeppelin)"
  (cd scripts/toolchain && npm ci --no-audit --no-fund --loglevel=error)
  [[ -x "$forge_bin" ]] || fail "forge binary missing after npm ci ($forge_bin); only linux-x64 is supported"
  echo "$npm_key" > .setup-stamp-npm
fi

# python venv
py_key="$(cat pyproject.toml | sha256sum | cut -c1-16)"
if ! stamp_ok .setup-stamp-py "$py_key" || [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv and installing the project (with uv; torch pinned)"
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  # uv installs what pip would (the same versions) in seconds instead of minutes; it reads no
  # pip configuration, so it gets pip's find-links (where a CPU torch wheel may lie). torch is
  # pinned: an open range would pick a multi-GB CUDA build. pip is the fallback. Unlike pip,
  # uv compiles no bytecode at install: Python writes it on first import (`make test` makes
  # sure it may, scripts/test.sh).
  links="$(.venv/bin/pip config get global.find-links 2>/dev/null || true) ${PIP_FIND_LINKS:-}"
  uv_links=()
  for l in $links; do [[ -d "$l" ]] && uv_links+=(--find-links "$l"); done
  if ! { .venv/bin/pip install --quiet uv \
      && .venv/bin/uv pip install --quiet --python .venv/bin/python "${uv_links[@]}" \
        "torch==2.13.0" -e ".[dev]"; }; then
    echo "setup: uv failed; installing with pip"
    .venv/bin/pip install --quiet --upgrade pip
    .venv/bin/pip install --quiet "torch==2.13.0"
    .venv/bin/pip install --quiet -e ".[dev]"
  fi
  echo "$py_key" > .setup-stamp-py
fi
echo "setup: ok"

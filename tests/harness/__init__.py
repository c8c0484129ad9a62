"""Test harnesses: multi-process gossip workers and clusters, chain helpers, benchmark baselines.

Nothing in the product imports these. Child processes find them with `harness_env()`.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def harness_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that runs `python -m harness.<module>`."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def default_sigint() -> None:
    """`preexec_fn` for a child that a test stops with Ctrl-C: a test run that ignores SIGINT (a
    shell's background job) would pass the ignore on, and the child would never stop."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

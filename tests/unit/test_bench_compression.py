"""The compression benchmark's CI smoke run goes through: every arm trains to a finite loss
with four honest workers, and the robust rule's exclusions of honest workers are reported
(not hidden)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_compression_quick_runs_through(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "scripts/bench_compression.py"), "--quick"]
    cmd += ["--steps", "16", "--out", str(tmp_path)]  # every local arm syncs at least once
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=570)
    assert done.returncode == 0, done.stderr[-2000:]
    recs = json.loads((tmp_path / "compression.json").read_text())
    assert {r["method"] for r in recs} == {"ddp", "diloco", "paper", "local"}
    assert all(math.isfinite(r["heldout_loss_mean"]) for r in recs)
    assert all(isinstance(r["honest_exclusions"], int) for r in recs if r["k_per_chunk"])
    assert "honest excl." in (tmp_path / "compression.md").read_text()

"""The replay benchmark's quick run goes through on the product's model and finds every honest
packet reproduced byte for byte at the member's thread count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_bench_replay_quick_reproduces_every_packet(tmp_path: Path) -> None:
    cmd = [sys.executable, str(ROOT / "scripts/bench_replay.py"), "--quick", "--out", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads((tmp_path / "replay.json").read_text())
    assert row["model"] == "builtin:tiny" and row["rounds"] == 3
    assert row["threads1"]["exact"] == 3
    assert row["private_state_bytes"] > 2 * 4 * row["params"]  # e and both AdamW moments
    assert "| builtin:tiny |" in (tmp_path / "replay.md").read_text()

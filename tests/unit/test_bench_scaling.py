"""Smoke test of scripts/bench_scaling.py --quick: it runs and writes sane JSON and markdown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = "demo K=2 k=4 1b beta=0.95"  # the default arm: the product's default DeMo setting


def test_quick_run_writes_sane_json(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_scaling.py"), "--quick", "--out", str(out)],
        check=True,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
    )
    data = json.loads(out.read_text())
    arms = {(r["arm"], r["n"]) for r in data["runs"]}
    assert arms == {("single", 1), ("ddp", 2), (DEMO, 2)}
    for r in data["runs"]:
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == data["meta"]["setup"]["steps"]
        assert all(0 < loss < 6 for _, loss in r["curve"])
    rows = {r["arm"]: r for r in data["summary"]}
    assert rows["ddp"]["gap_vs_ddp_pct_mean"] == 0.0
    demo = rows[DEMO]
    up = demo["upload"]
    # the real packet, one gossip chunk in its signed envelope, plus the commitment envelope
    assert up["chunks"] == 1 and up["total"] == up["packet"] + 2 * data["meta"]["envelope_overhead"]
    assert demo["x_vs_bf16_ring"] > 100 and 0 < demo["codec_pct"] < 1000
    assert f"| code | 2 | {DEMO} |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000  # the loss-curve plot


def test_default_arm_follows_the_jobs_default_topk() -> None:
    """Without --demo the benchmark measures what `dtrain job submit` would pin for each N."""
    import argparse

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_scaling as b

    a = argparse.Namespace(demo=None, corpora=["code"], only_seeds=None, seeds=1, workers=[2, 4, 8])
    arms = {(n, arm.name) for _, n, arm, _ in b.plan(a, b.Setup()) if arm.kind == "demo"}
    assert arms == {(2, DEMO), (4, DEMO), (8, "demo K=2 k=6 1b beta=0.95")}

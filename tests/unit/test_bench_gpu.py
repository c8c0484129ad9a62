"""scripts/bench_gpu.py: --smoke runs every arm of the GPU benchmark on the CPU, states its pass
lines before training, and judges them on what it measured."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from dtrain.models import default_topk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))


def test_smoke_trains_every_arm_and_judges_the_pass_lines_it_stated_first(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--smoke", "--out", str(out)],
        check=True,
        cwd=ROOT,
        timeout=600,
        capture_output=True,
        text=True,
    )
    lines = done.stdout.splitlines()
    first_loss = next(i for i, line in enumerate(lines) if ": loss " in line)
    import bench_gpu

    for stated in bench_gpu.PASS_LINES.values():
        assert lines.index(f"  - {stated}") < first_loss  # stated before anything trained
    data = json.loads(out.read_text())
    steps = data["steps"]
    runs = {r["name"]: r for r in data["runs"]}
    assert list(runs) == [
        "one worker", "DDP, 2 members", "DeMo, the job default", "DeMo, 10,000x per step",
        "DeMo, the SparseLoCo point",
    ]  # fmt: skip
    for r in runs.values():
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == steps
        assert all(math.isfinite(loss) for _, loss in r["curve"])
        assert r["final"] < r["curve"][0][1], r["name"]  # every arm learned something
    default = runs["DeMo, the job default"]["arm"]
    assert default["k"] == default_topk(2, steps // default["K"])
    cheap = runs["DeMo, 10,000x per step"]
    assert cheap["x_per_step"] >= 10_000 and steps >= 2 * cheap["arm"]["K"]  # it synced
    sparse = runs["DeMo, the SparseLoCo point"]["arm"]
    assert (sparse["k"], sparse["bits"]) == (82, 2)
    assert set(data["passes"]) == set(bench_gpu.PASS_LINES)
    assert all(isinstance(v["passed"], bool) for v in data["passes"].values())
    assert out.with_suffix(".md").read_text().count("\n| ") == 6  # header and five arms


def test_the_pass_lines_are_judged_on_the_numbers() -> None:
    import bench_gpu
    from bench_gpu import Run
    from bench_scaling import Arm

    def runs(one: float, ddp: float, default: float, cheap: float, x: float) -> dict:
        rs = [
            Run("one worker", "single", 2.5e-4, final=one),
            Run("DDP, 4 members", "ddp", 5e-4, final=ddp),
            Run("DeMo, the job default", "demo", 2e-3, Arm("demo", K=2, k=4), final=default),
            Run("DeMo, 10,000x per step", "demo", 2e-3, Arm("demo", K=10, k=4), final=cheap,
                x_per_step=x),
        ]  # fmt: skip
        return {r.name: r for r in rs}

    ok = bench_gpu.check(runs(3.0, 2.0, 2.09, 2.1, 10_200))
    assert all(v["passed"] for v in ok.values())
    bad = bench_gpu.check(runs(2.0, 2.0, 2.11, 2.2, 10_200))
    assert not bad["default_beats_one_worker"]["passed"]  # level with one worker is not below
    assert not bad["default_near_ddp"]["passed"]  # +5.5%
    assert not bad["x10000_near_ddp"]["passed"]  # +10%
    short = bench_gpu.check(runs(3.0, 2.0, 2.0, 2.0, 9_000))
    assert not short["x10000_near_ddp"]["passed"]  # level with DDP, but short of 10,000x

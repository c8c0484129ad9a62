"""scripts/bench_scaling.py: --quick runs the product's model at the job defaults and writes
sane JSON and markdown; the DeMo arms are the node's; the held-out corpus is deterministic."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain.models import JobSpec
from dtrain.recipe import Recipe

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
DEMO = "demo K=2 k=4 1b"  # the default arm's member floor: a long job of up to 4 members
QUICK = "demo K=2 k=342 1b"  # the default arm of --quick's 24 steps: coverage 1 in 12 syncs


def test_quick_run_trains_builtin_tiny_and_writes_sane_json(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_scaling.py"), "--quick", "--out", str(out)],
        check=True,
        cwd=ROOT,
        timeout=300,
        capture_output=True,
    )
    data = json.loads(out.read_text())
    arms = {(r["model"], r["arm"], r["n"]) for r in data["runs"]}
    assert arms == {("builtin:tiny", "single", 1), ("builtin:tiny", "ddp", 2),
                    ("builtin:tiny", QUICK, 2)}  # fmt: skip
    assert data["meta"]["params"] == {"builtin:tiny": 410_240}  # the product's preset, not a GPT
    for r in data["runs"]:
        assert r["curve"][0][0] == 0 and r["curve"][-1][0] == data["meta"]["setup"]["steps"]
        assert all(0 < loss < 7 for _, loss in r["curve"])
        assert r["curve"][-1][1] < r["curve"][0][1]  # it trained
    rows = {r["arm"]: r for r in data["summary"]}
    assert rows["ddp"]["gap_vs_ddp_pct_mean"] == 0.0
    demo = rows[QUICK]
    up = demo["upload"]
    # the real packet, one gossip chunk in its signed envelope, plus the commitment envelope
    assert up["chunks"] == 1 and up["total"] == up["packet"] + 2 * data["meta"]["envelope_overhead"]
    # a twelfth of the coefficients, 1 bit and an index each: still far below a dense ring
    assert demo["x_vs_bf16_ring"] > 5 and 0 < demo["codec_pct"] < 1000
    assert demo["x_vs_bf16_ring_per_step"] == 2 * demo["x_vs_bf16_ring"]  # K = 2 steps per sync
    assert f"| builtin:tiny | code | 2 | {QUICK} |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").stat().st_size > 1000  # the loss-curve plot


def test_default_arm_follows_the_jobs_default_topk() -> None:
    """Without --demo the benchmark measures what `dtrain job submit` would pin for each N."""
    import bench_scaling as b

    a = argparse.Namespace(
        demo=None, model=["builtin:tiny"], corpora=["code"], only_seeds=None, seeds=1,
        workers=[2, 4, 8, 16],
    )  # fmt: skip
    arms = {(n, arm.name) for *_, n, arm, _ in b.plan(a, b.Setup()) if arm.kind == "demo"}
    # 300 steps at K = 2: coverage 1 takes 28 of a chunk's 4096 coefficients at every N
    assert arms == {(n, "demo K=2 k=28 1b") for n in (2, 4, 8, 16)}
    short = b.plan(a, b.Setup(steps=8000))  # 4,000 syncs (1,024 or more): the member floor
    assert {(n, arm.k) for *_, n, arm, _ in short if arm.kind == "demo"} == {
        (2, 4),
        (4, 4),
        (8, 6),
        (16, 6),
    }


def test_demo_arm_is_the_nodes_config_with_sweep_overrides() -> None:
    import bench_scaling as b

    job, recipe = JobSpec(price_per_operator_epoch=0), Recipe()
    cfg = b.demo_cfg(b.default_demo(8), recipe.inner_lr, 8)
    assert (cfg.mode, cfg.sync_interval) == ("local", job.sync_interval)
    assert (cfg.compress.k2d, cfg.compress.k1d, cfg.compress.bits) == (6, 1, job.quant_bits)
    assert (cfg.lr, cfg.beta) == (recipe.outer_lr, recipe.outer_momentum)
    assert cfg.inner_betas == (recipe.inner_beta1, recipe.inner_beta2)
    assert cfg.compress.k_token == -1 and cfg.compress.token_rows == recipe.token_rows  # auto
    assert cfg.compress.ring == 8  # the auto k's budget: this job's ring
    assert cfg.robust.enabled
    swept = b.resolve(b.parse_demo("K=4,beta=0.9,k_token=16"), 8)
    assert swept.name == "demo K=4 k=6 1b beta=0.9 kt=16"
    cfg = b.demo_cfg(swept, recipe.inner_lr, 8)
    assert (cfg.sync_interval, cfg.beta, cfg.compress.k2d, cfg.compress.k_token) == (4, 0.9, 6, 16)


def test_a_paper_arm_syncs_every_step_with_a_sign_step_and_a_bad_mode_is_refused() -> None:
    import bench_scaling as b
    import pytest

    arm = b.resolve(b.parse_demo("mode=paper,lr=0.001,beta=0.99"), 4)
    assert arm.name == "demo K=1 k=4 1b olr=0.001 beta=0.99 mode=paper"
    cfg = b.demo_cfg(arm, Recipe().inner_lr, 4)
    assert (cfg.mode, cfg.sync_interval, cfg.sign, cfg.lr, cfg.beta) == (
        "paper", 1, True, 0.001, 0.99,
    )  # fmt: skip
    local = b.demo_cfg(b.resolve(b.parse_demo("lr=0.5"), 4), Recipe().inner_lr, 4)
    assert (local.mode, local.sign) == ("local", False)
    with pytest.raises(SystemExit, match="mode must be local or paper"):
        b.parse_demo("mode=async")


def test_heldout_corpus_is_deterministic_and_split() -> None:
    from harness import heldout_corpus as h

    train, held = h.heldout_corpus(max_train=60_000, max_heldout=20_000)
    again, _ = h.heldout_corpus(max_train=60_000, max_heldout=20_000)
    other, _ = h.heldout_corpus(max_train=60_000, max_heldout=20_000, seed=1)
    assert (len(train), len(held)) == (60_000, 20_000)
    assert bool((train == again).all()) and not bool((train[:1000] == other[:1000]).all())
    text = bytes(train.tolist()).decode("ascii")
    assert text.startswith("= ") and "ledger:" in text and "total: " in text
    first = bytes(held.tolist()).decode("ascii").split("\n\n")[1]  # a held-out paragraph
    assert len(first) > 20 and first not in text


def test_the_tail_gap_averages_the_last_tenth_of_the_steps() -> None:
    """A final evaluation that lands on a low point of DDP's curve makes the final gap look
    large; the tail gap compares the means over the last 10% of the steps."""
    import bench_scaling as b

    steps = 100
    ddp = [(0, 5.0), (80, 2.10), (90, 2.10), (100, 1.90)]  # last point: a dip
    demo = [(0, 5.0), (80, 2.20), (90, 2.00), (100, 2.00)]
    single = [(0, 5.0), (50, 2.5), (100, 2.3)]

    def run(arm, n, curve):
        return dict(corpus="code", n=n, arm=arm, seed=0, curve=curve, final=curve[-1][1],
                    params=1000, syncs=0)  # fmt: skip

    runs = [run("single", 1, single), run("ddp", 4, ddp), run("demo", 4, demo)]
    rows = {r["arm"]: r for r in b.summarize(runs, b.Setup(steps=steps))}
    assert rows["demo"]["gap_vs_ddp_pct_mean"] == pytest.approx(100 * (2.00 - 1.90) / 1.90)
    assert rows["demo"]["tail_gap_vs_ddp_pct_mean"] == pytest.approx(0.0)  # 90, 100: 2.0 both
    assert rows["ddp"]["tail_gap_vs_ddp_pct_mean"] == 0.0
    assert "| +0.0% |" in b.table([dict(model="m") | rows["demo"]])


def test_every_arm_follows_the_nodes_inner_lr_schedule(tmp_path: Path) -> None:
    """--schedule cosine decays the inner lr of single, DDP and DeMo alike by the node's own
    train.inner.lr_factor; a runs file from before the schedule fields resumes as constant."""
    import bench_scaling as b
    import torch

    from dtrain_node.train import inner

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    s = b.Setup(steps=100, inner_lr=2e-3, schedule="cosine", min_lr_ratio=0.1)
    sched = Recipe(lr_schedule="cosine", min_lr_ratio=0.1)
    lrs = []
    for t in (1, 50, 100):
        b._set_lr(opt, s, t)
        lrs.append(opt.param_groups[0]["lr"])
        assert lrs[-1] == pytest.approx(2e-3 * inner.lr_factor(sched, t - 1, 100))
    assert lrs[0] == pytest.approx(2e-3) and lrs[0] > lrs[1] > lrs[2] > 2e-4
    b._set_lr(opt, b.Setup(inner_lr=2e-3), 100)
    assert opt.param_groups[0]["lr"] == 2e-3  # the default stays constant

    old = tmp_path / "old.json"
    setup = {k: v for k, v in b.asdict(b.Setup()).items() if k not in ("schedule", "min_lr_ratio")}
    old.write_text(json.dumps(dict(meta=dict(setup=setup), runs=[{"arm": "single"}])))
    assert b._previous(old, b.Setup()) == [{"arm": "single"}]
    with pytest.raises(SystemExit, match="another setup"):
        b._previous(old, s)


def test_a_run_at_an_earlier_default_is_named_by_what_it_differs_in(tmp_path: Path) -> None:
    """A runs file from when the error-feedback decay defaulted to 0.95: its default-arm run is
    renamed 'beta=0.95' on resume, so today's default arm is run rather than skipped."""
    import bench_scaling as b

    today = b.resolve(b.Arm("demo"), 4)
    before = b.replace(today, beta=0.95)
    assert today.name == DEMO and Recipe().outer_momentum != 0.95
    runs = [
        dict(arm=DEMO, spec=b.asdict(before), seed=0),  # named under the old default
        dict(arm="single", spec=b.asdict(b.Arm("single")), seed=0),
        dict(arm="ddp", seed=0),  # no spec: as written
    ]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(dict(meta=dict(setup=b.asdict(b.Setup())), runs=runs)))
    names = [r["arm"] for r in b._previous(path, b.Setup())]
    assert names == [f"{DEMO} beta=0.95", "single", "ddp"]


def test_a_run_stored_before_a_setting_existed_is_named_as_it_ran() -> None:
    """A run stored before the mean row's k existed ran without one: it is named by that, and
    not taken for a run of today's default (a mean row of k 64)."""
    import bench_scaling as b

    today = b.asdict(b.resolve(b.Arm("demo"), 4))
    assert today["k_mean"] == Recipe().head_mean_topk == 64
    old = {k: v for k, v in today.items() if k != "k_mean"}
    assert [r["arm"] for r in b.renamed([dict(arm=DEMO, spec=old)])] == [f"{DEMO} km=0"]

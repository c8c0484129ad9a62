"""GPU benchmark (issue 52): on one device, the job default against one worker and DDP each at
its own best lr, and DeMo at 10,000x less upload per step than a bf16 ring, on a run long
enough for that budget to reach coverage.

The same model path, corpus, shards and DeMo as scripts/bench_scaling.py (the product's model
as a node starts it, the node's shard assignment and batch walk, `DeMo.of_model` with the job's
settings), with every member's model and inner step on the device. Arms:

- one worker, lr 2.5e-4, and DDP (the exact mean of N members' gradients), lr 5e-4: the best
  lr of each in the sweep on builtin:small, prose, N = 4 (docs/bench/history-scaling.md, "The
  inner lr"); `--lr-single`, `--lr-ddp` to run at another;
- DeMo at the job default for the run (`dtrain.models.default_topk(N, syncs)`, K = 2, 1 bit);
- DeMo at 10,000x less upload per step than a bf16 ring: the member floor's k with the
  smallest sync interval K that reaches it (the real packet, in its signed envelopes);
- the SparseLoCo operating point as this codec expresses it: 2% of each chunk (k = 82),
  2-bit levels, K = 32 (fewer in a run shorter than that; the DCT stays: the codec has no
  other basis).

The pass lines below are written before any run; each is checked on what the run measured and
printed PASS or FAIL with its numbers. A run plans its steps to fit `--budget-s` (measured on
the arms' first steps, at most `--steps`), so that the whole benchmark stays within 10 minutes
on one H100; the steps it ran are in the report.

    python scripts/bench_gpu.py                        # one GPU, <= 10 min: docs/bench/gpu.json
    python scripts/bench_gpu.py --smoke --out /tmp/g   # CPU, seconds: CI runs it

Writes --out (JSON: device, setup, pass lines and their outcome, per-arm records) and the same
path with .md (the table).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling as bs

from dtrain.models import default_topk
from dtrain_node.optim.optimizer import DeMo, model_spec

PASS_LINES = {
    "default_beats_one_worker": "DeMo at the job default ends below one worker at its best lr",
    "default_near_ddp": "DeMo at the job default ends within 5% of DDP at its best lr",
    "x10000_near_ddp": "DeMo at 10,000x less upload per step ends within 5% of DDP at its best lr",
}
TARGET_X = 10_000  # less upload per step than a bf16 ring
SPARSELOCO = bs.Arm("demo", K=32, k=82, bits=2)


@dataclass(frozen=True)
class Setup:
    model: str = "builtin:small"
    corpus: str = "prose"
    members: int = 4
    ctx: int = 0  # tokens per window; 0: as a node (the recipe's seq_len within the model's)
    steps: int = 20_000  # at most; fewer when the budget says so
    bsz: int = 32  # 4,096 tokens per member per step at the recipe's 128-token windows
    eval_every: int = 500
    eval_windows: int = 256
    budget_s: float = 540.0
    lr_single: float = 2.5e-4
    lr_ddp: float = 5e-4
    lr_demo: float = bs.RECIPE.inner_lr
    seed: int = 0
    probe_steps: int = 20  # steps per arm timed before planning


SMOKE = Setup(
    model="builtin:tiny",
    corpus="heldout",
    members=2,
    ctx=32,
    steps=30,  # two syncs of the 10,000x arm (K = 15 on builtin:tiny)
    bsz=4,
    eval_every=15,
    eval_windows=8,
    budget_s=3600.0,  # its steps are never cut: the plan is still made and timed
    probe_steps=1,
)


@dataclass
class Run:
    name: str
    kind: str
    lr: float
    arm: bs.Arm | None = None  # DeMo's settings
    final: float = math.nan
    curve: list = field(default_factory=list)
    s_per_step: float = 0.0
    x_per_step: float | None = None  # less upload per step than a bf16 ring
    peak_mem: int = 0


def arms(s: Setup, subj: bs.Subject, steps: int) -> list[Run]:
    """The five arms for a run of `steps` steps (the DeMo ones resolved as a node would)."""
    n = s.members
    model = subj.fresh(s.seed)
    default = bs.resolve(bs.Arm("demo"), n, steps)
    floor = bs.Arm("demo", K=2, k=default_topk(n, 0))
    x2 = per_step_ratio(floor, model, subj, n, s.lr_demo)
    # x per step grows linearly in K (the packet is the same, sent every K steps)
    cheap = bs.resolve(replace(floor, K=math.ceil(2 * TARGET_X / x2)), n, steps)
    sparse = bs.resolve(replace(SPARSELOCO, K=min(SPARSELOCO.K, steps)), n, steps)
    return [
        Run("one worker", "single", s.lr_single),
        Run(f"DDP, {n} members", "ddp", s.lr_ddp),
        Run("DeMo, the job default", "demo", s.lr_demo, default),
        Run(f"DeMo, {TARGET_X:,}x per step", "demo", s.lr_demo, cheap),
        Run("DeMo, the SparseLoCo point", "demo", s.lr_demo, sparse),
    ]


def per_step_ratio(arm: bs.Arm, model: torch.nn.Module, subj: bs.Subject, n: int, lr: float):
    """How many times less a member uploads per step than a dense bf16 ring all-reduce."""
    cfg = bs.demo_cfg(bs.resolve(arm, n), lr, n)
    packet = model_spec(model, cfg.compress, subj.reach).packet_bytes
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    per_sync = bs.upload_bytes(packet)["total"]
    return bs.ring_allreduce_bytes(params, 2, n) / (per_sync / cfg.sync_interval)


def train(r: Run, s: Setup, c: bs.Ctx, dev: torch.device, steps: int) -> None:
    """Trains arm `r` for `steps` steps on `dev`; fills its curve, final loss and timings."""
    nw = 1 if r.kind == "single" else s.members
    streams = bs.streams(c.data, nw, s.bsz, s.seed)
    base = c.subj.fresh(s.seed).to(dev)
    models = [base] if r.kind != "demo" else [copy.deepcopy(base) for _ in range(nw)]
    step = _dense_step(r, models[0], c) if r.kind != "demo" else _demo_step(r, models, c)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    r.curve = [(0, bs.evaluate(c.subj, models[0], c.ev))]
    t0, spent = time.perf_counter(), 0.0
    for t in range(1, steps + 1):
        step(streams, dev)
        if t % s.eval_every == 0 or t == steps:
            _sync_device(dev)
            spent += time.perf_counter() - t0
            r.curve.append((t, bs.evaluate(c.subj, models[0], c.ev)))
            t0 = time.perf_counter()
    r.final, r.s_per_step = r.curve[-1][1], spent / steps
    r.peak_mem = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0


def _dense_step(r: Run, model: torch.nn.Module, c: bs.Ctx):
    rc = bs.RECIPE
    opt = torch.optim.AdamW(
        model.parameters(), lr=r.lr, betas=(rc.inner_beta1, rc.inner_beta2),
        weight_decay=rc.inner_weight_decay,
    )  # fmt: skip

    def step(streams, dev: torch.device) -> None:
        opt.zero_grad(set_to_none=True)
        for it in streams:  # the exact mean of the members' gradients
            x, y = (v.to(dev) for v in c.data.windows(next(it)))
            (c.subj.loss(model, x, y) / len(streams)).backward()
        opt.step()

    return step


def _demo_step(r: Run, models: list, c: bs.Ctx):
    assert r.arm is not None
    cfg = bs.demo_cfg(r.arm, r.lr, len(models))
    ms = bs.members(len(models))
    opts = [DeMo.of_model(m, cfg, a, c.subj.reach) for m, a in zip(models, ms, strict=True)]
    rec = dict(codec_s=0.0, screen_s=0.0, syncs=0, packet_bytes=0, excluded=0)

    def step(streams, dev: torch.device) -> None:
        for m, o, it in zip(models, opts, streams, strict=True):
            x, y = (v.to(dev) for v in c.data.windows(next(it)))
            c.subj.loss(m, x, y).backward()
            o.inner_step()
        if opts[0].due:
            bs._sync(opts, rec)

    return step


def _sync_device(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def plan_steps(s: Setup, c: bs.Ctx, dev: torch.device, probe: list[Run]) -> int:
    """The most steps (at most s.steps; a multiple of the largest K when it fits one) whose
    arms fit the budget, from each arm's measured seconds per step over its first
    `probe_steps` (the first steps' warm-up included: the plan errs short)."""
    per_step = 0.0
    for r in probe:
        timed = copy.copy(r)
        train(timed, replace(s, eval_every=s.probe_steps), c, dev, s.probe_steps)
        per_step += timed.s_per_step
    evals = len(probe) * s.eval_windows * 1e-3  # a rough allowance per evaluation
    steps = max(1, min(s.steps, int(s.budget_s / (per_step + evals / s.eval_every))))
    K = max(r.arm.K for r in probe if r.arm is not None)
    return steps - steps % K if steps >= K else steps


def check(runs: dict[str, Run]) -> dict[str, dict]:
    """Each pass line against the measured losses."""
    one, ddp = runs["one worker"].final, next(r.final for r in runs.values() if r.kind == "ddp")
    default = runs["DeMo, the job default"].final
    cheap = next(r for r in runs.values() if r.name.endswith("x per step"))
    got = {
        "default_beats_one_worker": (default < one, f"{default:.4f} vs {one:.4f}"),
        "default_near_ddp": (default <= 1.05 * ddp, f"{100 * (default / ddp - 1):+.1f}%"),
        "x10000_near_ddp": (
            cheap.final <= 1.05 * ddp and (cheap.x_per_step or 0) >= TARGET_X,
            f"{100 * (cheap.final / ddp - 1):+.1f}% at {cheap.x_per_step:,.0f}x",
        ),
    }
    return {k: dict(line=PASS_LINES[k], passed=ok, measured=m) for k, (ok, m) in got.items()}


def table(runs: list[Run], ddp: float, one: float) -> str:
    out = [
        "| arm | K | k | bits | lr | held-out loss | vs DDP | vs one worker "
        "| less upload per step than a bf16 ring | ms per step | peak memory |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        a = r.arm
        k = (a.K, a.k, a.bits) if a else ("", "", "")
        x = f"{r.x_per_step:,.0f}x" if r.x_per_step else "1x" if r.kind == "ddp" else ""
        mem = f"{r.peak_mem / 2**20:,.0f} MiB" if r.peak_mem else "-"
        out.append(
            f"| {r.name} | {k[0]} | {k[1]} | {k[2]} | {r.lr:g} | {r.final:.4f} "
            f"| {100 * (r.final / ddp - 1):+.1f}% | {100 * (r.final / one - 1):+.1f}% | {x} "
            f"| {1000 * r.s_per_step:.1f} | {mem} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="builtin:tiny on the CPU, seconds")
    ap.add_argument("--device", default=None, help="cuda or cpu [default: cuda if present]")
    ap.add_argument("--steps", type=int, default=None, help="at most this many steps")
    ap.add_argument("--budget-s", type=float, default=None, help="seconds for all the arms")
    ap.add_argument("--lr-single", type=float, default=None)
    ap.add_argument("--lr-ddp", type=float, default=None)
    ap.add_argument("--out", type=Path, default=Path("docs/bench/gpu.json"))
    a = ap.parse_args(argv)
    s = SMOKE if a.smoke else Setup()
    over = dict(steps=a.steps, budget_s=a.budget_s, lr_single=a.lr_single, lr_ddp=a.lr_ddp)
    s = replace(s, **{k: v for k, v in over.items() if v is not None})
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() and not a.smoke else "cpu"))
    print("pass lines, written before the run:")
    for line in PASS_LINES.values():
        print(f"  - {line}")
    t0 = time.time()
    torch.manual_seed(s.seed)
    subj = bs.Subject(s.model, s.ctx)
    setup = replace(bs.Setup(), ctx=s.ctx, bsz=s.bsz, eval_windows=s.eval_windows)
    data, ev = bs.load(s.corpus, setup, subj)
    c = bs.Ctx(setup, subj, data, (ev[0].to(dev), ev[1].to(dev)))  # held out on the device
    steps = plan_steps(s, c, dev, arms(s, subj, s.steps))
    runs = arms(s, subj, steps)
    model = subj.fresh(s.seed)
    for r in runs:
        if r.arm is not None:
            r.x_per_step = per_step_ratio(r.arm, model, subj, s.members, r.lr)
        train(r, s, c, dev, steps)
        print(f"  {r.name}: loss {r.final:.4f} ({1000 * r.s_per_step:.1f} ms/step)", flush=True)
    by = {r.name: r for r in runs}
    outcome = check(by)
    ddp = next(r.final for r in runs if r.kind == "ddp")
    md = table(runs, ddp, by["one worker"].final)
    for v in outcome.values():
        print(f"{'PASS' if v['passed'] else 'FAIL'}  {v['line']}: {v['measured']}")
    device = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    record = dict(
        device=device, torch=torch.__version__, setup=asdict(s), steps=steps,
        params=sum(p.numel() for p in model.parameters()), wall_s=round(time.time() - t0),
        passes=outcome, runs=[{**asdict(r), "arm": asdict(r.arm) if r.arm else None} for r in runs],
    )  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(record, indent=1) + "\n")
    head = f"{s.model}, {s.corpus}, {s.members} members, {steps} steps, {device}\n\n"
    a.out.with_suffix(".md").write_text(head + md + "\n")
    print(md)
    print(f"wrote {a.out} and {a.out.with_suffix('.md')} ({record['wall_s']} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

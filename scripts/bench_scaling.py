"""Scaling benchmark (issues 14, 29): do more operators train faster with DeMo, on the models
jobs train, at the settings jobs get?

The subject is the product's model path: a model URI (`builtin:tiny`, `builtin:small`, a model
config JSON, or a folder `dtrain model init gpt2|llama DIR` writes) built by
`train.start.start_model` as a node builds it, with the window length a node uses (the recipe's
`seq_len` within the model's context, train.job.context), the node's CPT loss and, for a
folder, its own tokenizer. `harness` (the test harness's GPT, tests/harness/bench_model.py) is
an extra model for comparison with earlier numbers, never the default.

Arms: one worker vs N workers with dense data-parallel (DDP, exact gradient mean) vs DeMo built
as a node builds it (`DeMo.of_model` with optim.settings.demo_config for a job of N members:
local mode, the job's default sync interval K and bits, k = dtrain.models.default_topk(N, syncs),
the default recipe's inner AdamW, outer lr, error-feedback decay and token-tensor compression, the
robust screen on), at N = 2, 4, 8, 16 workers simulated sequentially in one process. Single and
DDP use the same inner AdamW (lr, betas, weight decay of the recipe). `--demo` arms override
some of these job defaults. Every worker has the same per-worker batch (the recipe's); each
one's data is its shard from the node's own shard assignment (train/shard.py) and its own batch
stream. Corpora: `code` (stdlib sources), `prose` (English text on this machine) and `heldout`
(a generated synthetic language, tests/harness/heldout_corpus.py, that no default is chosen on).

Per arm and seed: speedup = steps the single worker needs for its own final held-out loss /
steps the arm needs for that loss (linear interpolation between evaluations; None if never
reached), the final-loss gap to DDP, the gap of the mean loss over the evaluations in the last
TAIL of the steps (one evaluation moves with the step it lands on: the tail gap is steadier),
upload bytes per sync (the real codec packet, cut into gossip chunks of envelope.MAX_CHUNK,
each wrapped in the real signed envelope, plus the commitment envelope sent before it) and per
training step (per sync / K), each against a dense bf16 ring all-reduce (which runs every
step), and codec time (compress + encode, decode of all N packets + exact aggregation) as % of
one worker's compute over the K steps of a sync.

    python scripts/bench_scaling.py --quick                 # CI smoke (< 60 s): builtin:tiny, N=2
    python scripts/bench_scaling.py                         # full matrix (many hours on 2 cores)
    python scripts/bench_scaling.py --model builtin:tiny --corpora prose --workers 4 \\
        --seeds 2 --demo K=4 --demo k=16,bits=2             # a sweep over the job defaults
    python scripts/bench_scaling.py --resume --out /tmp/s1.json --only-seeds 1  # one seed of
        # the matrix per process (--resume picks an interrupted one up again), then
    python scripts/bench_scaling.py --merge /tmp/s0.json /tmp/s1.json --out /tmp/all.json
    python scripts/bench_scaling.py --report --out docs/bench/scaling_models.json  # tables, plot

Writes --out (JSON: setup, per-run records, summary), the same path with .md (tables) and with
.png (held-out loss curves, mean over seeds, per model, corpus and N).
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from types import SimpleNamespace

import torch

from dtrain.models import JobSpec, default_topk
from dtrain.recipe import ERROR_FEEDBACK, LR_SCHEDULES, Recipe
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.optim.settings import demo_config
from dtrain_node.p2p import envelope
from dtrain_node.train import inner, shard
from dtrain_node.train.corpus import TextData
from dtrain_node.train.job import context
from dtrain_node.train.losses import cpt_loss
from dtrain_node.train.start import Builtin, StartModel, start_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import bench_corpus, heldout_corpus, prose_corpus
from harness.baselines import ring_allreduce_bytes
from harness.bench_model import GPT, GPTConfig

CORPORA = {
    "code": bench_corpus.stdlib_corpus,
    "prose": prose_corpus.prose_corpus,
    "heldout": heldout_corpus.heldout_corpus,  # reported only: no default is chosen on it
}
RECIPE = Recipe()  # the reference recipe: what a job without its own recipe trains with
TAIL = 0.1  # tail gap: the evaluations in the last 10% of the steps
JOB = JobSpec(price_per_operator_epoch=0)  # the job defaults (`dtrain job submit`)
HARNESS = "harness"
HARNESS_GPT = dict(d=128, n_layer=4, n_head=2)  # the size earlier Scaling tables measured


# ---------------------------------------------------------------------------- model


class Subject:
    """A model the benchmark trains: a model URI as a node starts it, or the harness GPT."""

    def __init__(self, uri: str, ctx: int = 0) -> None:
        self.uri = uri
        self.start: StartModel | None = None if uri == HARNESS else start_model(uri)
        if self.start is None:
            self.ctx = ctx or 128
        else:
            job = SimpleNamespace(recipe=RECIPE, model_uri=uri)
            self.ctx = ctx or context(job, self.start)  # type: ignore[arg-type]

    @property
    def byte_level(self) -> bool:
        return self.start is None or self.start.byte_level

    @property
    def reach(self) -> int:
        """The rows of its token tensors its tokenizer reaches (0: the harness GPT, all)."""
        return 0 if self.start is None else len(self.start.tokenizer)

    def fresh(self, seed: int) -> torch.nn.Module:
        """The start model of seed `seed`: a built-in preset initialised from `?seed=`; a
        folder's own weights whatever the seed (a job on it starts from them)."""
        torch.manual_seed(seed)
        if self.start is None:
            return GPT(GPTConfig(ctx=self.ctx, **HARNESS_GPT))
        if isinstance(self.start, Builtin) and "?" not in self.uri:
            return start_model(f"{self.uri}?seed={seed}").fresh().train()
        return self.start.fresh().train()

    def loss(self, m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.start is None:
            return m(x, y)
        return cpt_loss(m(input_ids=x).logits, y)

    def tokens(self, data: torch.Tensor) -> torch.Tensor:
        """A corpus's bytes as this model's tokens (train.backend: bytes for the built-in
        models, the model's own tokenizer and EOS for a folder)."""
        if self.byte_level:
            return data
        assert self.start is not None
        tok = self.start.tokenizer
        text = data.to(torch.uint8).numpy().tobytes().decode("utf-8", errors="replace")
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        return torch.tensor(ids, dtype=torch.long)


# ---------------------------------------------------------------------------- arms


@dataclass(frozen=True)
class Arm:
    """kind: single | ddp | demo. A DeMo arm's fields left None are the job defaults for its
    member count (`resolve`): K inner steps per sync, k coefficients per chunk x chunk block,
    1- or 2-bit levels, outer lr, error-feedback decay beta, the token tensors' k (0: auto)
    and rows per scale block, and the output head's mean row's k (0: none). k1d, chunk, mean
    and mode (local, or paper: the DeMo paper's scheme, every step a sync with a sign step of
    lr) are sweep-only keys."""

    kind: str
    K: int | None = None
    k: int | None = None
    bits: int | None = None
    lr: float | None = None
    beta: float | None = None
    k_token: int | None = None
    token_rows: int | None = None
    k_mean: int | None = None
    k1d: int = 1
    chunk: int = 64
    mean: str = "senders"  # or "coef": each coefficient averaged over the senders that sent it
    mode: str = "local"  # or "paper": the DeMo paper's scheme (every step a sync, sign step)
    feedback: str = "own"  # or "shared": recipe error_feedback (e loses the shared state's move)

    @property
    def name(self) -> str:
        if self.kind != "demo":
            return self.kind
        s = f"demo K={self.K} k={self.k} {self.bits}b"
        extra = dict(
            c=(self.chunk, 64),
            k1d=(self.k1d, 1),
            olr=(self.lr, RECIPE.outer_lr),
            beta=(self.beta, RECIPE.outer_momentum),
            kt=(self.k_token, RECIPE.token_topk),
            rows=(self.token_rows, RECIPE.token_rows),
            km=(self.k_mean, RECIPE.head_mean_topk if self.mode == "local" else 0),
            mean=(self.mean, "senders"),
            mode=(self.mode, "local"),
            fb=(self.feedback, "own"),
        )
        for key, (v, default) in extra.items():
            if v != default:
                s += f" {key}={v:g}" if isinstance(v, float) else f" {key}={v}"
        return s


def resolve(arm: Arm, n: int, steps: int = 0) -> Arm:
    """The arm with its unset fields at the job defaults of an n-member job of `steps` steps
    an epoch (0: the top-k's member floor alone)."""
    K = arm.K or JOB.sync_interval
    defaults = dict(
        K=K,
        k=default_topk(n, steps // K),
        bits=JOB.quant_bits,
        lr=RECIPE.outer_lr,
        beta=RECIPE.outer_momentum,
        k_token=RECIPE.token_topk,
        token_rows=RECIPE.token_rows,
        k_mean=RECIPE.head_mean_topk if arm.mode == "local" else 0,  # as compress_config
    )
    return replace(arm, **{k: v for k, v in defaults.items() if getattr(arm, k) is None})


def default_demo(n: int) -> Arm:
    return resolve(Arm("demo"), n)


def demo_cfg(arm: Arm, inner_lr: float, n: int) -> DeMoConfig:
    """The DeMoConfig a node builds for an n-seat job with these settings
    (optim.settings.demo_config over the job spec and recipe), with the sweep-only keys on top."""
    spec = replace(
        JOB, sync_interval=arm.K, topk_per_chunk=arm.k, quant_bits=arm.bits, max_operators=n
    )
    recipe = replace(
        RECIPE,
        inner_lr=inner_lr,
        outer_lr=arm.lr,
        outer_momentum=arm.beta,
        token_topk=arm.k_token,
        token_rows=arm.token_rows,
        head_mean_topk=arm.k_mean,
        error_feedback=arm.feedback,
    )
    cfg = demo_config(None, SimpleNamespace(spec=spec), recipe)  # type: ignore[arg-type]
    compress = replace(cfg.compress, chunk=arm.chunk, k1d=arm.k1d)
    cfg = replace(cfg, compress=compress, per_coefficient_mean=arm.mean == "coef")
    # paper: no inner optimizer; e folds each step's gradient and the outer step is
    # lr * sign(U), so lr is a sign-SGD step (e.g. 1e-3), not the local mode's 1.0
    return replace(cfg, mode="paper", sync_interval=1, sign=True) if arm.mode == "paper" else cfg


SWEEP_KEYS = {f.name: f for f in fields(Arm) if f.name != "kind"}
SWEEP_TYPES = {
    "K": int,
    "k": int,
    "bits": int,
    "lr": float,
    "beta": float,
    "k_token": int,
    "token_rows": int,
    "k_mean": int,
    "k1d": int,
    "chunk": int,
    "mean": str,
    "mode": str,
    "feedback": str,
}


def parse_demo(spec: str) -> Arm:
    """'K=4,k=16,bits=2,beta=0.9' -> a DeMo arm; unset keys stay the job defaults."""
    kw: dict = {}
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        key = key.strip()
        if key not in SWEEP_TYPES:
            raise SystemExit(f"unknown DeMo key {key!r} in {spec!r}; known: {sorted(SWEEP_TYPES)}")
        kw[key] = SWEEP_TYPES[key](val)
    if kw.get("feedback", "own") not in ERROR_FEEDBACK:
        raise SystemExit(f"feedback must be own or shared, got {kw['feedback']!r} in {spec!r}")
    if kw.get("mode", "local") not in ("local", "paper"):
        raise SystemExit(f"mode must be local or paper, got {kw['mode']!r} in {spec!r}")
    if kw.get("mode") == "paper":
        kw.setdefault("K", 1)  # every step a sync
    return Arm("demo", **kw)


@dataclass(frozen=True)
class Setup:
    ctx: int = 0  # tokens per window; 0: as a node (the recipe's seq_len within the model's)
    bsz: int = RECIPE.batch_size
    steps: int = 300
    eval_every: int = 20
    eval_windows: int = 128
    inner_lr: float = RECIPE.inner_lr
    warmup: int = 0  # linear inner-lr warm-up steps (all arms, single and DDP included)
    max_train: int = 4_000_000
    schedule: str = "constant"  # the recipe's lr_schedule over the run (all arms)
    min_lr_ratio: float = 0.0  # the recipe's, for a linear or cosine schedule


QUICK = Setup(ctx=64, bsz=4, steps=24, eval_every=8, eval_windows=32, max_train=300_000)


# ---------------------------------------------------------------------------- data


def members(n: int) -> list[str]:
    return [f"0x{i + 1:040x}" for i in range(n)]


def streams(data: TextData, n: int, bsz: int, seed: int) -> list[Iterator[torch.Tensor]]:
    """Each worker's endless window-index batches, dealt the way the node deals them."""
    ms = members(n)
    return [_batches(shard.assign(data.n_windows, 1000 + seed, 0, ms, me), bsz, seed) for me in ms]


def _batches(idx: torch.Tensor, bsz: int, seed: int) -> Iterator[torch.Tensor]:
    for b, _ in shard.batch_indices(idx, bsz, seed):  # the node's own walk over its shard
        yield b


@torch.no_grad()
def evaluate(subj: Subject, m: torch.nn.Module, ev: tuple[torch.Tensor, torch.Tensor]) -> float:
    m.eval()
    tot = 0.0
    for i in range(0, len(ev[0]), 32):
        x, y = ev[0][i : i + 32], ev[1][i : i + 32]
        tot += float(subj.loss(m, x, y)) * len(x)
    m.train()
    return tot / len(ev[0])


@functools.cache
def _schedule(s: Setup) -> Recipe:
    """The recipe whose inner lr schedule the run follows (built once per setup)."""
    return replace(
        RECIPE, warmup_steps=s.warmup, lr_schedule=s.schedule, min_lr_ratio=s.min_lr_ratio
    )


def _set_lr(opt: torch.optim.Optimizer, s: Setup, t: int) -> None:
    """Step t's (1-based) inner lr, by the node's own schedule (train.inner.lr_factor)."""
    lr = s.inner_lr * inner.lr_factor(_schedule(s), t - 1, s.steps)
    for g in opt.param_groups:
        g["lr"] = lr


# ---------------------------------------------------------------------------- training


@dataclass
class Ctx:
    """One run's fixed inputs."""

    s: Setup
    subj: Subject
    data: TextData
    ev: tuple[torch.Tensor, torch.Tensor]


def run(c: Ctx, arm: Arm, n: int, seed: int) -> dict:
    """Train one arm; returns its held-out curve, timings and packet bytes."""
    base = c.subj.fresh(seed)
    nw = 1 if arm.kind == "single" else n
    st = streams(c.data, nw, c.s.bsz, seed)
    curve = [(0, evaluate(c.subj, base, c.ev))]
    rec = dict(compute_s=0.0, codec_s=0.0, screen_s=0.0, syncs=0, packet_bytes=0, excluded=0)
    if arm.kind in ("single", "ddp"):
        _dense(c, base, st, curve, rec)
    else:
        _demo(c, arm, base, st, curve, rec)
    params = sum(p.numel() for p in base.parameters() if p.requires_grad)
    return dict(params=params, curve=curve, final=curve[-1][1], workers=nw, **rec)


def _dense(c: Ctx, model, st, curve, rec) -> None:
    s, r = c.s, RECIPE
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=s.inner_lr,
        betas=(r.inner_beta1, r.inner_beta2),
        weight_decay=r.inner_weight_decay,
    )
    for t in range(1, s.steps + 1):
        _set_lr(opt, s, t)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for it in st:  # exact mean of the workers' gradients, in worker order
            (c.subj.loss(model, *c.data.windows(next(it))) / len(st)).backward()
        opt.step()
        rec["compute_s"] += (time.perf_counter() - t0) / len(st)
        if t % s.eval_every == 0 or t == s.steps:
            curve.append((t, evaluate(c.subj, model, c.ev)))


def _demo(c: Ctx, arm: Arm, base, st, curve, rec) -> None:
    s, n, ms = c.s, len(st), members(len(st))
    models = [copy.deepcopy(base) for _ in range(n)]
    cfg = demo_cfg(arm, s.inner_lr, n)
    opts = [DeMo.of_model(m, cfg, a, c.subj.reach) for m, a in zip(models, ms, strict=True)]
    for t in range(1, s.steps + 1):
        t0 = time.perf_counter()
        for m, o, it in zip(models, opts, st, strict=True):
            if o.inner is not None:
                _set_lr(o.inner, s, t)
            c.subj.loss(m, *c.data.windows(next(it))).backward()
            if o.inner is not None:
                o.inner_step()
        rec["compute_s"] += (time.perf_counter() - t0) / n
        if opts[0].due:
            _sync(opts, rec)
        if cfg.mode == "paper":  # the step's gradients went into e
            for m in models:
                m.zero_grad(set_to_none=True)
        if t % s.eval_every == 0 or t == s.steps:
            curve.append((t, evaluate(c.subj, models[0], c.ev)))


def _sync(opts: list[DeMo], rec: dict) -> None:
    packets = [(o.sender, o.prepare()) for o in opts]
    # every node decodes all packets and aggregates; the result is bitwise the same
    # everywhere, so it is computed once and applied to every simulated node
    res = opts[0].apply(packets)
    if res.rejected or res.aggregate is None:
        raise RuntimeError(f"honest packets rejected: {res.rejected} {res.excluded}")
    rec["excluded"] += len(res.excluded)  # left out by the robust screen, as a node would
    for o in opts[1:]:
        o.apply_aggregate(res.aggregate)
    rec["codec_s"] += sum(o._compress_s for o in opts) / len(opts) + res.aggregate_s
    rec["screen_s"] += res.screen_s
    rec["packet_bytes"] = max(len(p) for _, p in packets)
    rec["syncs"] += 1


# ---------------------------------------------------------------------------- metrics


def upload_bytes(packet: int) -> dict:
    """What one operator publishes per sync: the packet in gossip chunks, each chunk in a signed
    envelope (envelope.OVERHEAD bytes around it), plus the commitment envelope before it."""
    chunks = max(1, math.ceil(packet / envelope.MAX_CHUNK))
    return dict(
        packet=packet,
        chunks=chunks,
        envelopes=chunks * envelope.OVERHEAD,
        commitment=envelope.OVERHEAD,
        total=packet + (chunks + 1) * envelope.OVERHEAD,
    )


def steps_to(curve: list, target: float) -> float | None:
    """First (interpolated) step at which the curve reaches target; None if it never does."""
    for (s0, l0), (s1, l1) in itertools.pairwise(curve):
        if l1 <= target:
            return s1 if l0 <= target or l0 == l1 else s0 + (s1 - s0) * (l0 - target) / (l0 - l1)
    return None


def tail_loss(curve: list, steps: int) -> float:
    """Mean held-out loss over the evaluations in the last TAIL of `steps`."""
    return statistics.mean(loss for t, loss in curve if t >= (1 - TAIL) * steps)


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def _key(r: dict) -> tuple[str, str]:
    return r.get("model", HARNESS), r["corpus"]


def summarize(runs: list[dict], setup: Setup) -> list[dict]:
    """One row per (model, corpus, N, arm): means over seeds of speedup, gap to DDP, bytes,
    codec %."""
    out = []
    keys = sorted({(*_key(r), r["n"]) for r in runs if r["arm"] != "single"})
    for model, corpus, n in keys:
        mine = [r for r in runs if _key(r) == (model, corpus)]
        single = {r["seed"]: r for r in mine if r["arm"] == "single"}
        ddp = {r["seed"]: r for r in mine if (r["n"], r["arm"]) == (n, "ddp")}
        arms = dict.fromkeys(r["arm"] for r in mine if r["n"] == n)
        for arm in arms:
            rs = [r for r in mine if (r["n"], r["arm"]) == (n, arm)]
            out.append(dict(model=model) | _row(corpus, n, arm, rs, single, ddp, setup))
    return out


def _row(corpus, n, arm, rs, single, ddp, setup) -> dict:
    sp, gaps, tails, rel = [], [], [], []
    for r in rs:
        sr = single.get(r["seed"])
        target = sr["final"] if sr else None
        need = steps_to(sr["curve"], target) if sr else None
        got = steps_to(r["curve"], target) if sr else None
        if need and not got:  # never reached: the fraction of the single run it is worth
            worth = steps_to(sr["curve"], r["final"])
            got = setup.steps * need / worth if worth else None
        sp.append(need / got if need and got else None)
        d = ddp.get(r["seed"])
        gaps.append(100 * (r["final"] - d["final"]) / d["final"] if d else None)
        dt = tail_loss(d["curve"], setup.steps) if d else None
        tails.append(100 * (tail_loss(r["curve"], setup.steps) - dt) / dt if d else None)
        if d and sr and sp[-1] is not None:
            dn = steps_to(d["curve"], target)
            rel.append(sp[-1] / (need / dn) if dn else None)
        else:
            rel.append(None)
    P = rs[0]["params"]
    row = dict(
        corpus=corpus,
        workers=n,
        arm=arm,
        seeds=[r["seed"] for r in rs],
        final_loss=[r["final"] for r in rs],
        speedup=sp,
        speedup_mean=_mean(sp),
        speedup_vs_ddp=rel,
        speedup_vs_ddp_mean=_mean(rel),
        reached=sum(
            steps_to(r["curve"], single[r["seed"]]["final"]) is not None
            for r in rs
            if r["seed"] in single
        ),
        gap_vs_ddp_pct=gaps,
        gap_vs_ddp_pct_mean=_mean(gaps),
        gap_vs_ddp_pct_max=max((g for g in gaps if g is not None), default=None),
        tail_gap_vs_ddp_pct=tails,
        tail_gap_vs_ddp_pct_mean=_mean(tails),
        bf16_ring_bytes=ring_allreduce_bytes(P, 2, n),
        bf16_model_bytes=2 * P,
    )
    if rs[0]["syncs"]:
        row |= _upload(row, rs)
    return row


def _upload(row: dict, rs: list[dict]) -> dict:
    """Upload per sync and per training step (the ring runs every step, DeMo every K)."""
    up = upload_bytes(rs[0]["packet_bytes"])
    K = rs[0]["spec"]["K"]
    x_sync = row["bf16_ring_bytes"] / up["total"]
    return dict(
        upload=up,
        upload_per_step=up["total"] / K,
        x_vs_bf16_ring=x_sync,
        x_vs_bf16_ring_per_step=x_sync * K,
        x_vs_bf16_model=row["bf16_model_bytes"] / up["total"],
        codec_pct=100 * _mean([r["codec_s"] / r["compute_s"] for r in rs]),
        screen_pct=100 * _mean([r["screen_s"] / r["compute_s"] for r in rs]),
        excluded=sum(r.get("excluded", 0) for r in rs),
    )


def _f(x, fmt, unit=""):
    return "never" if x is None else format(x, fmt) + unit


def table(rows: list[dict]) -> str:
    head = (
        "| model | corpus | N | arm | speedup vs single | % of DDP speedup | reached "
        "| gap vs DDP (mean / worst) | gap, last 10% of steps | upload B/sync "
        "| x vs bf16 ring per sync / per step | codec % |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        up = r.get("upload")
        ratio = "1"
        if up:
            ratio = f"{r['x_vs_bf16_ring']:,.0f} / {r['x_vs_bf16_ring_per_step']:,.0f}"
        lines.append(
            f"| {r['model']} | {r['corpus']} | {r['workers']} | {r['arm']} "
            f"| {_f(r['speedup_mean'], '.2f', 'x')} "
            f"({', '.join(_f(x, '.2f') for x in r['speedup'])}) "
            f"| {_f(r['speedup_vs_ddp_mean'] and 100 * r['speedup_vs_ddp_mean'], '.0f', '%')} "
            f"| {r['reached']}/{len(r['seeds'])} "
            f"| {_f(r['gap_vs_ddp_pct_mean'], '+.1f', '%')} "
            f"/ {_f(r['gap_vs_ddp_pct_max'], '+.1f', '%')} "
            f"| {_f(r.get('tail_gap_vs_ddp_pct_mean'), '+.1f', '%')} "
            f"| {format(up['total'], ',') if up else 'dense'} | {ratio} "
            f"| {_f(r.get('codec_pct'), '.1f') if up else '-'} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    """Held-out loss curves, mean over seeds: one panel per (model, corpus, N), single in
    each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(*_key(r), r["n"]) for r in runs if r["arm"] != "single"})
    if not panels:
        return
    rows = sorted({(m, c) for m, c, _ in panels})
    ns = sorted({n for *_, n in panels})
    fig, axes = plt.subplots(
        len(rows), len(ns), figsize=(4.6 * len(ns), 3.6 * len(rows)), squeeze=False
    )
    for ax in axes.flat:
        ax.set_visible(False)
    for model, corpus, n in panels:
        ax = axes[rows.index((model, corpus))][ns.index(n)]
        ax.set_visible(True)
        _panel(ax, [r for r in runs if _key(r) == (model, corpus)], n)
        ax.set_title(f"{model}, {corpus}, N={n}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _panel(ax, runs: list[dict], n: int) -> None:
    arms = dict.fromkeys(r["arm"] for r in runs if r["n"] == n)
    for arm, nn in [("single", 1), *((a, n) for a in arms)]:
        rs = [r for r in runs if (r["n"], r["arm"]) == (nn, arm)]
        if not rs:
            continue
        steps = [t for t, _ in rs[0]["curve"]]
        mean = [statistics.mean(r["curve"][i][1] for r in rs) for i in range(len(steps))]
        ax.plot(steps, mean, label=f"{arm} ({len(rs)} seeds)")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out loss")
    ax.set_ylim(top=min(ax.get_ylim()[1], 4.5))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)


def write_report(runs: list[dict], s: Setup, out: Path, wall_s: int) -> str:
    rows = summarize(runs, s)
    params = {r.get("model", HARNESS): r["params"] for r in runs}
    meta = dict(
        setup=asdict(s),
        params=params,
        wall_s=wall_s,
        envelope_overhead=envelope.OVERHEAD,
        max_chunk=envelope.MAX_CHUNK,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, summary=rows, runs=runs), indent=1) + "\n")
    wall = f"; wall {wall_s}s" if wall_s else " (runs resumed over several invocations)"
    sizes = ", ".join(f"{m} {p:,} params" for m, p in params.items())
    md = f"Models: {sizes}; setup {asdict(s)}{wall}.\n\n" + table(rows)
    out.with_suffix(".md").write_text(md)
    plot(runs, out.with_suffix(".png"))
    return md


# ---------------------------------------------------------------------------- main


def load(corpus: str, s: Setup, subj: Subject) -> tuple[TextData, tuple]:
    train, held = CORPORA[corpus](max_train=s.max_train)
    train, held = subj.tokens(train), subj.tokens(held)
    return TextData(train, held, subj.ctx), bench_corpus.eval_windows(
        held, s.eval_windows, subj.ctx
    )


def plan(a, s: Setup) -> list[tuple[str, str, int, Arm, int]]:
    """(model, corpus, N, arm, seed) of every run, single first per (model, corpus, seed)."""
    demos = [parse_demo(x) for x in a.demo] if a.demo else [Arm("demo")]
    jobs = []
    for model, corpus in itertools.product(a.model, a.corpora):
        for seed in a.only_seeds or range(a.seeds):
            jobs.append((model, corpus, 1, Arm("single"), seed))
            for n in a.workers:
                arms = (Arm("ddp"), *(resolve(d, n, s.steps) for d in demos))
                jobs += [(model, corpus, n, arm, seed) for arm in arms]
    for *_, arm, _ in jobs:
        if arm.kind == "demo" and s.steps % (arm.K or 1):
            raise SystemExit(f"steps {s.steps} must be a multiple of K={arm.K}")
    return jobs


def _previous(path: Path, s: Setup) -> list[dict]:
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if asdict(Setup()) | old["meta"]["setup"] != asdict(s):  # files from before a field: default
        raise SystemExit(f"{path} was written with another setup; drop --resume or use --out")
    return renamed(old["runs"])


def renamed(runs: list[dict]) -> list[dict]:
    """The runs with their arms named from their settings under today's job defaults: a run
    made at an earlier default (say error-feedback decay 0.95) is then named by what it
    differs in, is not taken for a run of today's default, and does not share its row."""
    known = {f.name for f in fields(Arm)}
    return [
        r | {"arm": Arm(**(BEFORE | {k: v for k, v in r["spec"].items() if k in known})).name}
        if "spec" in r
        else r
        for r in runs
    ]


# settings added to Arm since runs were first stored, as every run stored before them had them
BEFORE = {"k_mean": 0}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="builtin:tiny, N=2, 1 seed: CI smoke")
    ap.add_argument(
        "--model",
        default=None,
        help="comma list of model URIs or 'harness' (default builtin:small; quick: builtin:tiny)",
    )
    ap.add_argument(
        "--corpora", default=None, help="comma list of code,prose,heldout (default all)"
    )
    ap.add_argument("--workers", default=None, help="comma list of N (default 2,4,8,16)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..S-1; default 3 (quick: 1)")
    ap.add_argument("--only-seeds", default=None, help="comma list: run just these seeds")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--ctx", type=int, default=None, help="window tokens (default: as a node)")
    ap.add_argument("--inner-lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="inner lr warm-up steps, all arms")
    ap.add_argument(
        "--schedule", choices=LR_SCHEDULES, default=None, help="inner lr schedule, all arms"
    )
    ap.add_argument("--min-lr-ratio", type=float, default=None, help="of inner lr, at the end")
    ap.add_argument("--demo", action="append", help="DeMo arm over the job defaults, e.g. K=4,k=16")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--resume", action="store_true", help="keep the runs already in --out (same setup)"
    )
    ap.add_argument("--report", action="store_true", help="only rewrite tables + plot of --out")
    ap.add_argument("--merge", nargs="+", type=Path, help="--out from these runs files' runs")
    a = ap.parse_args(argv)
    a.model = (a.model or ("builtin:tiny" if a.quick else "builtin:small")).split(",")
    a.corpora = (a.corpora or ("code" if a.quick else ",".join(CORPORA))).split(",")
    unknown = sorted(set(a.corpora) - set(CORPORA))
    if unknown:
        raise SystemExit(f"unknown corpora {unknown}; known: {sorted(CORPORA)}")
    a.workers = [int(x) for x in (a.workers or ("2" if a.quick else "2,4,8,16")).split(",")]
    a.seeds = a.seeds or (1 if a.quick else 3)
    a.only_seeds = [int(x) for x in a.only_seeds.split(",")] if a.only_seeds else None
    a.out = a.out or Path(
        "docs/bench/scaling_quick.json" if a.quick else "docs/bench/scaling_models.json"
    )
    return a


def _key5(r: dict) -> tuple:
    return (*_key(r), r["n"], r["arm"], r["seed"])


def _rewrite(a: argparse.Namespace) -> int:
    """--report: tables and plot of --out again; --merge: of the runs of several --out files
    (one per process of a split matrix, same setup) written to --out."""
    olds = [json.loads(p.read_text()) for p in (a.merge or [a.out])]
    setup = olds[0]["meta"]["setup"]
    if any(o["meta"]["setup"] != setup for o in olds):
        raise SystemExit("the files to merge were written with different setups")
    runs = list({_key5(r): r for o in olds for r in renamed(o["runs"])}.values())
    wall = 0 if a.merge else olds[0]["meta"].get("wall_s", 0)
    known = {f.name for f in fields(Setup)}  # files of the harness-only version had more keys
    s = Setup(**{k: v for k, v in setup.items() if k in known})
    print(write_report(runs, s, a.out, wall))
    return 0


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    torch.set_num_threads(1)
    s = QUICK if a.quick else Setup()
    over = dict(
        steps=a.steps,
        ctx=a.ctx,
        inner_lr=a.inner_lr,
        warmup=a.warmup,
        schedule=a.schedule,
        min_lr_ratio=a.min_lr_ratio,
    )
    s = replace(s, **{k: v for k, v in over.items() if v is not None})
    if a.report or a.merge:
        return _rewrite(a)
    jobs = plan(a, s)
    print(f"bench_scaling: {len(jobs)} runs, setup {asdict(s)}", flush=True)
    t0, runs = time.time(), _previous(a.out, s) if a.resume else []
    done = {(r.get("model", HARNESS), r["corpus"], r["n"], r["arm"], r["seed"]) for r in runs}
    subjects: dict[str, Subject] = {}
    cache: dict[tuple, Ctx] = {}
    for model, corpus, n, arm, seed in jobs:
        if (model, corpus, n, arm.name, seed) in done:
            continue
        subj = subjects.setdefault(model, Subject(model, s.ctx))
        if (model, corpus) not in cache:
            cache[model, corpus] = Ctx(s, subj, *load(corpus, s, subj))
        t1 = time.time()
        r = run(cache[model, corpus], arm, n, seed)
        runs.append(
            dict(model=model, corpus=corpus, n=n, arm=arm.name, spec=asdict(arm), seed=seed, **r)
        )
        print(
            f"  {model} {corpus:7s} N={n:<2d} {arm.name:24s} seed {seed}: loss {r['final']:.4f} "
            f"({time.time() - t1:.0f}s)",
            flush=True,
        )
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(dict(meta=dict(setup=asdict(s)), runs=runs)) + "\n")
    print(write_report(runs, s, a.out, round(time.time() - t0)))
    print(f"wrote {a.out}, {a.out.with_suffix('.md')} and {a.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

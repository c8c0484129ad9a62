"""Scaling benchmark (issue 14): do more operators train faster with DeMo?

One worker vs N workers with dense data-parallel (DDP, exact gradient mean) vs the product's DeMo
(node/dtrain_node/optim: compress, codec, robust screen, exact aggregation) at N = 2, 4, 8
workers simulated sequentially in one process. Every worker has the same per-worker batch; each
one's data is its shard from the node's own shard assignment (train/shard.py: a seeded
permutation of ctx-windows cut over the members sorted by address) and its own batch stream.

Per arm and seed: speedup = steps the single worker needs for its own final held-out loss /
steps the arm needs for that loss (linear interpolation between evaluations; None if never
reached), the final-loss gap to DDP, upload bytes per sync (the real codec packet, cut into
gossip chunks of envelope.MAX_CHUNK, each wrapped in the real signed envelope, plus the
commitment envelope sent before it) and codec time (compress + encode, decode of all N packets
+ exact aggregation) as % of one worker's compute over the K steps of a sync.

    python scripts/bench_scaling.py --quick                 # CI smoke (< 60 s)
    python scripts/bench_scaling.py                         # full matrix (hours on 2 cores)
    python scripts/bench_scaling.py --corpora code --workers 4 --seeds 2 \\
        --demo K=4,k=4 --demo K=4,k=16,bits=2               # a sweep
    python scripts/bench_scaling.py --resume --out /tmp/s1.json --only-seeds 1  # one seed of
        # the matrix per process: copies of one --out file run side by side, merged afterwards
    python scripts/bench_scaling.py --report --out docs/bench/scaling.json  # tables, plot only

Writes --out (JSON: setup, per-run records, summary), the same path with .md (tables) and with
.png (held-out loss curves, mean over seeds, per corpus and N).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from dtrain.models import default_topk
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.p2p import envelope
from dtrain_node.train import shard
from dtrain_node.train.corpus import TextData

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import bench_corpus, prose_corpus
from harness.baselines import ring_allreduce_bytes
from harness.bench_model import GPT, GPTConfig

CORPORA = {"code": bench_corpus.stdlib_corpus, "prose": prose_corpus.prose_corpus}


@dataclass(frozen=True)
class Arm:
    """kind: single | ddp | demo. DeMo arms: K inner steps per sync, k coefficients per
    chunk x chunk block (k1d per chunk-vector), 1- or 2-bit levels, outer lr, EF decay beta."""

    kind: str
    K: int = 1
    k: int = 0
    k1d: int = 1
    bits: int = 1
    chunk: int = 64
    lr: float = 1.0
    beta: float = 0.9
    mean: str = "senders"  # or "coef": each coefficient averaged over the senders that sent it

    @property
    def name(self) -> str:
        if self.kind != "demo":
            return self.kind
        s = f"demo K={self.K} k={self.k} {self.bits}b"
        if self.chunk != 64:
            s += f" c={self.chunk}"
        if self.k1d != 1:
            s += f" k1d={self.k1d}"
        if self.lr != 1.0:
            s += f" olr={self.lr:g}"
        if self.beta != 0.9:
            s += f" beta={self.beta:g}"
        if self.mean != "senders":
            s += f" mean={self.mean}"
        return s


@dataclass(frozen=True)
class Setup:
    d: int = 128
    n_layer: int = 4
    n_head: int = 2
    ctx: int = 128
    bsz: int = 8
    steps: int = 300
    eval_every: int = 20
    eval_windows: int = 128
    inner_lr: float = 2e-3
    warmup: int = 0  # linear inner-lr warm-up steps (all arms, single and DDP included)
    max_train: int = 4_000_000

    @property
    def model(self) -> GPTConfig:
        return GPTConfig(d=self.d, n_layer=self.n_layer, n_head=self.n_head, ctx=self.ctx)


QUICK = Setup(d=64, n_layer=2, n_head=1, ctx=64, bsz=4, steps=48, eval_every=8,
              eval_windows=32, max_train=300_000)  # fmt: skip
# the product default (dtrain job submit --sync 2 --quant-bits 1, recipe outer_momentum; --topk
# from the member count: dtrain.models.default_topk)
DEFAULT_DEMO = Arm("demo", K=2, k=4, bits=1, beta=0.95)


def default_demo(n: int) -> Arm:
    return replace(DEFAULT_DEMO, k=default_topk(n))


def parse_demo(spec: str) -> Arm:
    """'K=4,k=16,bits=2,chunk=32,lr=0.8,beta=0.95,k1d=2' -> Arm (unset keys keep defaults)."""
    kw: dict = {}
    types = {"K": int, "k": int, "k1d": int, "bits": int, "chunk": int, "lr": float, "beta": float}
    types["mean"] = str
    for part in filter(None, spec.split(",")):
        key, _, val = part.partition("=")
        if key.strip() not in types:
            raise SystemExit(f"unknown DeMo key {key!r} in {spec!r}; known: {sorted(types)}")
        kw[key.strip()] = types[key.strip()](val)
    return replace(DEFAULT_DEMO, **kw)


# ---------------------------------------------------------------------------- data


def members(n: int) -> list[str]:
    return [f"0x{i + 1:040x}" for i in range(n)]


def streams(data: TextData, n: int, bsz: int, seed: int) -> list[Iterator[torch.Tensor]]:
    """Each worker's endless window-index batches, dealt the way the node deals them."""
    ms, out = members(n), []
    for me in ms:
        idx = shard.assign(data.n_windows, 1000 + seed, 0, ms, me)
        out.append(_batches(idx, bsz, seed))
    return out


def _batches(idx: torch.Tensor, bsz: int, seed: int) -> Iterator[torch.Tensor]:
    walk = getattr(shard, "batch_indices", None)
    if walk is not None:  # the node's own walk over its shard
        for b, _ in walk(idx, bsz, seed):
            yield b
        return
    g = torch.Generator().manual_seed(seed * 7919 + int(idx[0]))  # pragma: no cover
    while True:  # pragma: no cover
        perm = idx[torch.randperm(len(idx), generator=g)]
        for i in range(0, len(perm) - bsz + 1, bsz):
            yield perm[i : i + bsz]


@torch.no_grad()
def evaluate(m: torch.nn.Module, ev: tuple[torch.Tensor, torch.Tensor]) -> float:
    m.eval()
    tot = 0.0
    for i in range(0, len(ev[0]), 32):
        x, y = ev[0][i : i + 32], ev[1][i : i + 32]
        tot += float(m(x, y)) * len(x)
    m.train()
    return tot / len(ev[0])


def _set_lr(opt: torch.optim.Optimizer, s: Setup, t: int) -> None:
    lr = s.inner_lr * min(1.0, t / s.warmup) if s.warmup else s.inner_lr
    for g in opt.param_groups:
        g["lr"] = lr


# ---------------------------------------------------------------------------- arms


def run(s: Setup, data: TextData, ev, arm: Arm, n: int, seed: int) -> dict:
    """Train one arm; returns its held-out curve, timings and packet bytes."""
    torch.manual_seed(seed)
    base = GPT(s.model)
    nw = 1 if arm.kind == "single" else n
    st = streams(data, nw, s.bsz, seed)
    curve = [(0, evaluate(base, ev))]
    rec = dict(compute_s=0.0, codec_s=0.0, screen_s=0.0, syncs=0, packet_bytes=0)
    if arm.kind in ("single", "ddp"):
        _dense(s, data, ev, base, st, curve, rec)
    else:
        _demo(s, data, ev, arm, base, st, curve, rec)
    return dict(params=base.numel(), curve=curve, final=curve[-1][1], workers=nw, **rec)


def _dense(s: Setup, data, ev, model, st, curve, rec) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=s.inner_lr, betas=(0.9, 0.95))
    for t in range(1, s.steps + 1):
        _set_lr(opt, s, t)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for it in st:  # exact mean of the workers' gradients, in worker order
            (model(*data.windows(next(it))) / len(st)).backward()
        opt.step()
        rec["compute_s"] += (time.perf_counter() - t0) / len(st)
        if t % s.eval_every == 0 or t == s.steps:
            curve.append((t, evaluate(model, ev)))


def _demo(s: Setup, data, ev, arm: Arm, base, st, curve, rec) -> None:
    n = len(st)
    models = [GPT(s.model) for _ in range(n)]
    for m in models:
        m.load_state_dict(base.state_dict())
    cfg = DeMoConfig(
        mode="local",
        sync_interval=arm.K,
        lr=arm.lr,
        beta=arm.beta,
        inner_lr=s.inner_lr,
        per_coefficient_mean=arm.mean == "coef",
        compress=CompressConfig(chunk=arm.chunk, k2d=arm.k, k1d=arm.k1d, bits=arm.bits),
    )
    ms = members(n)
    opts = [DeMo(m.named_parameters(), cfg, sender=a) for m, a in zip(models, ms, strict=True)]
    for t in range(1, s.steps + 1):
        t0 = time.perf_counter()
        for m, o, it in zip(models, opts, st, strict=True):
            _set_lr(o.inner, s, t)
            m(*data.windows(next(it))).backward()
            o.inner_step()
        rec["compute_s"] += (time.perf_counter() - t0) / n
        if opts[0].due:
            packets = [(o.sender, o.prepare()) for o in opts]
            # every node decodes all packets and aggregates; the result is bitwise the same
            # everywhere, so it is computed once and applied to every simulated node
            res = opts[0].apply(packets)
            if res.applied != tuple(ms):
                raise RuntimeError(f"honest packets dropped: {res.rejected} {res.excluded}")
            for o in opts[1:]:
                o.apply_aggregate(res.aggregate)
            comp = sum(o._compress_s for o in opts) / n
            rec["codec_s"] += comp + res.aggregate_s
            rec["screen_s"] += res.screen_s
            rec["packet_bytes"] = max(len(p) for _, p in packets)
            rec["syncs"] += 1
        if t % s.eval_every == 0 or t == s.steps:
            curve.append((t, evaluate(models[0], ev)))


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


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def summarize(runs: list[dict], setup: Setup) -> list[dict]:
    """One row per (corpus, N, arm): means over seeds of speedup, gap to DDP, bytes, codec %."""
    out = []
    keys = sorted({(r["corpus"], r["n"]) for r in runs if r["arm"] != "single"})
    for corpus, n in keys:
        single = {r["seed"]: r for r in runs if r["corpus"] == corpus and r["arm"] == "single"}
        ddp = {r["seed"]: r for r in runs if (r["corpus"], r["n"], r["arm"]) == (corpus, n, "ddp")}
        arms = dict.fromkeys(r["arm"] for r in runs if (r["corpus"], r["n"]) == (corpus, n))
        for arm in arms:
            rs = [r for r in runs if (r["corpus"], r["n"], r["arm"]) == (corpus, n, arm)]
            out.append(_row(corpus, n, arm, rs, single, ddp, setup))
    return out


def _row(corpus, n, arm, rs, single, ddp, setup) -> dict:
    sp, gaps, rel = [], [], []
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
        bf16_ring_bytes=ring_allreduce_bytes(P, 2, n),
        bf16_model_bytes=2 * P,
    )
    if rs[0]["syncs"]:
        up = upload_bytes(rs[0]["packet_bytes"])
        row |= dict(
            upload=up,
            x_vs_bf16_ring=row["bf16_ring_bytes"] / up["total"],
            x_vs_bf16_model=row["bf16_model_bytes"] / up["total"],
            codec_pct=100 * _mean([r["codec_s"] / r["compute_s"] for r in rs]),
            screen_pct=100 * _mean([r["screen_s"] / r["compute_s"] for r in rs]),
        )
    return row


def _f(x, fmt, unit=""):
    return "never" if x is None else format(x, fmt) + unit


def table(rows: list[dict]) -> str:
    head = (
        "| corpus | N | arm | speedup vs single | % of DDP speedup | reached | gap vs DDP "
        "(mean / worst) | upload B/sync | x vs bf16 ring | codec % |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        up = r.get("upload")
        lines.append(
            f"| {r['corpus']} | {r['workers']} | {r['arm']} | {_f(r['speedup_mean'], '.2f', 'x')} "
            f"({', '.join(_f(x, '.2f') for x in r['speedup'])}) "
            f"| {_f(r['speedup_vs_ddp_mean'] and 100 * r['speedup_vs_ddp_mean'], '.0f', '%')} "
            f"| {r['reached']}/{len(r['seeds'])} "
            f"| {_f(r['gap_vs_ddp_pct_mean'], '+.1f', '%')} "
            f"/ {_f(r['gap_vs_ddp_pct_max'], '+.1f', '%')} "
            f"| {format(up['total'], ',') if up else 'dense'} "
            f"| {_f(r.get('x_vs_bf16_ring'), ',.0f') if up else '1'} "
            f"| {_f(r.get('codec_pct'), '.1f') if up else '-'} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(runs: list[dict], path: Path) -> None:
    """Held-out loss curves, mean over seeds: one panel per (corpus, N), single in each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["corpus"], r["n"]) for r in runs if r["arm"] != "single"})
    if not panels:
        return
    corpora = sorted({c for c, _ in panels})
    ns = sorted({n for _, n in panels})
    fig, axes = plt.subplots(
        len(corpora), len(ns), figsize=(4.6 * len(ns), 3.6 * len(corpora)), squeeze=False
    )
    for ax in axes.flat:
        ax.set_visible(False)
    for corpus, n in panels:
        ax = axes[corpora.index(corpus)][ns.index(n)]
        ax.set_visible(True)
        arms = dict.fromkeys(r["arm"] for r in runs if (r["corpus"], r["n"]) == (corpus, n))
        for arm, nn in [("single", 1), *((a, n) for a in arms)]:
            rs = [r for r in runs if (r["corpus"], r["n"], r["arm"]) == (corpus, nn, arm)]
            if not rs:
                continue
            steps = [t for t, _ in rs[0]["curve"]]
            mean = [statistics.mean(r["curve"][i][1] for r in rs) for i in range(len(steps))]
            ax.plot(steps, mean, label=f"{arm} ({len(rs)} seeds)")
        ax.set_title(f"{corpus}, N={n}")
        ax.set_xlabel("step")
        ax.set_ylabel("held-out loss")
        ax.set_ylim(top=min(ax.get_ylim()[1], 4.5))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(runs: list[dict], s: Setup, out: Path, wall_s: int) -> str:
    rows = summarize(runs, s)
    meta = dict(setup=asdict(s), params=runs[0]["params"], wall_s=wall_s,
                envelope_overhead=envelope.OVERHEAD, max_chunk=envelope.MAX_CHUNK)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(meta=meta, summary=rows, runs=runs), indent=1) + "\n")
    wall = f"; wall {wall_s}s" if wall_s else " (runs resumed over several invocations)"
    md = f"Model {runs[0]['params']:,} params; setup {asdict(s)}{wall}.\n\n" + table(rows)
    out.with_suffix(".md").write_text(md)
    plot(runs, out.with_suffix(".png"))
    return md


# ---------------------------------------------------------------------------- main


def load(corpus: str, s: Setup):
    train, held = CORPORA[corpus](max_train=s.max_train)
    data = TextData(train, held, s.ctx)
    return data, bench_corpus.eval_windows(held, s.eval_windows, s.ctx)


def plan(a, s: Setup) -> list[tuple[str, int, Arm, int]]:
    demos = [parse_demo(x) for x in a.demo] if a.demo else None
    for d in demos or [DEFAULT_DEMO]:
        if s.steps % d.K:
            raise SystemExit(f"steps {s.steps} must be a multiple of K={d.K}")
    jobs = []
    for corpus in a.corpora:
        for seed in a.only_seeds or range(a.seeds):
            jobs.append((corpus, 1, Arm("single"), seed))
            for n in a.workers:
                arms = (Arm("ddp"), *(demos or [default_demo(n)]))
                jobs += [(corpus, n, arm, seed) for arm in arms]
    return jobs


def _previous(path: Path, s: Setup) -> list[dict]:
    if not path.exists():
        return []
    old = json.loads(path.read_text())
    if old["meta"]["setup"] != asdict(s):
        raise SystemExit(f"{path} was written with another setup; drop --resume or use --out")
    return old["runs"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, N=2, 1 seed: CI smoke")
    ap.add_argument("--corpora", default=None, help="comma list of code,prose (default both)")
    ap.add_argument("--workers", default=None, help="comma list of N (default 2,4,8)")
    ap.add_argument("--seeds", type=int, default=None, help="seeds 0..S-1; default 3 (quick: 1)")
    ap.add_argument("--only-seeds", default=None, help="comma list: run just these seeds")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--inner-lr", type=float, default=None)
    ap.add_argument("--warmup", type=int, default=None, help="inner lr warm-up steps, all arms")
    ap.add_argument("--demo", action="append", help="DeMo arm spec, e.g. K=4,k=16,bits=2")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--resume", action="store_true", help="keep the runs already in --out (same setup)"
    )
    ap.add_argument("--report", action="store_true", help="only rewrite tables + plot of --out")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    s = QUICK if a.quick else Setup()
    over = dict(steps=a.steps, inner_lr=a.inner_lr, warmup=a.warmup)
    s = replace(s, **{k: v for k, v in over.items() if v is not None})
    a.corpora = (a.corpora or ("code" if a.quick else "code,prose")).split(",")
    a.workers = [int(x) for x in (a.workers or ("2" if a.quick else "2,4,8")).split(",")]
    a.seeds = a.seeds or (1 if a.quick else 3)
    a.only_seeds = [int(x) for x in a.only_seeds.split(",")] if a.only_seeds else None
    a.out = a.out or Path("docs/bench/scaling_quick.json" if a.quick else "docs/bench/scaling.json")
    if a.report:
        old = json.loads(a.out.read_text())
        s = Setup(**old["meta"]["setup"])
        print(write_report(old["runs"], s, a.out, old["meta"].get("wall_s", 0)))
        return 0
    jobs = plan(a, s)
    print(f"bench_scaling: {len(jobs)} runs, setup {asdict(s)}", flush=True)
    t0, runs, cache = time.time(), _previous(a.out, s) if a.resume else [], {}
    done = {(r["corpus"], r["n"], r["arm"], r["seed"]) for r in runs}
    for corpus, n, arm, seed in jobs:
        if (corpus, n, arm.name, seed) in done:
            continue
        if corpus not in cache:
            cache[corpus] = load(corpus, s)
        t1 = time.time()
        r = run(s, *cache[corpus], arm, n, seed)
        runs.append(dict(corpus=corpus, n=n, arm=arm.name, spec=asdict(arm), seed=seed, **r))
        print(
            f"  {corpus:5s} N={n} {arm.name:28s} seed {seed}: loss {r['final']:.4f} "
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

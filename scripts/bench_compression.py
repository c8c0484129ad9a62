"""Communication / quality benchmark of DeMo against dense AdamW DDP and DiLoCo.

N simulated workers in one process train a small byte-level GPT on disjoint shards of this
machine's Python standard library sources; every arm sees the same tokens (same init, same
per-worker batches, same number of steps) and is evaluated on the same held-out windows.

Bytes are measured from the serialized DeMo packets (plus a fixed envelope estimate, see
ENVELOPE_BYTES), compared with the upload per worker of a dense ring all-reduce of the model.

    python scripts/bench_compression.py --quick          # CI: < 3 minutes on 2 cores
    python scripts/bench_compression.py --jobs 2         # full run (docs/benchmarks.md)

Writes DIR/compression.json (list of arm records), DIR/compression.md, DIR/compression.png;
DIR is docs/bench (full) or docs/bench/quick (--quick) unless --out is given.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig

# The benchmark baselines, model and corpus live with the test harnesses, not in the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import bench_corpus as corpus
from harness.baselines import DDP, AdamWConfig, DiLoCo, DiLoCoConfig, ring_allreduce_bytes
from harness.bench_model import GPT, GPTConfig

# Envelope of a gossip message around the payload: chain id 8 + contract 20 + job 8 + epoch 8
# + round 8 + sender 20 + secp256k1 signature 65 + framing 23. An estimate until the gossip
# layer exists; it is counted in upload_bytes_per_sync so the ratios are not flattered.
ENVELOPE_BYTES = 160


@dataclass(frozen=True)
class Arm:
    name: str
    kind: str  # ddp | diloco | paper | local
    K: int = 1
    k: int = 0  # coefficients per 64x64 chunk (DeMo)
    bits: int = 1
    lr: float = 0.0  # outer lr (DeMo, DiLoCo)
    beta: float = 0.9
    sign: bool = False


@dataclass(frozen=True)
class Setup:
    model: GPTConfig
    workers: int
    bsz: int
    steps: int
    inner_lr: float
    eval_windows: int
    eval_every: int
    max_train: int
    arms: tuple[Arm, ...] = field(default=())


def setups(quick: bool) -> Setup:
    """The two configurations. Local arms: K in Ks x k in (4, 16) per 4096-chunk, 1-bit values;
    k=4 (~0.1% density) is the >= 1000x-per-sync regime, k=16 (~0.4%) trades bytes for quality.
    """
    if quick:
        m = GPTConfig(d=128, n_layer=2, n_head=2, ctx=64)
        s = dict(workers=4, bsz=4, steps=96, eval_windows=32, eval_every=24, max_train=600_000)
    else:
        m = GPTConfig(d=256, n_layer=4, n_head=4, ctx=128)
        s = dict(workers=4, bsz=4, steps=256, eval_windows=64, eval_every=32, max_train=4_000_000)
    ks = (4, 16)
    arms = (
        Arm("ddp", "ddp"),
        Arm(f"diloco K={ks[0]}", "diloco", K=ks[0], lr=0.7),
        Arm("demo-paper k=4", "paper", K=1, k=4, bits=1, lr=1e-3, beta=0.9, sign=True),
        *(
            Arm(f"demo-local K={K} k={k}", "local", K=K, k=k, bits=1, lr=1.0, beta=0.9)
            for K in ks
            for k in (4, 16)
        ),
    )
    return Setup(model=m, inner_lr=2e-3, arms=arms, **s)


def _loss(m, b):
    return m(*b)


@torch.no_grad()
def evaluate(m: torch.nn.Module, ev) -> float:
    m.eval()
    out = 0.0
    for i in range(0, len(ev[0]), 16):
        out += float(m(ev[0][i : i + 16], ev[1][i : i + 16])) * len(ev[0][i : i + 16])
    m.train()
    return out / len(ev[0])


def run(setup: Setup, arm: Arm, seed: int) -> dict:
    """Train one arm with one seed; returns curves, bytes and timings."""
    torch.set_num_threads(1)
    train, held = corpus.stdlib_corpus(max_train=setup.max_train)
    ev = corpus.eval_windows(held, setup.eval_windows, setup.model.ctx)
    shards = corpus.shards(train, setup.workers)
    gens = [torch.Generator().manual_seed(1000 * seed + w) for w in range(setup.workers)]
    torch.manual_seed(seed)
    base = GPT(setup.model)
    P = base.numel()
    N = setup.workers

    def replicas():
        ms = [GPT(setup.model) for _ in range(N)]
        for m in ms:
            m.load_state_dict(base.state_dict())
        return ms

    inner = AdamWConfig(lr=setup.inner_lr)
    compute_s = codec_s = 0.0
    syncs, packet_bytes, false_exclusions = 0, 0, 0
    curve = [(0, evaluate(base, ev))]
    if arm.kind == "ddp":
        method = DDP(base, inner)
    elif arm.kind == "diloco":
        method = DiLoCo(replicas(), DiLoCoConfig(inner=inner, sync_interval=arm.K, outer_lr=arm.lr))
    else:
        models = replicas()
        cfg = DeMoConfig(
            mode=arm.kind,
            sync_interval=arm.K,
            lr=arm.lr,
            beta=arm.beta,
            sign=arm.sign,
            inner_lr=setup.inner_lr,
            inner_betas=inner.betas,
            compress=CompressConfig(k2d=arm.k, k1d=1, bits=arm.bits),
        )
        opts = [DeMo(m.named_parameters(), cfg, sender=w) for w, m in enumerate(models)]
    for t in range(1, setup.steps + 1):
        batches = [corpus.batch(shards[w], setup.bsz, setup.model.ctx, gens[w]) for w in range(N)]
        t0 = time.perf_counter()
        if arm.kind in ("ddp", "diloco"):
            method.step(batches, _loss)
            compute_s += time.perf_counter() - t0
            if t % method.sync_interval == 0:
                syncs += 1
        else:
            for m, o, b in zip(models, opts, batches, strict=True):
                _loss(m, b).backward()
                if arm.kind == "local":
                    o.inner_step()
            compute_s += time.perf_counter() - t0
            if opts[0].due:
                packets = [(o.sender, o.prepare()) for o in opts]
                comp = sum(o._compress_s for o in opts) / N  # per worker
                # every node computes the same aggregate; simulate it once, apply it everywhere
                st = opts[0].apply(packets)
                # every worker is honest: an exclusion is the robust rule's false positive
                assert not st.rejected, st.rejected
                false_exclusions += len(st.excluded)
                for o in opts[1:]:
                    o.apply_aggregate(st.aggregate)
                for m in models:
                    for p in m.parameters():
                        p.grad = None
                codec_s += comp + st.aggregate_s
                packet_bytes = max(len(p) for _, p in packets)
                syncs += 1
        if t % setup.eval_every == 0 or t == setup.steps:
            em = method.eval_model() if arm.kind in ("ddp", "diloco") else models[0]
            curve.append((t, evaluate(em, ev)))
    return dict(
        arm=arm.name,
        seed=seed,
        params=P,
        curve=curve,
        final=curve[-1][1],
        syncs=syncs,
        packet_bytes=packet_bytes,
        compute_s_per_worker=compute_s / N,
        codec_s=codec_s,
        false_exclusions=false_exclusions,
    )


def _job(args):
    setup, arm, seed = args
    t0 = time.time()
    r = run(setup, arm, seed)
    print(
        f"  {arm.name:24s} seed {seed}: loss {r['final']:.4f} ({time.time() - t0:.0f}s)", flush=True
    )
    return r


def summarize(setup: Setup, results: list[dict], seeds: list[int]) -> list[dict]:
    N, recs = setup.workers, []
    by = {a.name: [r for r in results if r["arm"] == a.name] for a in setup.arms}
    P = results[0]["params"]
    bf16, fp32 = ring_allreduce_bytes(P, 2, N), ring_allreduce_bytes(P, 4, N)
    ddp_mean = statistics.mean(r["final"] for r in by["ddp"])
    tokens = setup.steps * N * setup.bsz * setup.model.ctx
    for a in setup.arms:
        rs = by[a.name]
        finals = [r["final"] for r in rs]
        mean = statistics.mean(finals)
        std = statistics.stdev(finals) if len(finals) > 1 else 0.0
        if a.kind in ("ddp", "diloco"):
            payload, up = fp32, fp32  # the baselines all-reduce dense fp32
            codec_pct = 0.0
        else:
            payload = rs[0]["packet_bytes"]
            up = payload + ENVELOPE_BYTES
            per_sync_codec = statistics.mean(r["codec_s"] / max(r["syncs"], 1) for r in rs)
            per_sync_compute = statistics.mean(
                r["compute_s_per_worker"] / max(r["syncs"], 1) for r in rs
            )
            codec_pct = 100 * per_sync_codec / per_sync_compute
        recs.append(
            dict(
                arm=a.name,
                method=a.kind,
                k_per_chunk=a.k or None,
                bits=a.bits if a.k else None,
                sync_interval=a.K,
                workers=N,
                params=P,
                tokens=tokens,
                seeds=len(rs),
                heldout_loss_mean=mean,
                heldout_loss_std=std,
                heldout_losses=finals,
                gap_vs_ddp_pct=100 * (mean - ddp_mean) / ddp_mean,
                payload_bytes_per_sync=payload,
                upload_bytes_per_sync=up,
                ratio_vs_bf16_per_sync=bf16 / up,
                ratio_vs_fp32_per_sync=fp32 / up,
                ratio_vs_bf16_per_step=bf16 / (up / a.K),
                codec_time_pct_of_compute=codec_pct,
                honest_exclusions=sum(r["false_exclusions"] for r in rs),
                curve_steps=[s for s, _ in rs[0]["curve"]],
                curve_loss_mean=[
                    statistics.mean(r["curve"][i][1] for r in rs)
                    for i in range(len(rs[0]["curve"]))
                ],
            )
        )
    return recs


def table(recs: list[dict]) -> str:
    head = (
        "| arm | K | k/4096 | held-out loss | gap vs DDP | upload B/sync | x vs bf16/sync "
        "| x vs fp32/sync | x vs bf16/step | codec % compute | honest excl. |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for r in recs:
        rows.append(
            f"| {r['arm']} | {r['sync_interval']} | {r['k_per_chunk'] or 'dense'} "
            f"| {r['heldout_loss_mean']:.4f} ± {r['heldout_loss_std']:.4f} "
            f"| {r['gap_vs_ddp_pct']:+.2f}% | {r['upload_bytes_per_sync']:,.0f} "
            f"| {r['ratio_vs_bf16_per_sync']:,.1f} | {r['ratio_vs_fp32_per_sync']:,.1f} "
            f"| {r['ratio_vs_bf16_per_step']:,.1f} | {r['codec_time_pct_of_compute']:.1f} "
            f"| {r['honest_exclusions']} |"
        )
    return head + "\n".join(rows) + "\n"


def plot(recs: list[dict], setup: Setup, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tok = setup.workers * setup.bsz * setup.model.ctx
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in recs:
        ax.plot(
            [s * tok / 1e6 for s in r["curve_steps"]],
            r["curve_loss_mean"],
            label=r["arm"],
            marker=".",
        )
    ax.set_xlabel("tokens (M, all workers)")
    ax.set_ylabel("held-out loss (nats/byte), mean over seeds")
    ax.set_ylim(top=min(5.6, max(max(r["curve_loss_mean"]) for r in recs)))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"{recs[0]['params'] / 1e6:.2f}M-param byte GPT, N={setup.workers} workers")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, 1 seed: CI smoke run")
    ap.add_argument("--seeds", type=int, default=None, help="default 3 (quick: 1)")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=1, help="parallel processes, 1 thread each")
    ap.add_argument(
        "--out", type=Path, default=None, help="default docs/bench (quick: docs/bench/quick)"
    )
    a = ap.parse_args(argv)
    # a quick run must not overwrite the documented full-run results
    a.out = a.out or Path("docs/bench/quick" if a.quick else "docs/bench")
    setup = setups(a.quick)
    if a.steps:
        setup = replace(setup, steps=a.steps)
    if any(setup.steps % arm.K for arm in setup.arms):
        raise SystemExit(f"steps {setup.steps} must be a multiple of every sync interval")
    seeds = list(range(a.seeds if a.seeds else (1 if a.quick else 3)))
    jobs = [(setup, arm, s) for s in seeds for arm in setup.arms]
    t0 = time.time()
    P = GPT(setup.model).numel()
    print(
        f"bench_compression: {P:,} params, N={setup.workers}, {setup.steps} steps, "
        f"{len(seeds)} seeds, {len(setup.arms)} arms, {a.jobs} jobs",
        flush=True,
    )
    if a.jobs > 1:
        with mp.get_context("spawn").Pool(a.jobs) as pool:
            results = list(pool.imap_unordered(_job, jobs))
    else:
        results = [_job(j) for j in jobs]
    recs = summarize(setup, results, seeds)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "compression.json").write_text(json.dumps(recs, indent=1) + "\n")
    c = setup.model
    meta = (
        f"Model: byte-level GPT d={c.d} layers={c.n_layer} heads={c.n_head} ctx={c.ctx}, "
        f"{P:,} params; N={setup.workers} workers x batch {setup.bsz} x {setup.steps} steps = "
        f"{recs[0]['tokens']:,} tokens per arm; seeds {len(seeds)}; wall {time.time() - t0:.0f}s. "
        f"Dense references: ring all-reduce upload per worker, bf16 "
        f"{ring_allreduce_bytes(P, 2, setup.workers):,.0f} B, fp32 "
        f"{ring_allreduce_bytes(P, 4, setup.workers):,.0f} B. DeMo upload = packet + "
        f"{ENVELOPE_BYTES} B envelope estimate.\n"
    )
    md = meta + "\n" + table(recs)
    (a.out / "compression.md").write_text(md)
    plot(recs, setup, a.out / "compression.png")
    print(md)
    print(f"wrote {a.out}/compression.json, compression.md, compression.png")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

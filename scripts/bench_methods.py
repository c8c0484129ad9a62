"""Held-out metric of each training method before/after a fixed step budget: one worker (plain
AdamW) vs 3 in-process workers with DeMo sync (local mode, lockstep rounds).

Every worker takes the same number of steps, so 3 workers see 3x the data for the same wall-clock
budget on 3 machines. Writes docs/bench/methods.{json,md} (--quick: docs/bench/quick/).

    nice .venv/bin/python scripts/bench_methods.py --quick
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import corpus, tasks
from dtrain_node.train.backend import TrainJob, make_backend

ROOT = Path(__file__).resolve().parent.parent
K = 4  # inner steps per DeMo sync


@dataclass(frozen=True)
class Setup:
    method: str
    task: str
    metric: str
    higher_is_better: bool
    inner_lr: float
    steps: int


def setups(quick: bool) -> list[Setup]:
    s = 1 if quick else 4
    return [
        Setup("cpt", "stdlib sources, ctx 128", "heldout_loss", False, 3e-3, 40 * s),
        Setup("sft", "2-digit addition", "heldout_loss", False, 3e-3, 60 * s),
        Setup("dpo", "reversal of 4 letters", "preference_accuracy", True, 1e-3, 40 * s),
        Setup("grpo", "last letter of 4, G=8", "mean_reward", True, 3e-3, 24 * s),
    ]


def dataset(method: str, work: Path, quick: bool) -> tuple[str, bytes]:
    n = 1000 if quick else 4000
    if method == "cpt":
        path = work / "cpt.txt"
        return str(path), corpus.build_stdlib_corpus(path, 300_000 if quick else 2_000_000)
    path = work / f"{method}.jsonl"
    probs = {
        "sft": lambda: tasks.addition(n, digits=2, seed=0),
        "dpo": lambda: tasks.reversal(n, length=4, seed=0),
        "grpo": lambda: tasks.last_letter(n, length=4, seed=0),
    }[method]()
    return str(path), tasks.make_dataset(path, method, probs)


def run(setup: Setup, workers: int, uri: str, h: bytes) -> dict:
    batch = 16 if setup.method != "cpt" else 8
    job = TrainJob(
        job_id=7,
        method=setup.method,
        model_uri="builtin:tiny",
        dataset_uri=uri,
        dataset_hash=h,
        batch_size=batch,
    )
    bs = [make_backend(job) for _ in range(workers)]
    n = bs[0].n_items()
    its = [b.batches(torch.arange(w, n, workers), job.batch_size, w) for w, b in enumerate(bs)]
    before = bs[0].evaluate()
    t0 = time.perf_counter()
    if workers == 1:
        opt = torch.optim.AdamW(bs[0].model.parameters(), lr=setup.inner_lr, betas=(0.9, 0.95))
        for _ in range(setup.steps):
            bs[0].loss(next(its[0])).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        cfg = DeMoConfig(mode="local", sync_interval=K, lr=1.0, inner_lr=setup.inner_lr)
        opts = [DeMo(b.model.named_parameters(), cfg, sender=w) for w, b in enumerate(bs)]
        for _ in range(setup.steps // K):
            for b, o, it in zip(bs, opts, its, strict=True):
                for _ in range(K):
                    b.loss(next(it)).backward()
                    o.inner_step()
            lockstep(opts)
    seconds = time.perf_counter() - t0
    after = bs[0].evaluate()
    return {
        "method": setup.method,
        "task": setup.task,
        "workers": workers,
        "steps_per_worker": setup.steps,
        "metric": setup.metric,
        "higher_is_better": setup.higher_is_better,
        "before": before[setup.metric],
        "after": after[setup.metric],
        "before_all": before,
        "after_all": after,
        "train_seconds": round(seconds, 2),
    }


def table(records: list[dict]) -> str:
    lines = [
        "| method | task | workers | steps/worker | metric | before | after | other metrics after "
        "| train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        other = ", ".join(f"{k} {v:.3f}" for k, v in r["after_all"].items() if k != r["metric"])
        lines.append(
            f"| {r['method']} | {r['task']} | {r['workers']} | {r['steps_per_worker']} | "
            f"{r['metric']} | {r['before']:.3f} | {r['after']:.3f} | {other or '-'} | "
            f"{r['train_seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small budget, under 5 minutes")
    ap.add_argument("--methods", default="cpt,sft,dpo,grpo")
    args = ap.parse_args()
    torch.set_num_threads(1)
    out = ROOT / "docs" / "bench" / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    records = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for s in setups(args.quick):
            if s.method not in args.methods.split(","):
                continue
            uri, h = dataset(s.method, Path(tmp), args.quick)
            for workers in (1, 3):
                r = run(s, workers, uri, h)
                records.append(r)
                print(
                    f"{s.method} workers={workers} {s.metric}: {r['before']:.3f} -> "
                    f"{r['after']:.3f} ({r['train_seconds']:.1f} s)",
                    flush=True,
                )
    (out / "methods.json").write_text(json.dumps(records, indent=1) + "\n")
    header = (
        f"Training methods, builtin:tiny, {'quick' if args.quick else 'full'} budget, "
        f"DeMo local mode K={K} (3 workers) vs plain AdamW (1 worker); total "
        f"{time.perf_counter() - t0:.0f} s on this machine.\n\n"
    )
    (out / "methods.md").write_text(header + table(records))
    print(table(records))


if __name__ == "__main__":
    main()

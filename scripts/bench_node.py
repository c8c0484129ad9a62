"""Node benchmark: runner overhead between syncs and the wall time of a sync round.

1. tokens/s of one operator node inside the full runner (a one-member job on a local chain,
   real gossip host, metrics from its metrics.jsonl) against the same model, batch and data in a
   bare training loop (forward, backward, AdamW step);
2. wall time of one sync round (compress + gossip + exact aggregate + apply) for 3 nodes on
   loopback.

Writes DIR/node.json and DIR/node.md (DIR: docs/bench, or docs/bench/quick with --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from dtrain_node import devnet

ROOT = Path(__file__).resolve().parent.parent


def bare_tokens_per_s(data: Path, digest: bytes, steps: int, batch: int, job_id: int) -> float:
    import torch

    from dtrain_node.train.backend import TrainJob, make_backend

    torch.set_num_threads(1)  # as the nodes run (one thread each, see devnet.spawn_node)
    job = TrainJob(
        job_id=job_id,
        method="cpt",
        model_uri="builtin:tiny",
        dataset_uri=str(data),
        dataset_hash=digest,
        batch_size=batch,
    )
    b = make_backend(job)
    opt = torch.optim.AdamW(b.model.parameters(), lr=2e-3, betas=(0.9, 0.95))
    it = b.batches(torch.arange(b.n_items()), batch, seed=0)
    for _ in range(3):  # warm-up
        b.loss(next(it)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    t0, tokens = time.perf_counter(), 0
    for _ in range(steps):
        x = next(it)
        b.loss(x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        tokens += x[0].numel()
    return tokens / (time.perf_counter() - t0)


def run_cluster(tmp: Path, operators: int, steps: int, sync: int) -> list[dict]:
    with devnet.Cluster(tmp, operators=operators, steps=steps, sync=sync, epoch_duration=600) as c:
        for i in range(operators):
            c.spawn(i)
        c.wait(c.ended, 900, "the job to end")
        rounds = [m for i in range(operators) for m in c.metrics(i) if m["kind"] == "round"]
        spec = c.spec
        digest, data = spec.dataset_hash, Path(spec.dataset_uri)
        bare = bare_tokens_per_s(data, digest, steps, 8, c.job_id) if operators == 1 else None
    return rounds if bare is None else [*rounds, {"bare": bare}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="CI size: under 3 minutes")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    out = a.out or ROOT / ("docs/bench/quick" if a.quick else "docs/bench")
    out.mkdir(parents=True, exist_ok=True)
    steps, sync = (40, 10) if a.quick else (120, 10)
    with tempfile.TemporaryDirectory(prefix="bench-node-") as tmp:
        one = run_cluster(Path(tmp) / "one", 1, steps, sync)
        three = run_cluster(Path(tmp) / "three", 3, steps // 2, sync // 2)
    bare = next(r["bare"] for r in one if "bare" in r)
    runner = statistics.median(r["tokens_per_s"] for r in one if "tokens_per_s" in r)
    sync_round = statistics.median(r["sync_s"] for r in three)
    rec = {
        "runner_tokens_per_s": round(runner, 1),
        "bare_tokens_per_s": round(bare, 1),
        "overhead_pct": round(100 * (bare - runner) / bare, 1),
        "sync_round_s": round(sync_round, 3),
        "sync_round_p95_s": round(
            sorted(r["sync_s"] for r in three)[int(0.95 * (len(three) - 1))], 3
        ),
        "compress_s": round(statistics.median(r["compress_s"] for r in three), 4),
        "aggregate_s": round(statistics.median(r["aggregate_s"] for r in three), 4),
        "packet_bytes": statistics.median(r["bytes_out"] for r in three),
        "nodes": 3,
        "steps": steps,
        "model": "builtin:tiny",
        "quick": a.quick,
        "load_average_1m": round(os.getloadavg()[0], 2),  # the machine is shared: context
    }
    (out / "node.json").write_text(json.dumps(rec, indent=2) + "\n")
    table = "\n".join(
        [
            "| runner tokens/s | bare tokens/s | overhead | sync round (3 nodes) median / p95 "
            "| compress | aggregate | packet |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            f"| {rec['runner_tokens_per_s']:,} | {rec['bare_tokens_per_s']:,} | "
            f"{rec['overhead_pct']}% | {rec['sync_round_s']} s / {rec['sync_round_p95_s']} s | "
            f"{rec['compress_s']} s | {rec['aggregate_s']} s | {rec['packet_bytes']:,} B |",
        ]
    )
    (out / "node.md").write_text(table + "\n")
    print(table)
    print(f"\nwrote {out / 'node.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

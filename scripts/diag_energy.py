"""How much of one member's round a low-rank image and the codec's DCT picks hold, per matrix.

On a product model trained by one member (bench_scaling's data, shard and model path), after
`--at` AdamW steps: the share of the energy (squared Frobenius norm) of (a) one batch's
gradient and (b) the pseudo-gradient of the next K AdamW steps (what a member's round folds
into e) that the best rank-1 and rank-2 images hold, and that the top-k coefficients per 64x64
DCT chunk hold (the node's picks before quantisation), as means over the attention and the MLP
matrices. Prints a markdown table; --json appends the rows.

    python scripts/diag_energy.py --model builtin:small --at 0,40,150 --k 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling as bs

from dtrain_node.optim import dct
from dtrain_node.optim.compress import topk


def shares(x: torch.Tensor, k: int) -> tuple[float, float, float]:
    """(rank-1, rank-2, top-k DCT) shares of x's energy."""
    sv = torch.linalg.svdvals(x.double()).pow(2)
    ch = dct.dct(x.float())
    kept = ch.gather(1, topk(ch, k)).pow(2).sum()
    return float(sv[0] / sv.sum()), float(sv[:2].sum() / sv.sum()), float(kept / ch.pow(2).sum())


def kind(name: str) -> str | None:
    return "attention" if "attn" in name else "MLP" if "mlp" in name else None


def measure(c: bs.Ctx, at: list[int], k: int, rounds: int, seed: int) -> list[dict]:
    m = c.subj.fresh(seed)
    it = bs.streams(c.data, 1, c.s.bsz, seed)[0]
    o = torch.optim.AdamW(m.parameters(), lr=c.s.inner_lr, betas=(0.9, 0.95), weight_decay=0.0)
    mats = {n: p for n, p in m.named_parameters() if p.dim() == 2 and kind(n)}
    rows, step = [], 0

    def train() -> None:
        c.subj.loss(m, *c.data.windows(next(it))).backward()
        o.step()
        o.zero_grad(set_to_none=True)

    for t in sorted(at):
        while step < t:
            train()
            step += 1
        start = {n: p.detach().clone() for n, p in mats.items()}
        c.subj.loss(m, *c.data.windows(next(it))).backward()
        grads = {n: p.grad.detach().clone() for n, p in mats.items()}
        o.step()
        o.zero_grad(set_to_none=True)
        for _ in range(rounds - 1):
            train()
        step += rounds
        for what, xs in (("gradient", grads), (f"{rounds}-step AdamW delta", None)):
            for kd in ("attention", "MLP"):
                vals = [
                    shares(xs[n] if xs else start[n] - p.detach(), k)
                    for n, p in mats.items()
                    if kind(n) == kd
                ]
                mean = [sum(v[i] for v in vals) / len(vals) for i in range(3)]
                rows.append(
                    dict(at=t, of=what, kind=kd, rank1=mean[0], rank2=mean[1], topk=mean[2])
                )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:small")
    ap.add_argument("--corpus", default="prose")
    ap.add_argument("--at", default="0,40,150", help="AdamW steps before each measurement")
    ap.add_argument("--k", type=int, default=4, help="DCT picks per 64x64 chunk")
    ap.add_argument("--rounds", type=int, default=2, help="K: AdamW steps in one round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    s = bs.Setup(steps=max(int(x) for x in a.at.split(",")) + a.rounds)
    subj = bs.Subject(a.model, s.ctx)
    c = bs.Ctx(s, subj, *bs.load(a.corpus, s, subj))
    rows = measure(c, [int(x) for x in a.at.split(",")], a.k, a.rounds, a.seed)
    print(f"| step | of | matrices | rank-1 | rank-2 | top-{a.k} per DCT chunk |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['at']} | {r['of']} | {r['kind']} | {r['rank1']:.3f} | {r['rank2']:.3f} "
            f"| {r['topk']:.3f} |"
        )
    if a.json:
        with a.json.open("a") as f:
            for r in rows:
                f.write(json.dumps(dict(r, model=a.model, corpus=a.corpus, seed=a.seed)) + "\n")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())

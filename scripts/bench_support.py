"""Coefficient support of honest packets: how many members send each coefficient.

n honest members train a job's model (builtin:tiny) as `bench_robust.py --shaped` does. Over
the second half of the rounds, for every entry a member transmits: how many members sent the
same coefficient (tensor, chunk, index) in that round, and whether its sign is the sign most
of them sent. A per-coordinate rule that aggregates only what more than f members sent (so
that a coalition under a third can never place a coefficient alone) keeps the share of honest
entries at support >= f + 1 (`RobustConfig.support`).

    python scripts/bench_support.py                  # n = 10 and 16, 80 steps
    python scripts/bench_support.py --sizes 4 --steps 16 --out /tmp/s   # a smoke run

Writes DIR/support.json and DIR/support.md (DIR: docs/bench unless --out is given).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from dtrain_node.optim import codec
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig

# the robust benchmark's setup and corpus (scripts/ is no package)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_robust as br


def round_support(spec: codec.Spec, packets: list[bytes]) -> tuple[torch.Tensor, int, int]:
    """One round: entries per support (index s: sent by s members), entries whose sign is
    their coefficient's majority sign, entries."""
    hist = torch.zeros(len(packets) + 1, dtype=torch.int64)
    agree = total = 0
    decoded = [codec.decode(spec, p) for p in packets]
    for i in range(len(spec.layout)):
        ce = spec.layout[i][1]
        keys = torch.cat(
            [
                (torch.arange(d[i].idx.shape[0])[:, None] * ce + d[i].idx).reshape(-1)
                for d in decoded
            ]
        )
        signs = torch.cat([d[i].lvl.reshape(-1).sign().to(torch.int64) for d in decoded])
        uniq, at, count = keys.unique(return_inverse=True, return_counts=True)
        net = torch.zeros(len(uniq), dtype=torch.int64).index_add_(0, at, signs)
        hist += torch.bincount(count[at], minlength=len(hist))[: len(hist)]
        agree += int((signs * net[at].sign() > 0).sum() + (net[at] == 0).sum() // 2)
        total += len(keys)
    return hist, agree, total


def support(setup: br.Setup, n: int, seed: int = 0) -> dict:
    """Honest training of n members; the support of their entries over the second half."""
    torch.set_num_threads(1)
    train, _ = br.corpus.stdlib_corpus(max_train=setup.max_train)
    shards = br.corpus.shards(train, n)
    gens = [torch.Generator().manual_seed(1000 * seed + w) for w in range(n)]
    torch.manual_seed(seed)
    models = [br.make_model(setup) for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    compress = CompressConfig(k2d=setup.k, k1d=1, bits=setup.bits)
    cfg = DeMoConfig(
        mode="local", sync_interval=setup.K, lr=1.0, inner_lr=setup.inner_lr, compress=compress
    )
    opts = [DeMo(m.named_parameters(), cfg, sender=w) for w, m in enumerate(models)]
    hist, agree, total = torch.zeros(n + 1, dtype=torch.int64), 0, 0
    for t in range(1, setup.steps + 1):
        for w, m in enumerate(models):
            m(*br.corpus.batch(shards[w], setup.bsz, 127, gens[w])).backward()
            opts[w].inner_step()
        if t % setup.K:
            continue
        pk = [(o.sender, o.prepare()) for o in opts]
        if t > setup.steps // 2:
            h, a, e = round_support(opts[0].spec, [p for _, p in pk])
            hist, agree, total = hist + h, agree + a, total + e
        st = opts[0].apply(pk)
        for o in opts[1:]:
            o.apply_aggregate(st.aggregate)
    at_least = {s: round(int(hist[s:].sum()) / total, 3) for s in range(1, n + 1)}
    f = (n - 1) // 3
    return dict(n=n, f=f, entries=total, at_least=at_least, majority_sign=round(agree / total, 3))


def table(rows: list[dict]) -> str:
    out = ["| n | f | support >= 2 | >= 3 | >= f + 1 | all n | sign of the majority |"]
    out.append("|---|---|---|---|---|---|---|")
    for r in rows:
        s, f, n = r["at_least"], r["f"], r["n"]
        cells = [s[2], s[3], s[f + 1], s[n], r["majority_sign"]]
        out.append(f"| {n} | {f} | " + " | ".join(f"{100 * x:.1f}%" for x in cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 16])
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--out", type=Path, default=Path("docs/bench"))
    a = ap.parse_args(argv)
    setup = replace(br.setups(False), uri=a.model, steps=a.steps)
    t0 = time.time()
    rows = [support(setup, n) for n in a.sizes]
    md = (
        f"Model {a.model}; DeMo local K={setup.K}, k={setup.k}, {setup.bits}-bit; {a.steps} "
        f"steps, the second half's rounds; share of honest entries whose coefficient at least "
        f"s members sent; wall {time.time() - t0:.0f}s.\n\n" + table(rows)
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "support.md").write_text(md)
    (a.out / "support.json").write_text(json.dumps(dict(rows=rows), indent=1) + "\n")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

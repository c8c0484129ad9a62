"""Would members that send values at the same DCT coefficients train closer to DDP?

A float simulation (not the exact codec) of two ways N members share their error-feedback
momentum e each sync, on a product model through bench_scaling's data, shards and evaluation:

- own: the node's scheme. Each member sends its own top-k coefficients per chunk (index +
  1-bit level); the shared update is their sum over all members / N, so a coefficient one
  member chose arrives at 1/N of its value, and N members' picks carry about one member's
  worth of signal.
- union: two phases. Each member first publishes its top-k indices per chunk; then every
  member sends 1-bit levels at the union of all members' indices, so each coefficient of the
  update is the mean of N members' values. Upload: k indices + |union| levels per chunk.
- vote: union's two phases, with levels only where at least v members picked (v=V, default
  2): a coefficient one member wants stays in its e. Upload: k indices + |voted| levels.
- lag: union in one message per round: a round's packet carries levels at the union of the
  indices of the round before (known to all from its transcript) and this round's indices,
  chosen after those levels left e. lag0: the same with indices chosen before they left e.
- rand: one message, no indices. Every member sends levels at the same random coefficients
  per chunk, drawn from a seed all members share (the round's); as many as own's index and
  level bits pay for (k (index bits + 1) / level bits per chunk), so each coefficient of the
  update is the mean of N members' values at the bytes of the node's scheme.
- grp: own picks of runs of g neighbouring coefficients (g=G, default 16): one index per run
  and g levels, as many runs per chunk as own's k index + level bits pay for; the k largest
  runs by energy. Chunks narrower than 16 g keep own's single picks.
- lowrank: matrices (not token tensors or vectors) share a rank-r image of e instead of DCT
  picks (r=R, default 1; fb=B bits per factor entry, default 1, 0: unquantised, counted as
  bf16): e lives in weight space for them, one warm-started power iteration per round
  (PowerSGD's), the left factor quantised, the right factor fitted to it then quantised, one
  power-of-two scale per factor column; the N members' images are averaged, so the update has
  rank <= N r. Other tensors as own.
- keep=1 (with own): a member's next round starts from the shared state minus its own unsent
  e (its own progress that did not leave), not from the shared state alone; the shared state
  is what is evaluated.
- paper: the DeMo paper's scheme, every step a sync and no inner optimizer: e = beta e + the
  member's gradient, own picks, theta -= lr sign(the picks' mean) (lr=LR, default 1e-3;
  beta=B, default --beta).
- glob: own's bits spent on picks over each scale group (the whole tensor, or one 64-row block
  of a token tensor) instead of k per chunk: as many picks as own's k index + level bits per
  chunk pay for at the group's wider index, the largest |e| of the group, so a quiet chunk
  sends nothing and a busy one more, at the group's one scale.
- tern=1 (union, vote, rand): a member's level at an entry is -s, 0 or +s (0 where |e| < s / 2,
  log2 3 bits), so at the other members' picks it can send nothing instead of noise.
- every arm: b1=X sets the inner AdamW's beta1 (the recipe's by default).
- own options: cnt=1 averages a coefficient over the members that sent it (not over N);
  olr=X scales the shared update; fbs=1 takes the shared update out of every member's e
  instead of its own picks (DeMoConfig.shared_feedback).
- dense: no compression: every member's whole e (its pseudo-gradient this round, e starts
  empty each round) at bf16's 16 bits per value; what compression costs against it.

Scales are one power-of-two per tensor (per 64-row block for token tensors), as in the codec;
k per kind is the job default for N seats (k, k_token, k1d = 1; kv=K sets the vectors' k).
Prints one JSON line per run.

    python scripts/diag_union.py --workers 4 --steps 300 --arm own --arm union \
        --arm own,k=5 --arm union,kt=40
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scaling as bs

from dtrain_node.optim import dct
from dtrain_node.optim.compress import EXP_MIN, topk
from dtrain_node.optim.optimizer import model_spec
from dtrain_node.optim.segments import token_names

ARMS = ("own", "union", "vote", "lag", "lag0", "rand", "grp", "glob", "dense", "lowrank", "paper")


def scales(v: torch.Tensor, groups: torch.Tensor, ngroups: int) -> torch.Tensor:
    """Per-group 2^round(log2 mean|v|) over the entries in each group (2^EXP_MIN where all are
    zero), per entry: compress.scale_exp for many groups at once."""
    s = torch.zeros(ngroups, dtype=torch.float64).index_add_(0, groups, v.abs().double())
    c = torch.zeros(ngroups, dtype=torch.float64).index_add_(0, groups, torch.ones_like(v).double())
    m = s / c.clamp(min=1)
    e = torch.where(m > 0, torch.round(torch.log2(m.clamp(min=1e-30))), torch.full_like(m, EXP_MIN))
    return torch.exp2(e).float()[groups]


class Tensor:
    """One parameter's chunk layout, k and scale groups."""

    def __init__(
        self, shape: torch.Size, k: int, token: bool, bits: int = 1, tern: int = 0
    ) -> None:
        self.shape, self.k, self.bits = shape, k, bits  # bits: levels at a union (1 or 2)
        self.tern = bool(tern)  # levels -s, 0, +s at a union instead of bits' levels
        self.n = dct.nchunks(shape)
        self.width = dct.chunk_elems(shape)
        v = dct.view2(shape)
        per_row = -(-v[1] // dct.N) if token and len(v) == 2 else self.n  # 64-row blocks
        self.group = torch.arange(self.n) // per_row  # chunk -> scale group
        self.ngroups = int(self.group.max()) + 1

    @property
    def level_bits(self) -> float:
        """Bits of one level at a union: log2(3) for ternary levels, else bits."""
        return math.log2(3) if self.tern else self.bits

    @property
    def own_bits(self) -> int:
        """One member's upload for this tensor under own picks: index + 1-bit level per pick
        and one 8-bit exponent per scale group."""
        return self.n * self.k * (math.ceil(math.log2(self.width)) + 1) + 8 * self.ngroups


def run(c: bs.Ctx, arm: str, ks: dict, n: int, seed: int, beta: float) -> dict:
    base = c.subj.fresh(seed)
    st = bs.streams(c.data, n, c.s.bsz, seed)
    ms = [copy.deepcopy(base) for _ in range(n)]
    cfg = bs.demo_cfg(bs.resolve(bs.Arm("demo"), n), c.s.inner_lr, n)
    spec = model_spec(base, cfg.compress)
    k_mat = ks.get("k", cfg.compress.k2d)
    k_tok = ks.get("kt", spec.cfg.k_token if spec.cfg.k_token > 0 else cfg.compress.k2d)
    toks = set(token_names(base))
    names = [nm for nm, p in base.named_parameters() if p.requires_grad]
    shared = [p.detach().clone() for p in base.parameters() if p.requires_grad]
    lay = []
    for nm, p in zip(names, shared, strict=True):
        vec = len(dct.view2(p.shape)) == 1
        k = ks.get("kv", 1) if vec else (k_tok if nm in toks else k_mat)
        lay.append(Tensor(p.shape, k, nm in toks, ks.get("bits", 1), ks.get("tern", 0)))
    e = [[torch.zeros(t.n, t.width) for t in lay] for _ in range(n)]
    if arm == "lowrank":  # weight-space e and warm-start right factors per member, matrix
        r = ks.get("r", 1)
        gen = torch.Generator().manual_seed(seed)
        for i in range(n):
            for j, (nm, th) in enumerate(zip(names, shared, strict=True)):
                if th.dim() == 2 and nm not in toks:
                    e[i][j] = (torch.zeros_like(th), torch.randn(th.shape[1], r, generator=gen))
    prev: list = [None] * len(lay)  # lag: each tensor's union of the last round's indices
    shared_rng = torch.Generator().manual_seed(seed)  # rand: the seed every member knows
    opts = [
        torch.optim.AdamW(
            m.parameters(),
            lr=c.s.inner_lr,
            betas=(ks.get("b1", cfg.inner_betas[0]), cfg.inner_betas[1]),
            weight_decay=cfg.inner_weight_decay,
        )
        for m in ms
    ]
    curve, bits_sent, syncs, t0 = [(0, bs.evaluate(c.subj, base, c.ev))], 0.0, 0, time.time()
    for t in range(1, c.s.steps + 1):
        for m, o, it in zip(ms, opts, st, strict=True):
            c.subj.loss(m, *c.data.windows(next(it))).backward()
            if arm != "paper":
                o.step()
                o.zero_grad(set_to_none=True)
        if arm == "paper":
            bits_sent += paper(ms, e, shared, lay, ks.get("lr", 1e-3), ks.get("beta", beta))
            syncs += 1
        elif t % cfg.sync_interval == 0:
            bits_sent += sync(ms, e, shared, lay, arm, ks, beta, prev, shared_rng)
            syncs += 1
        if t % c.s.eval_every == 0 or t == c.s.steps:
            curve.append((t, bs.evaluate(c.subj, _at(base, shared), c.ev)))
    return dict(
        arm=arm,
        opts=ks,
        k=k_mat,
        k_token=k_tok,
        bits=ks.get("bits", 1),
        beta=beta,
        n=n,
        seed=seed,
        final=curve[-1][1],
        curve=curve,
        bytes_per_sync=bits_sent / max(syncs, 1) / 8,
        wall_s=round(time.time() - t0),
    )


@torch.no_grad()
def _at(model: torch.nn.Module, shared: list) -> torch.nn.Module:
    """`model` holding the shared state (what a job's checkpoint holds)."""
    for p, th in zip((p for p in model.parameters() if p.requires_grad), shared, strict=True):
        p.copy_(th)
    return model


@torch.no_grad()
def paper(ms, e, shared, lay, lr: float, beta: float) -> float:
    """One step of the DeMo paper's scheme: e = beta e + the member's gradient (DCT), own
    picks, theta -= lr sign(mean of the picks); returns the bits one member uploads."""
    params = [[x for x in m.parameters() if x.requires_grad] for m in ms]
    bits = 0.0
    for j, (th, t) in enumerate(zip(shared, lay, strict=True)):
        agg = torch.zeros(t.n, t.width)
        bits += t.own_bits
        for i, ps in enumerate(params):
            e[i][j].mul_(beta).add_(dct.dct(ps[j].grad.float()))
            _send_own(e[i][j], t, agg)
        th.sub_(lr * torch.sign(dct.idct(agg / len(ms), th.shape)))
    for ps in params:
        for p, th in zip(ps, shared, strict=True):
            p.copy_(th)
            p.grad = None
    return bits


@torch.no_grad()
def sync(ms, e, shared, lay, arm: str, ks: dict, beta: float, prev: list, rng) -> float:
    """One round; returns the bits one member uploads (indices + levels + exponents)."""
    n, bits = len(ms), 0.0
    params = [[x for x in m.parameters() if x.requires_grad] for m in ms]
    for j, (th, t) in enumerate(zip(shared, lay, strict=True)):
        es = [e[i][j] for i in range(n)]
        if isinstance(es[0], tuple):
            bits += _lowrank(es, th, [ps[j] for ps in params], ks, beta)
            continue
        for ei, ps in zip(es, params, strict=True):
            # keep: the member started at th - idct(e), so its round moved it dct(th - p) - e
            ei.mul_(beta - ks.get("keep", 0)).add_(dct.dct((th - ps[j].detach()).float()))
        agg = torch.zeros(t.n, t.width)
        ib = math.ceil(math.log2(t.width))
        cnt = torch.zeros(t.n, t.width) if ks.get("cnt") else None
        if arm == "own":
            bits += t.own_bits
            before = [ei.clone() for ei in es] if ks.get("fbs") else None
            for ei in es:
                _send_own(ei, t, agg, cnt)
        elif arm == "glob":
            sent = [_send_glob(ei, t, agg) for ei in es]  # every member sends as many bits
            bits += sent[0]
        elif arm == "dense":
            bits += 16 * th.numel()
            for ei in es:
                agg.add_(ei)
                ei.zero_()
        elif arm == "grp":
            g = ks.get("g", 16)
            g = g if t.width >= 16 * g else 1
            per_run = ib - int(math.log2(g)) + g  # index bits of a run + its levels
            runs = min(t.width // g, t.k * (ib + 1) // per_run)
            bits += t.n * runs * per_run + 8 * t.ngroups
            for ei in es:
                _send_runs(ei, t, agg, g, runs)
        elif arm == "vote":
            at = voted([topk(ei, t.k) for ei in es], t, ks.get("v", 2))
            bits += t.n * t.k * ib + 8 * t.ngroups + t.level_bits * len(at[0])
            for ei in es:
                _send_at(ei, t, at, agg)
        elif arm == "rand":
            at = drawn(t, rng)
            bits += t.level_bits * len(at[0]) + 8 * t.ngroups
            for ei in es:
                _send_at(ei, t, at, agg)
        else:
            picks = union([topk(ei, t.k) for ei in es], t) if arm != "lag" else None
            at = picks if arm == "union" else prev[j]
            bits += t.n * t.k * ib + 8 * t.ngroups + (t.level_bits * len(at[0]) if at else 0)
            for ei in es if at else ():
                _send_at(ei, t, at, agg)
            if arm != "union":  # the lag arms keep this round's union for the next
                prev[j] = picks if arm == "lag0" else union([topk(ei, t.k) for ei in es], t)
        div = cnt.clamp(min=1) if cnt is not None else n  # cnt: the mean over who sent it
        upd = ks.get("olr", 1.0) * agg / div
        if arm == "own" and before:  # fbs: what the shared state moved leaves every e
            for ei, b in zip(es, before, strict=True):
                ei.copy_(b - upd)
        th.sub_(dct.idct(upd, th.shape))
    for i, ps in enumerate(params):
        for j, (p, th) in enumerate(zip(ps, shared, strict=True)):
            keep = ks.get("keep", 0) and not isinstance(e[i][j], tuple)
            p.copy_(th - dct.idct(e[i][j], th.shape) if keep else th)
    return bits


def _q(v: torch.Tensor, fb: int) -> torch.Tensor:
    """Per column: 1-bit sign at one power-of-two scale, or fb-bit levels (odd multiples of
    half the scale, as the codec's 2-bit levels)."""
    if fb == 0:  # not quantised (counted at bf16's 16 bits)
        return v
    s = torch.exp2(torch.round(torch.log2(v.abs().mean(0, keepdim=True).clamp(min=1e-30))))
    return _levels(v, s, fb)


def _levels(v: torch.Tensor, s: torch.Tensor, bits: int) -> torch.Tensor:
    """v at scale s: sign * s at 1 bit, else odd multiples of s / 2 up to 2^bits - 1 (the
    codec's 2-bit levels +-1, +-3 at bits = 2)."""
    if bits == 1:
        return torch.sign(v) * s
    top = 2**bits - 1
    return (2 * torch.floor(v / s) + 1).clamp(-top, top) * (s / 2)


def _lowrank(es: list, th: torch.Tensor, ps: list, ks: dict, beta: float) -> float:
    """Members' rank-r images of e (weight space) averaged into th; returns bits per member."""
    r, fb = ks.get("r", 1), ks.get("fb", 1)
    agg = torch.zeros_like(th)
    for (ew, qw), p in zip(es, ps, strict=True):
        ew.mul_(beta).add_(th - p.detach().float())
        a = torch.linalg.qr(ew @ qw).Q  # one power iteration from last round's right factor
        aq = _q(a, fb)
        b = ew.T @ aq @ torch.linalg.pinv(aq.T @ aq)  # the right factor for the sent left one
        qw.copy_(b)
        img = aq @ _q(b, fb).T
        ew.sub_(img)
        agg.add_(img)
    th.sub_(agg / len(es))
    return r * (th.shape[0] + th.shape[1]) * (fb or 16) + 2 * r * 8


def _send_own(ei: torch.Tensor, t: Tensor, agg: torch.Tensor, cnt=None) -> None:
    _send_runs(ei, t, agg, 1, t.k, cnt)  # own picks are runs of one coefficient


def _send_runs(ei, t: Tensor, agg: torch.Tensor, g: int, runs: int, cnt=None) -> None:
    """Send the `runs` runs of g neighbouring coefficients with the most energy, 1-bit each."""
    er, ar = ei.view(t.n, -1, g), agg.view(t.n, -1, g)
    idx = topk(er.pow(2).sum(2), runs).unsqueeze(2).expand(-1, -1, g)
    v = er.gather(1, idx)
    grp = t.group.view(-1, 1, 1).expand_as(v).reshape(-1)
    q = (torch.sign(v).reshape(-1) * scales(v.reshape(-1), grp, t.ngroups)).view_as(v)
    er.scatter_add_(1, idx, -q)
    ar.scatter_add_(1, idx, q)
    if cnt is not None:  # how many members sent each coefficient
        cnt.view(t.n, -1, g).scatter_add_(1, idx, torch.ones_like(q))


def _send_glob(ei: torch.Tensor, t: Tensor, agg: torch.Tensor) -> float:
    """Per scale group the largest |e| over all its chunks, 1-bit at the group's scale, as
    many as own's bits for those chunks pay for; returns the bits sent."""
    ib, bits = math.ceil(math.log2(t.width)), 0.0
    for g in range(t.ngroups):
        rows = (t.group == g).nonzero().squeeze(1)
        wide = math.ceil(math.log2(len(rows) * t.width))
        m = min(len(rows) * t.width, len(rows) * t.k * (ib + 1) // (wide + 1))
        eg = ei[rows].reshape(-1)
        idx = eg.abs().topk(m).indices
        v = eg[idx]
        q = torch.sign(v) * scales(v, torch.zeros_like(idx), 1)  # the group's one scale
        flat = ei.view(-1)
        at = rows[idx // t.width] * t.width + idx % t.width
        flat.index_add_(0, at, -q)
        agg.view(-1).index_add_(0, at, q)
        bits += m * (wide + 1) + 8
    return bits


def _send_at(ei: torch.Tensor, t: Tensor, at: tuple, agg: torch.Tensor) -> None:
    rows, cols = at
    v = ei[rows, cols]
    s = scales(v, t.group[rows], t.ngroups)
    # 2 bits: +-1, +-3 at half the scale, as the codec's 2-bit levels; ternary: 0 below s / 2
    q = (v / s).round().clamp(-1, 1) * s if t.tern else _levels(v, s, t.bits)
    ei[rows, cols] -= q
    agg[rows, cols] += q


def drawn(t: Tensor, rng: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk, coefficient) of m shared random coefficients per chunk, m paid for by own's
    k index + level bits at t.level_bits per level."""
    m = min(t.width, int(t.k * (math.ceil(math.log2(t.width)) + 1) // t.level_bits))
    idx = torch.rand(t.n, t.width, generator=rng).topk(m, dim=1).indices.sort(dim=1).values
    return torch.arange(t.n).repeat_interleave(m), idx.reshape(-1)


def union(picks: list[torch.Tensor], t: Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk, coefficient) of every index any member picked, each once."""
    return voted(picks, t, 1)


def voted(picks: list[torch.Tensor], t: Tensor, v: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(chunk, coefficient) of every index at least v members picked, each once."""
    cnt = torch.zeros(t.n, t.width)
    for idx in picks:
        cnt.scatter_add_(1, idx, torch.ones(idx.shape))
    return (cnt >= v).nonzero(as_tuple=True)


def parse_arm(spec: str) -> tuple[str, dict]:
    """'own,k=5,olr=2' -> ('own', {'k': 5, 'olr': 2.0}); a bad spec exits with one line."""
    arm, *kv = spec.split(",")
    if arm not in ARMS:
        raise SystemExit(f"--arm {spec!r}: one of {', '.join(ARMS)}")
    try:
        ks = {
            k: float(v) if k in ("lr", "beta", "olr", "b1") else int(v)
            for k, v in (x.split("=") for x in kv)
        }
    except ValueError:
        raise SystemExit(f"--arm {spec!r}: options are key=number, e.g. own,k=5") from None
    if not 0 <= ks.get("b1", 0) < 1:
        raise SystemExit(f"--arm {spec!r}: b1 is the inner AdamW's beta1, in [0, 1)")
    return arm, ks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin:small")
    ap.add_argument("--corpus", default="prose")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--beta", type=float, default=bs.RECIPE.outer_momentum)
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        help="|".join(ARMS) + ", then ,k=K (matrices) ,kt=K "
        "(token tensors) ,kv=K (vectors) ,bits=B ,g=G ,r=R ,fb=B ,lr=LR ,beta=B (paper) "
        ",olr=X (outer lr) ,b1=X (inner AdamW beta1) "
        ",cnt=1 (own: mean over the members that sent a coefficient) "
        ",fbs=1 (own: the shared update leaves every member's e, not its own picks) "
        ",v=V (vote: levels where at least V members picked) "
        ",tern=1 (union, vote, rand: levels -s, 0, +s)",
    )
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    arms = [parse_arm(spec) for spec in a.arm or ["own", "union"]]  # all checked before a run
    s = bs.Setup(steps=a.steps)
    subj = bs.Subject(a.model, s.ctx)
    c = bs.Ctx(s, subj, *bs.load(a.corpus, s, subj))
    for arm, ks in arms:
        r = run(c, arm, ks, a.workers, a.seed, a.beta)
        r.update(model=a.model, corpus=a.corpus)
        line = json.dumps({k: v for k, v in r.items() if k != "curve"})
        print(line, flush=True)
        if a.out:
            with a.out.open("a") as f:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)  # one core per run, as bench_scaling runs
    sys.exit(main())

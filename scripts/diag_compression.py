"""Per-tensor diagnostic of DeMo compression on the product's models (issue 29).

The product's model path (`builtin:tiny` / `builtin:small`, built by train.start.start_model as
a node builds them) trained by N members simulated in one process with the node's own job
defaults: local mode, K=2 inner AdamW steps per sync (lr 2e-3, betas 0.9/0.95), k=4 per 64x64
chunk (k1d=1 per 64-vector), 1-bit levels, the recipe's error-feedback decay, outer lr 1.0,
the robust screen on (dtrain.models.default_topk, Recipe, NodeConfig). Every member trains its
own shard (train/shard.py, as bench_scaling.py deals them); held-out loss on fixed windows.

Per sync and tensor (the default arm) it records:
- keep: the fraction of the error-feedback momentum's energy the top-k keeps, per chunk
  (sum of the k largest squared DCT coefficients / the chunk's sum), mean over chunks;
- capture: 1 - |e after| ^ 2 / |e before| ^ 2 of the take (what the 1-bit values with one
  power-of-two scale per tensor actually remove; negative when they overshoot);
- the norm of the error feedback e over time;
- the aggregated update U (the exact shared step) against the exact dense mean D of the
  members' pseudo-gradients (theta_sync - theta_local): per-sync relative error |U - D| / |D|,
  and over the whole run the ratio |sum U| / |sum D| and cos(sum U, sum D).

Counterfactual arms sync some tensor kinds dense (their exact mean pseudo-gradient, outer lr
1.0: model averaging) and compress the rest with the defaults; a dense tensor costs its bf16
bytes per member and sync. `ddp` is the exact-mean AdamW reference, `dense=all` the same local
loop without any compression.

    python scripts/diag_compression.py --model builtin:tiny --steps 200 --seeds 0,1 \\
        --json docs/bench/diag_compression_tiny.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F

from dtrain.models import default_topk
from dtrain.recipe import Recipe
from dtrain_node.optim import codec
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.optim.robust import RobustConfig
from dtrain_node.optim.segments import ring_upload, token_names, views
from dtrain_node.train import shard
from dtrain_node.train.corpus import TextData
from dtrain_node.train.start import start_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import bench_corpus, prose_corpus

KINDS = ("embedding", "head", "norm", "bias", "attention", "mlp", "other")
CORPORA = {"code": bench_corpus.stdlib_corpus, "prose": prose_corpus.prose_corpus}


@dataclass(frozen=True)
class Arm:
    """dense: tensor kinds synced dense (exact mean); the others through DeMo with these
    settings. kind "ddp" is the exact-mean AdamW baseline."""

    name: str
    kind: str = "demo"  # demo | ddp
    dense: tuple[str, ...] = ()
    K: int = 2
    k: int = 4
    k1d: int = 1
    bits: int = 1
    beta: float = Recipe().outer_momentum  # the job default (0.95 before 0.8)
    lr: float = 1.0
    sign: bool = False
    chunk: int = 64
    k_by_kind: tuple[tuple[str, int], ...] = ()  # (kind, k) overrides
    split: tuple[str, ...] = ()  # kinds whose matrices get one scale per chunk (split_blocks)
    rows: tuple[str, ...] = ()  # kinds whose matrices are synced row by row (split_blocks)
    robust: bool = True  # the robust screen (off: every packet aggregated)
    pcm: bool = False  # per-coefficient mean: divide by the members that sent a coefficient
    k_token: int = 0  # the product's token-tensor k (CompressConfig.k_token; 0: k)
    token_rows: int = 0  # the product's rows per token-tensor scale block (0: per tensor)


@dataclass(frozen=True)
class Setup:
    model: str = "builtin:tiny"
    members: int = 4
    bsz: int = 8  # Recipe.batch_size
    steps: int = 200
    inner_lr: float = 2e-3  # Recipe.inner_lr
    corpus: str = "prose"
    eval_windows: int = 128
    max_train: int = 2_000_000
    arms: tuple[Arm, ...] = field(default=())


def default_arms(n: int) -> tuple[Arm, ...]:
    d = Arm("demo (job default)", k=default_topk(n))
    big = (("embedding", 16), ("head", 16))
    return (
        Arm("ddp", kind="ddp"),
        d,
        replace(d, name="dense=norm", dense=("norm", "bias")),
        replace(d, name="dense=embedding", dense=("embedding",)),
        replace(d, name="dense=head", dense=("head",)),
        replace(d, name="dense=norm+embedding+head", dense=("norm", "bias", "embedding", "head")),
        replace(d, name="dense=attention", dense=("attention",)),
        replace(d, name="dense=mlp", dense=("mlp",)),
        replace(d, name="dense=all", dense=KINDS),
        replace(d, name="k=16 embedding+head", k_by_kind=big),
        replace(d, name="k=64 embedding+head", k_by_kind=(("embedding", 64), ("head", 64))),
        replace(
            d,
            name="k=64 + scale per chunk embedding+head",
            k_by_kind=(("embedding", 64), ("head", 64)),
            split=("embedding", "head"),
        ),
        replace(
            d,
            name="per-row chunks embedding+head k1d=1",
            rows=("embedding", "head"),
            robust=False,  # the per-tensor norm rule excludes members that left a row untouched
        ),
        replace(
            d,
            name="per-row chunks embedding+head k1d=2",
            rows=("embedding", "head"),
            robust=False,
            k_by_kind=(("embedding", 2), ("head", 2)),
        ),
        replace(d, name="k=16 all", k=16),
        replace(d, name="scale per chunk embedding+head", split=("embedding", "head")),
        replace(d, name="scale per chunk all", split=("embedding", "head", "attention", "mlp")),
        replace(d, name="sign outer lr=2e-3", sign=True, lr=2e-3),
    )


def custom_arm(text: str, n: int) -> Arm:
    """The job default arm with `key=value` overrides separated by ';': K, k, k1d, bits,
    beta, lr, chunk, k_token, token_rows (numbers), sign, robust, pcm (0/1), dense, split, rows
    (kinds joined by "+"),
    and `k=VALUE:KIND+KIND` for a per-kind k."""
    d, kw = Arm(text, k=default_topk(n)), {}
    for item in filter(None, text.split(";")):
        key, _, val = item.partition("=")
        if key == "k" and ":" in val:
            kv, kinds = val.split(":")
            kw["k_by_kind"] = tuple((kind, int(kv)) for kind in kinds.split("+"))
        elif key in ("dense", "split", "rows"):
            kw[key] = tuple(val.split("+"))
        elif key in ("sign", "robust", "pcm"):
            kw[key] = bool(int(val))
        elif key in ("beta", "lr"):
            kw[key] = float(val)
        elif key in ("K", "k", "k1d", "bits", "chunk", "k_token", "token_rows"):
            kw[key] = int(val)
        else:
            raise SystemExit(f"--arm: unknown override {item!r}")
    return replace(d, **kw)


# ---------------------------------------------------------------------------- pure functions


def tensor_kind(name: str, shape: tuple[int, ...]) -> str:
    """The kind of a named parameter of a causal LM (Llama / GPT-2 style names)."""
    n = name.lower()
    if len(shape) <= 1:
        return "norm" if ("norm" in n or "ln_" in n) else "bias"
    if "embed" in n or n.endswith(("wte.weight", "wpe.weight")):
        return "embedding"
    if "lm_head" in n or n.endswith("head.weight"):
        return "head"
    if any(s in n for s in ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj")):
        return "attention"
    if any(s in n for s in ("mlp", "gate_proj", "up_proj", "down_proj", "c_fc")):
        return "mlp"
    return "other"


def energy_kept(coef: torch.Tensor, k: int) -> float:
    """Mean over chunks (rows of coef) of the fraction of the chunk's energy in its k largest
    coefficients; chunks without energy are left out (1.0 if none has any)."""
    e = coef.double().pow(2)
    total = e.sum(1)
    top = torch.topk(e, min(k, e.shape[1]), dim=1).values.sum(1)
    live = total > 0
    if not bool(live.any()):
        return 1.0
    return float((top[live] / total[live]).mean())


def weak_chunks(coef: torch.Tensor, below: float = 0.01) -> float:
    """Fraction of chunks holding less than `below` x the mean chunk energy: with one scale
    per tensor, their k 1-bit values are sent at the strong chunks' magnitude."""
    e = coef.double().pow(2).sum(1)
    m = float(e.mean())
    return float((e < below * m).double().mean()) if m > 0 else 0.0


def rel_error(u: torch.Tensor, ref: torch.Tensor) -> float:
    """|u - ref| / |ref| (inf when ref is 0 and u is not, 0 when both are)."""
    d, r = float((u - ref).double().norm()), float(ref.double().norm())
    if r == 0.0:
        return 0.0 if d == 0.0 else math.inf
    return d / r


def cosine(u: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = u.double().flatten(), ref.double().flatten()
    den = float(a.norm() * b.norm())
    return float(a @ b) / den if den > 0 else 0.0


def growth(series: list[float]) -> float:
    """Mean of the last quarter over the mean of the first quarter of a series."""
    q = max(1, len(series) // 4)
    first, last = statistics.mean(series[:q]), statistics.mean(series[-q:])
    return last / first if first > 0 else math.inf


# ---------------------------------------------------------------------------- data, model


def members(n: int) -> list[str]:
    return [f"0x{i + 1:040x}" for i in range(n)]


def streams(data: TextData, n: int, bsz: int, seed: int) -> list:
    """Each member's window-index batches over its shard, dealt the way the node deals them."""
    ms = members(n)
    return [
        (
            b
            for b, _ in shard.batch_indices(
                shard.assign(data.n_windows, 1000 + seed, 0, ms, me), bsz, seed
            )
        )
        for me in ms
    ]


def lm_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())


@torch.no_grad()
def evaluate(model: torch.nn.Module, ev: tuple[torch.Tensor, torch.Tensor]) -> float:
    model.eval()
    tot = 0.0
    for i in range(0, len(ev[0]), 32):
        x, y = ev[0][i : i + 32], ev[1][i : i + 32]
        tot += float(lm_loss(model, x, y)) * len(x)
    model.train()
    return tot / len(ev[0])


def load(s: Setup, ctx: int) -> tuple[TextData, tuple[torch.Tensor, torch.Tensor]]:
    train, held = CORPORA[s.corpus](max_train=s.max_train)
    start = start_model(s.model)
    if not getattr(start, "byte_level", False):  # a model folder: its own tokenizer
        tok = start.tokenizer
        train, held = (
            torch.tensor(tok(bytes(t.tolist()).decode("utf-8", "replace"))["input_ids"])
            for t in (train, held)
        )
    return TextData(train, held, ctx), bench_corpus.eval_windows(held, s.eval_windows, ctx)


def model_uri(model: str, seed: int) -> str:
    """A builtin model's URI with its init seed; a folder's weights are its own."""
    return f"{model}?seed={seed}" if model.startswith("builtin:") else model


# ---------------------------------------------------------------------------- simulation


class Probe:
    """Per-tensor records of the compressed tensors over the syncs of one run."""

    def __init__(self, names: list[str], shapes: list[tuple[int, ...]], cfg: CompressConfig):
        self.names, self.shapes, self.cfg = names, shapes, cfg
        self.rows: list[dict] = [
            dict(keep=[], weak=[], capture=[], e_norm=[], d_norm=[], rel=[]) for _ in names
        ]
        self.sum_u = [torch.zeros(s, dtype=torch.float64) for s in shapes]
        self.sum_d = [torch.zeros(s, dtype=torch.float64) for s in shapes]

    def before(self, opts: list[DeMo]) -> list[list[float]]:
        """After the fold: energy kept per tensor (mean over members); returns |e|^2 per
        member and tensor."""
        e2 = []
        for i, r in enumerate(self.rows):
            k = self.cfg.k(self.shapes[i])
            cs = [o.feedback.coefficients(i) for o in opts]
            r["keep"].append(statistics.mean(energy_kept(c, k) for c in cs))
            r["weak"].append(statistics.mean(weak_chunks(c) for c in cs))
            e2.append([float(c.double().pow(2).sum()) for c in cs])
        return e2

    def after(self, opts: list[DeMo], e2: list[list[float]]) -> None:
        """After the take: the capture of the 1-bit values and the norm of e left."""
        for i, r in enumerate(self.rows):
            left = [float(o.feedback.coefficients(i).double().pow(2).sum()) for o in opts]
            cap = [1 - a / b for a, b in zip(left, e2[i], strict=True) if b > 0]
            r["capture"].append(statistics.mean(cap) if cap else 1.0)
            r["e_norm"].append(statistics.mean(math.sqrt(a) for a in left))

    def step(self, i: int, u: torch.Tensor, d: torch.Tensor) -> None:
        """The shared step u of tensor i against the exact dense mean pseudo-gradient d."""
        r = self.rows[i]
        r["rel"].append(rel_error(u, d))
        r["d_norm"].append(float(d.double().norm()))
        self.sum_u[i] += u.double()
        self.sum_d[i] += d.double()

    def table(self, k_of) -> list[dict]:
        out = []
        for i, (name, shape) in enumerate(zip(self.names, self.shapes, strict=True)):
            r, numel = self.rows[i], math.prod(shape)
            out.append(
                dict(
                    tensor=name,
                    kind=tensor_kind(name, shape),
                    shape=list(shape),
                    numel=numel,
                    chunks=k_of(shape)[0],
                    k=k_of(shape)[1],
                    density=k_of(shape)[2],
                    keep=statistics.mean(r["keep"]),
                    weak_chunks=statistics.mean(r["weak"]),
                    capture=statistics.mean(r["capture"]),
                    rel_err_per_sync=statistics.mean(r["rel"]),
                    delivered=rel_ratio(self.sum_u[i], self.sum_d[i]),
                    cum_cos=cosine(self.sum_u[i], self.sum_d[i]),
                    cum_rel_err=rel_error(self.sum_u[i], self.sum_d[i]),
                    ef_growth=growth(r["e_norm"]),
                    ef_over_delta=statistics.mean(r["e_norm"][-5:])
                    / statistics.mean(r["d_norm"][-5:]),
                    ef_norm=subsample(r["e_norm"]),
                )
            )
        return out


def rel_ratio(u: torch.Tensor, ref: torch.Tensor) -> float:
    r = float(ref.double().norm())
    return float(u.double().norm()) / r if r > 0 else math.inf


def subsample(xs: list[float], n: int = 20) -> list[float]:
    step = max(1, len(xs) // n)
    return [round(x, 6) for x in xs[::step]]


def chunk_info(cfg: CompressConfig):
    """shape -> (chunks, k per chunk, density) under cfg."""
    from dtrain_node.optim import dct

    def of(shape):
        k, ce = cfg.k(shape), dct.chunk_elems(shape, cfg.chunk)
        return dct.nchunks(shape, cfg.chunk), k, min(k, ce) / ce

    return of


def split_blocks(named: list, arm: Arm) -> list[tuple[str, torch.Tensor]]:
    """Matrices of the kinds in arm.split cut into chunk x chunk blocks, and of the kinds in
    arm.rows into rows, each a tensor of its own (a leaf sharing the parameter's storage):
    DeMo then gives every block (row) its own scale exponent, and a row is chunked along the
    hidden dimension only (1-D chunks, k1d each). Other tensors pass through."""
    out, n = [], arm.chunk
    for name, p in named:
        kind = tensor_kind(name, tuple(p.shape))
        if p.dim() != 2 or kind not in (*arm.split, *arm.rows):
            out.append((name, p))
            continue
        R, C = p.shape
        if kind in arm.rows:
            out += [(f"{name}[{r}]", p.detach()[r].requires_grad_(True)) for r in range(R)]
            continue
        for r in range(0, R, n):
            for c in range(0, C, n):
                v = p.detach()[r : r + n, c : c + n].requires_grad_(True)
                out.append((f"{name}[{r}:{r + n},{c}:{c + n}]", v))
    return out


def compress_groups(arm: Arm, named: list, members: int) -> dict[CompressConfig, set[str]]:
    """The compressed tensors' names grouped by their CompressConfig: the arm's k / k1d, or
    the arm's per-kind k (k2d for matrices, k1d for vectors) for the kinds in k_by_kind."""
    by = dict(arm.k_by_kind)
    out: dict[CompressConfig, set[str]] = {}
    for n, p in named:
        # a block or row keeps its parameter's kind
        kind = tensor_kind(n.split("[")[0], (2, 2) if "[" in n else tuple(p.shape))
        k2d, k1d = arm.k, arm.k1d
        if kind in by:
            k2d, k1d = (by[kind], k1d) if p.dim() >= 2 else (k2d, by[kind])
        cc = CompressConfig(
            chunk=arm.chunk,
            k2d=k2d,
            k1d=k1d,
            bits=arm.bits,
            k_token=arm.k_token,
            token_rows=arm.token_rows,
            ring=max(2, members),
        )
        out.setdefault(cc, set()).add(n)
    return out


class Sim:
    """N members of one arm: every member's inner AdamW over all its parameters; at each sync
    the dense kinds are averaged exactly and the others go through DeMo (prepare's fold and
    take, the robust screen, exact aggregation, the outer step), probed when `probe` is set."""

    def __init__(self, s: Setup, arm: Arm, base: torch.nn.Module, probe: bool):
        self.s, self.arm, self.ms = s, arm, members(s.members)
        self.models = [copy.deepcopy(base) for _ in self.ms]
        self.inner = [
            torch.optim.AdamW(m.parameters(), lr=s.inner_lr, betas=(0.9, 0.95), weight_decay=0.0)
            for m in self.models
        ]
        named = list(base.named_parameters())
        dense = [i for i, (n, p) in enumerate(named) if tensor_kind(n, p.shape) in arm.dense]
        self.dense = dense
        self.dense_numel = sum(named[i][1].numel() for i in dense)
        self.theta = [named[i][1].detach().clone() for i in dense]
        self.cfgs, self.groups = [], []
        skip = {named[i][0] for i in dense}
        comp = [
            split_blocks([x for x in m.named_parameters() if x[0] not in skip], arm)
            for m in self.models
        ]
        for cc, names in compress_groups(arm, comp[0], self.s.members).items():
            cfg = DeMoConfig(
                mode="local",
                sync_interval=arm.K,
                lr=arm.lr,
                beta=arm.beta,
                sign=arm.sign,
                inner_lr=s.inner_lr,
                compress=cc,
                robust=RobustConfig(enabled=arm.robust),
                per_coefficient_mean=arm.pcm,
            )
            self.cfgs.append(cfg)
            toks = [n for n in token_names(base) if n in names]
            self.groups.append(
                [
                    DeMo([(n, p) for n, p in c if n in names], cfg, sender=a, tokens=toks)
                    for c, a in zip(comp, self.ms, strict=True)
                ]
            )
        o = self.groups[0][0] if len(self.groups) == 1 and probe else None
        self.probe = Probe(list(o.names), list(o.spec.shapes), o.cfg.compress) if o else None
        self.packet_bytes = sum(g[0].spec.packet_bytes for g in self.groups)
        self.excluded = 0

    def inner_step(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        tot = 0.0
        for m, opt, (x, y) in zip(self.models, self.inner, batches, strict=True):
            loss = lm_loss(m, x, y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            tot += float(loss.detach())
        return tot / len(self.models)

    @torch.no_grad()
    def sync(self) -> None:
        ps = [list(m.parameters()) for m in self.models]
        for j, i in enumerate(self.dense):  # exact mean of the pseudo-gradients, outer lr
            d = torch.stack([self.theta[j] - p[i].detach() for p in ps]).mean(0)
            self.theta[j] -= d  # outer lr 1.0: model averaging
            for p in ps:
                p[i].copy_(self.theta[j])
        for opts, cfg in zip(self.groups, self.cfgs, strict=True):
            self._sync_demo(opts, cfg)

    def _sync_demo(self, opts: list[DeMo], c: DeMoConfig) -> None:
        """DeMo.prepare's fold and take (probed in between), then apply as bench_scaling does:
        one aggregate, computed once, applied by every member."""
        pr = self.probe
        locs = [[p.detach().cpu() for p in o.params] for o in opts]
        d_mean = None
        if pr is not None:
            d_mean = [
                torch.stack([o.theta_sync[i] - loc[i] for o, loc in zip(opts, locs, strict=True)])
                .double()
                .mean(0)
                for i in range(len(opts[0].params))
            ]
        for o, loc in zip(opts, locs, strict=True):
            o.feedback.fold(c.beta, views(o.theta_sync, o.segs), views(loc, o.segs))
        e2 = pr.before(opts) if pr is not None else None
        packets = [(o.sender, codec.encode(o.spec, o.feedback.take())) for o in opts]
        if pr is not None:
            pr.after(opts, e2)
        st = opts[0].apply(packets)
        if st.aggregate is None or st.rejected:
            raise RuntimeError(f"honest packets dropped: {st.rejected} {st.excluded}")
        self.excluded += len(st.excluded)
        for o in opts[1:]:
            o.apply_aggregate(st.aggregate)
        if pr is not None:
            for i in range(len(opts[0].params)):
                u = st.aggregate.update(i, c.lr, c.sign, torch.float64)
                pr.step(i, u, d_mean[i])


def run(s: Setup, data: TextData, ev, arm: Arm, seed: int) -> dict:
    """Train one arm with one seed: held-out curve, bytes, and the probe's table (default
    arm)."""
    torch.manual_seed(seed)
    start = start_model(model_uri(s.model, seed))
    base = start.fresh().train()
    P = sum(p.numel() for p in base.parameters())
    st = streams(data, s.members, s.bsz, seed)
    curve = [(0, evaluate(base, ev))]
    every = max(arm.K, s.steps // 4 // arm.K * arm.K)
    t0 = time.perf_counter()
    if arm.kind == "ddp":
        _ddp(s, data, ev, base, st, curve)
        rec = dict(payload_bytes=None, dense_numel=P, excluded=0)
    else:
        sim = Sim(s, arm, base, probe=not arm.dense and arm.name.startswith("demo"))
        for t in range(1, s.steps + 1):
            sim.inner_step([data.windows(next(it)) for it in st])
            if t % arm.K == 0:
                sim.sync()
            if t % every == 0 or t == s.steps:
                curve.append((t, evaluate(sim.models[0], ev)))
        payload = sim.packet_bytes + 2 * sim.dense_numel
        rec = dict(payload_bytes=payload, dense_numel=sim.dense_numel, excluded=sim.excluded)
        if sim.probe is not None:
            rec["tensors"] = sim.probe.table(chunk_info(sim.probe.cfg))
            rec["kinds"] = kind_summary(sim.probe)
    return dict(
        arm=arm.name,
        seed=seed,
        params=P,
        curve=curve,
        final=curve[-1][1],
        wall_s=round(time.perf_counter() - t0, 1),
        **rec,
    )


def _ddp(s: Setup, data: TextData, ev, model, st, curve) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=s.inner_lr, betas=(0.9, 0.95), weight_decay=0)
    every = max(1, s.steps // 4)
    for t in range(1, s.steps + 1):
        opt.zero_grad(set_to_none=True)
        for it in st:  # exact mean of the members' gradients
            (lm_loss(model, *data.windows(next(it))) / len(st)).backward()
        opt.step()
        if t % every == 0 or t == s.steps:
            curve.append((t, evaluate(model, ev)))


def kind_summary(pr: Probe) -> dict:
    """Per kind, over its tensors together: delivered |sum U| / |sum D|, cos, numel."""
    out = {}
    for kind in KINDS:
        ix = [
            i
            for i, (n, sh) in enumerate(zip(pr.names, pr.shapes, strict=True))
            if tensor_kind(n, sh) == kind
        ]
        if not ix:
            continue
        u = torch.cat([pr.sum_u[i].flatten() for i in ix])
        d = torch.cat([pr.sum_d[i].flatten() for i in ix])
        out[kind] = dict(
            tensors=len(ix),
            numel=int(d.numel()),
            delivered=rel_ratio(u, d),
            cum_cos=cosine(u, d),
            cum_rel_err=rel_error(u, d),
            keep=statistics.mean(statistics.mean(pr.rows[i]["keep"]) for i in ix),
        )
    return out


# ---------------------------------------------------------------------------- report

NUMERIC = (
    "keep",
    "capture",
    "rel_err_per_sync",
    "delivered",
    "cum_cos",
    "cum_rel_err",
    "ef_growth",
    "ef_over_delta",
)


def summarize(s: Setup, runs: list[dict]) -> dict:
    """Per arm: loss over seeds, gap to DDP, payload and its ratio to the bf16 ring; the probe's
    per-tensor and per-kind numbers averaged over seeds."""
    P = runs[0]["params"]
    ring = ring_upload(P, s.members)
    by = {a.name: [r for r in runs if r["arm"] == a.name] for a in s.arms}
    ddp = statistics.mean(r["final"] for r in by["ddp"]) if by.get("ddp") else None
    arms = []
    for a in s.arms:
        rs = by[a.name]
        if not rs:
            continue
        f = [r["final"] for r in rs]
        mean = statistics.mean(f)
        pay = rs[0]["payload_bytes"]
        arms.append(
            dict(
                arm=a.name,
                dense_kinds=list(a.dense),
                seeds=len(rs),
                heldout_losses=f,
                heldout_loss_mean=mean,
                heldout_loss_std=statistics.stdev(f) if len(f) > 1 else 0.0,
                gap_vs_ddp_pct=100 * (mean - ddp) / ddp if ddp else None,
                payload_bytes_per_sync=pay,
                dense_numel=rs[0]["dense_numel"],
                ratio_vs_bf16_ring_per_sync=ring / pay if pay else None,
                robust_exclusions=sum(r["excluded"] for r in rs),
                curve_steps=[t for t, _ in rs[0]["curve"]],
                curve_mean=[
                    statistics.mean(r["curve"][j][1] for r in rs)
                    for j in range(len(rs[0]["curve"]))
                ],
            )
        )
    probed = [r for r in runs if "tensors" in r]
    return dict(
        params=P,
        bf16_ring_bytes_per_sync=ring,
        arms=arms,
        tensors=_mean_rows(probed, "tensors"),
        kinds=_mean_kinds(probed),
    )


def _mean_rows(probed: list[dict], key: str) -> list[dict]:
    if not probed:
        return []
    rows = []
    for j, row in enumerate(probed[0][key]):
        r = dict(row)
        for f in NUMERIC:
            r[f] = statistics.mean(p[key][j][f] for p in probed)
        r["ef_norm"] = row["ef_norm"]  # first seed's series
        rows.append(r)
    return rows


def _mean_kinds(probed: list[dict]) -> dict:
    if not probed:
        return {}
    out = {}
    for kind, row in probed[0]["kinds"].items():
        out[kind] = {
            f: (statistics.mean(p["kinds"][kind][f] for p in probed) if isinstance(v, float) else v)
            for f, v in row.items()
        }
    return out


def markdown(s: Setup, summ: dict) -> str:
    lines = [
        f"{s.model}, {summ['params']:,} parameters, {s.members} members, {s.steps} steps, "
        f"batch {s.bsz}, corpus {s.corpus}; bf16 ring all-reduce "
        f"{summ['bf16_ring_bytes_per_sync']:,.0f} B per member and sync.",
        "",
        "| arm | held-out loss | vs DDP | payload B/sync | x less than bf16 ring |",
        "|---|---|---|---|---|",
    ]
    for a in summ["arms"]:
        gap = "" if a["gap_vs_ddp_pct"] is None else f"{a['gap_vs_ddp_pct']:+.1f}%"
        pay = "dense" if a["payload_bytes_per_sync"] is None else f"{a['payload_bytes_per_sync']:,}"
        ratio = a["ratio_vs_bf16_ring_per_sync"]
        lines.append(
            f"| {a['arm']} | {a['heldout_loss_mean']:.3f} ± {a['heldout_loss_std']:.3f} "
            f"| {gap} | {pay} | {'' if ratio is None else f'{ratio:,.0f}x'} |"
        )
    lines += [
        "",
        "| kind | tensors | numel | keep | delivered | cos | rel. error |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, r in summ["kinds"].items():
        lines.append(
            f"| {kind} | {r['tensors']} | {r['numel']:,} | {r['keep']:.3f} "
            f"| {r['delivered']:.2f} | {r['cum_cos']:.2f} | {r['cum_rel_err']:.2f} |"
        )
    return "\n".join([*lines, "", tensor_table(summ["tensors"])]) + "\n"


def tensor_table(rows: list[dict]) -> str:
    lines = [
        "| tensor | kind | shape | chunks x k | keep | weak chunks | capture | rel. err/sync "
        "| delivered "
        "| cos | EF growth | \\|e\\| / \\|D\\| |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tensor']} | {r['kind']} | {'x'.join(map(str, r['shape']))} "
            f"| {r['chunks']} x {r['k']} | {r['keep']:.3f} | {r['weak_chunks']:.2f} "
            f"| {r['capture']:+.3f} "
            f"| {r['rel_err_per_sync']:.2f} | {r['delivered']:.2f} | {r['cum_cos']:.2f} "
            f"| {r['ef_growth']:.1f} | {r['ef_over_delta']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", default="0,1", help="comma-separated")
    ap.add_argument("--members", type=int, default=4)
    ap.add_argument("--corpus", choices=sorted(CORPORA), default="prose")
    ap.add_argument("--arms", default="", help="comma-separated arm names (default: all)")
    ap.add_argument(
        "--arm",
        action="append",
        default=[],
        help="an extra arm: the job default with overrides, e.g. 'beta=0.99;K=4'"
        " or 'k=64:embedding+head;split=embedding+head' (repeatable)",
    )
    ap.add_argument("--json", type=Path, help="write the JSON here (and the tables to .md)")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    arms = default_arms(a.members)
    if a.arms or a.arm:
        want = set(a.arms.split(",")) if a.arms else set()
        arms = tuple(x for x in arms if x.name in want or x.name.split(" ")[0] in want)
        arms += tuple(custom_arm(text, a.members) for text in a.arm)
    s = Setup(model=a.model, members=a.members, steps=a.steps, corpus=a.corpus, arms=arms)
    if s.steps % 2:
        raise SystemExit("--steps must be a multiple of K=2")
    data, ev = load(s, start_model(s.model).ctx)
    runs = []
    for seed in [int(x) for x in a.seeds.split(",")]:
        for arm in arms:
            r = run(s, data, ev, arm, seed)
            print(f"{arm.name:28s} seed {seed}: {r['final']:.4f} ({r['wall_s']:.0f}s)", flush=True)
            runs.append(r)
    summ = summarize(s, runs)
    md = markdown(s, summ)
    print(md)
    if a.json:
        setup = {**asdict(s), "arms": [asdict(x) for x in arms]}
        a.json.write_text(json.dumps(dict(setup=setup, summary=summ, runs=runs), indent=1))
        a.json.with_suffix(".md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

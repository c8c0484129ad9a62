"""Deterministic robust aggregation: which of a round's decoded packets may be aggregated.

Every honest node runs `screen` on the same decoded packets before `aggregate`, so every
honest node excludes the same senders and the shared state stays bitwise identical. The
decision reads only the packets' integers (levels, indices, exponents) and is computed in
exact integer arithmetic (int64 level dot products with proven bounds, then Python ints);
no float takes part in it. Thresholds are floats in the config, turned into exact fractions.

Geometry: sender i's coefficient vector v_i has entries lvl * 2^exp. The DCT is orthonormal,
so norms and dot products of coefficient vectors are those of the updates themselves (up to
the 2^-15 fixed-point basis). For tensors t and senders i, j we compute the integer
D_t[i, j] = sum over shared (chunk, index) of lvl_i * lvl_j (|D| <= 9 * nchunks * k, far
below 2^63), so <v_i, v_j>_t = D_t[i, j] * 2^(exp_ti + exp_tj), held exactly as the Python
integer D_t[i, j] << (exp_ti + exp_tj - 2 * EXP_MIN).

Rules, in order:
1. norm, per tensor: |v_ti|^2 against the lower median m_t of all senders' |v_t|^2; exclude
   the sender if for some tensor |v_ti| > hi * sqrt(m_t) or |v_ti| < lo * sqrt(m_t).
2. direction, over the whole packet, among the senders that passed rule 1, each update
   clipped per tensor to the median norm of those senders (fixed-point weights from integer
   square roots): while at least `min_direction` remain, drop the one whose cos(v_i, sum of
   the other remaining, leaving out v_i's echoes, senders with cos(v_i, v_j) > cos_echo, when
   v_i and its echoes are at most (n - 1) // 3 senders) is lowest if it is below cos_min, and
   recompute.
With one sender nothing can be compared and it is kept; with two, the lower median is the
smaller norm, so only the larger can be excluded (when > hi times the smaller) and the
direction rule (symmetric for two senders: it cannot tell who is wrong) does not run.

Bound (`screen_clipped`, what the optimizer aggregates): the rules above decide who is left
out, the bound decides how much each kept sender can move the shared state. Every kept
sender's parameter whose norm is above `clip` times the kept senders' lower median norm is
scaled down by the smallest power of two 2^-s that brings it to at most that (its exponents
lowered by s: exact, the same integers on every node). Near copies (senders above cos_copy
to each other, together fewer than half of the kept senders) share one sender's weight: each
is lowered by a further ceil(log2 c) for c copies, and they count as one in the direction
rule's sums. So f kept senders of n move the shared state by at most f * clip * median per
parameter, whatever they send, against the honest senders' sum; scaling their own update up,
or sending it f times, buys them nothing.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cmp_to_key
from typing import NamedTuple

import numpy as np
import torch

from dtrain_node.optim import aggregate, packed
from dtrain_node.optim.codec import Decoded, Spec, readable
from dtrain_node.optim.compress import EXP_MIN, Sparse

Packets = Sequence[tuple[Hashable, Sequence[Sparse]]]


@dataclass(frozen=True)
class RobustConfig:
    """Parameters of the exclusion rule and of the bound on the shared state.

    Defaults chosen by measurement (docs/demo-optimizer.md): honest per-tensor norm ratios to
    the median stayed in [1/12, 6] (2-bit, a one-entry vector tensor is the noisiest) and [1/2, 2]
    (1-bit); honest cosines to the others' sum stayed >= 0.06, sign flips <= -0.06, and
    independent random updates (cos ~ 0, down to -0.023) must not be excluded.

    hi / lo: allowed band of a tensor's update norm around the median norm (ratio of norms).
    cos_min: least cosine between a sender's update and the sum of the others' (in [-1, 1)).
    cos_echo: another sender whose update has a cosine above this with a sender's is its echo
    (colluders sending one direction) and is left out of the sum that sender is judged against;
    honest updates stay far below it (pairwise cosines measured in docs/demo-optimizer.md).
    cos_copy: senders whose updates have a cosine above this are near copies of each other:
    fewer than half of the kept senders together, they share one sender's weight (the bound).
    min_direction: fewest senders (after the norm rule) for the direction rule to run.
    clip: a kept sender's parameter is scaled down by powers of two to at most this multiple
    of the kept senders' lower median norm (it ends in (clip / 2, clip] times it); 0: never.
    cos_trust / trust_shift: a kept sender whose cosine with the sum of the other kept senders
    (clipped, near copies as one) is below cos_trust is scaled down by a further
    2^-trust_shift: a random direction at the median norm (cosine about 0; honest senders'
    are >= 0.06) then adds little noise to the step, and (weighted) counts 2^-trust_shift of
    a sender in the mean. trust_shift 0: off. On by default since the divisor counts the
    shift (docs/benchmarks.md, "What a coalition moves beyond its own absence").
    support: a transmitted coefficient (of one chunk) is aggregated only when at least
    ceil(support x kept senders) of the kept senders sent it; 0: every one (off). majority:
    an entry against its coefficient's net sign over the kept senders that sent it is left out.
    weighted: the mean divides by the kept senders' weights (2^-shift for the near-copy share
    and the trust shift) instead of their count, so that a sender scaled down also counts
    for less: a distrusted sender no longer dilutes the honest senders' mean. graded: the
    trust shift of a kept sender is the least t <= trust_shift with its cosine times 2^t at
    least the kept senders' lower median cosine (`graded`), instead of trust_shift below
    cos_trust.
    theta_max: every shared weight is clamped to [-theta_max, theta_max] after a step, so no
    set of packets can make the shared state non-finite. enabled=False aggregates everything.
    """

    enabled: bool = True
    hi: float = 16.0
    lo: float = 1 / 32
    cos_min: float = -0.05
    cos_echo: float = 0.5
    cos_copy: float = 0.9
    min_direction: int = 3
    clip: float = 1.5
    cos_trust: float = 0.03
    trust_shift: int = 8
    support: float = 0.0
    majority: bool = False
    weighted: bool = True
    graded: bool = False
    theta_max: float = 2.0**16

    def __post_init__(self) -> None:
        if not (math.isfinite(self.hi) and self.hi >= 1):
            raise ValueError(f"hi must be finite and >= 1, got {self.hi}")
        if not 0 <= self.lo <= 1:
            raise ValueError(f"lo must be in [0, 1], got {self.lo}")
        if not -1 <= self.cos_min < 1:
            raise ValueError(f"cos_min must be in [-1, 1), got {self.cos_min}")
        if not 0 <= self.cos_echo <= 1:
            raise ValueError(f"cos_echo must be in [0, 1], got {self.cos_echo}")
        if not self.cos_echo <= self.cos_copy <= 1:
            raise ValueError(f"cos_copy must be in [cos_echo, 1], got {self.cos_copy}")
        if self.min_direction < 3:
            raise ValueError(f"min_direction must be >= 3, got {self.min_direction}")
        if not (math.isfinite(self.clip) and (self.clip == 0 or self.clip >= 1)):
            raise ValueError(f"clip must be 0 (off) or finite and >= 1, got {self.clip}")
        if not (-1 <= self.cos_trust < 1 and 0 <= self.trust_shift <= 16):
            raise ValueError(
                f"cos_trust must be in [-1, 1) and trust_shift in [0, 16], got "
                f"{self.cos_trust}, {self.trust_shift}"
            )
        if not 0 <= self.support <= 1:
            raise ValueError(f"support must be in [0, 1], got {self.support}")
        if not (math.isfinite(self.theta_max) and self.theta_max > 0):
            raise ValueError(f"theta_max must be finite and > 0, got {self.theta_max}")


def level_dots(spec: Spec, i: int, packets: Packets) -> torch.Tensor:
    """D[a, b] = sum over (chunk, index) present in both a and b of lvl_a * lvl_b (int64)."""
    ce = spec.layout[i][1]
    keys = [(p[1][i].idx.to(torch.int64) + _rows(p[1][i].idx, ce)).reshape(-1) for p in packets]
    uniq, inv = torch.unique(torch.cat(keys), return_inverse=True)
    L = torch.zeros(len(packets), len(uniq), dtype=torch.int64)
    off = 0
    for a, (k, p) in enumerate(zip(keys, packets, strict=True)):
        # a sender's keys are unique (indices strictly increase per chunk), so this is a put
        L[a, inv[off : off + len(k)]] = p[1][i].lvl.to(torch.int64).reshape(-1)
        off += len(k)
    return torch.stack([(L[a] * L).sum(1) for a in range(len(packets))])


def _rows(idx: torch.Tensor, ce: int) -> torch.Tensor:
    return torch.arange(idx.shape[0], dtype=torch.int64).unsqueeze(1) * ce


def _decoded_dots(spec: Spec, packets: Packets) -> list[list[list[int]]]:
    """level_dots of every tensor at once, compiled, from Decoded packets' value arrays."""
    out: list = [None] * len(spec.names)
    for w, ts, iat, lat, table in _by_width(spec):
        idx = np.stack([p[1].values[w][iat] for p in packets])  # type: ignore[attr-defined]
        lvl = np.stack([p[1].levels[lat] for p in packets])  # type: ignore[attr-defined]
        for i, D in zip(ts, packed.dots(idx, lvl, table), strict=True):
            out[i] = D.tolist()
    return out


@functools.cache
def _by_width(spec: Spec) -> list[tuple[int, list[int], np.ndarray, np.ndarray, np.ndarray]]:
    """Per index width w: its tensors, where their indices and their levels sit in a Decoded
    packet's arrays, and each tensor's (first entry, chunks, k) among the gathered entries."""
    out = []
    for w in sorted({sp[0] for sp in spec.fields.spans}):
        ts = [i for i, sp in enumerate(spec.fields.spans) if sp[0] == w]
        runs = [(spec.fields.spans[i], spec.layout[i][0] * spec.layout[i][2]) for i in ts]
        iat = np.concatenate([np.arange(sp[1], sp[1] + m) for sp, m in runs])
        lat = np.concatenate([np.arange(sp[3], sp[3] + m) for sp, m in runs])
        starts = np.cumsum([0] + [m for _, m in runs[:-1]])
        table = [(a, spec.layout[i][0], spec.layout[i][2]) for a, i in zip(starts, ts, strict=True)]
        out.append((w, ts, iat, lat, np.array(table, np.int64)))
    return out


def gram(spec: Spec, packets: Packets) -> list[list[list[int]]]:
    """Per tensor, the exact Gram matrix <v_a, v_b> scaled by 2^(-2 EXP_MIN), as Python ints."""
    out = []
    decoded = all(readable(spec, p[1]) for p in packets)
    dots = _decoded_dots(spec, packets) if decoded else None
    for i in range(len(spec.names)):
        D = dots[i] if dots is not None else level_dots(spec, i, packets).tolist()
        if decoded:
            ex = [int(p[1].exps[i]) - EXP_MIN for p in packets]  # type: ignore[attr-defined]
        else:
            ex = [p[1][i].exp - EXP_MIN for p in packets]
        out.append(
            [[d << (a + b) for d, b in zip(r, ex, strict=True)] for r, a in zip(D, ex, strict=True)]
        )
    return out


def by_parameter(spec: Spec, G: list[list[list[int]]]) -> tuple[list[list[list[int]]], list[str]]:
    """The Gram matrices of a parameter's blocks summed (a parameter is judged as a whole: a
    member whose batches never held a block's tokens sends nothing there), a mean row's
    weighted by the rows it moves, with the parameters' names."""
    if not spec.parents:
        return G, list(spec.names)
    out, names = [], []
    for group in spec.groups:
        n, w = len(G[group[0]]), [spec.weight(t) for t in group]  # a mean row: once per row
        out.append(
            [
                [sum(G[t][a][b] * x for t, x in zip(group, w, strict=True)) for b in range(n)]
                for a in range(n)
            ]
        )
        names.append(spec.names[group[0]].split("[")[0])
    return out, names


def _norm_reason(
    names: list[str], G: list[list[list[int]]], a: int, cfg: RobustConfig
) -> str | None:
    hi, lo = Fraction(cfg.hi) ** 2, Fraction(cfg.lo) ** 2
    for t, g in enumerate(G):
        sq = sorted(g[b][b] for b in range(len(g)))
        m, n = sq[(len(sq) - 1) // 2], g[a][a]  # lower median: with 2 senders, the smaller
        if n * hi.denominator > hi.numerator * m:
            return f"norm_high:{names[t]}"
        if n * lo.denominator < lo.numerator * m:
            return f"norm_low:{names[t]}"
    return None


def below(dot: int, n2: int, s2: int, c: Fraction) -> bool:
    """Exactly: dot < c * sqrt(n2 * s2), for integers n2, s2 >= 0 and a rational c."""
    b = n2 * s2 * c.numerator**2
    lhs = dot * dot * c.denominator**2
    if c >= 0:
        return dot < 0 or (c > 0 and lhs < b)
    return dot < 0 and lhs > b


def _cmp(x: tuple[int, int, int], y: tuple[int, int, int]) -> int:
    """Exact order of cosines d / sqrt(q) (q > 0) of two (d, q, index) triples."""
    if (x[0] < 0) != (y[0] < 0):
        return -1 if x[0] < 0 else 1
    lhs, rhs = x[0] * x[0] * y[1], y[0] * y[0] * x[1]
    if x[0] < 0:
        lhs, rhs = rhs, lhs
    return (lhs > rhs) - (lhs < rhs)


CLIP_BITS = 20  # fixed-point precision of the clipping weights


def clipped(G: list[list[list[int]]], keep: list[int]) -> list[list[int]]:
    """Whole-packet Gram matrix after clipping every sender's update, per tensor, to the lower
    median norm of the senders in `keep`: weights w_ta = min(1, sqrt(m_t / |v_ta|^2)) in fixed
    point (integer square roots, so every node gets the same integers). Without it a few
    colluding senders at a larger norm (inside the norm band) outweigh the many honest ones
    in every sum they are compared with."""
    n, one = len(G[0]), 1 << CLIP_BITS
    dots = [[0] * n for _ in range(n)]
    for g in G:
        sq = sorted(g[b][b] for b in keep)
        m = sq[(len(sq) - 1) // 2]
        w = [
            min(one, math.isqrt((m << (2 * CLIP_BITS)) // g[a][a])) if g[a][a] else one
            for a in range(n)
        ]
        for a in keep:
            for b in keep:
                dots[a][b] += w[a] * w[b] * g[a][b]
    return dots


def _echo(dots: list[list[int]], a: int, b: int, e: float) -> bool:
    """Exactly: cos(v_a, v_b) > e (for e >= 0)."""
    d, f = dots[a][b], Fraction(e)
    return d > 0 and d * d * f.denominator**2 > f.numerator**2 * dots[a][a] * dots[b][b]


def echo_pairs(dots: list[list[int]], keep: list[int], e: float) -> set[tuple[int, int]]:
    """(a, b) for senders in keep whose updates have a cosine above e (exactly)."""
    return {(a, b) for a in keep for b in keep if a != b and _echo(dots, a, b, e)}


def crowds(keep: list[int], copies: set[tuple[int, int]]) -> dict[int, int]:
    """Per sender in keep: itself and its near copies in keep, when they are fewer than half
    of keep (then they could all be colluders), else 1 (agreeing with most is honest)."""
    n = Counter(a for a, b in copies if a in keep and b in keep)
    return {a: 1 + n[a] if 2 * (1 + n[a]) < len(keep) else 1 for a in keep}


def crowded(
    dots: list[list[int]], keep: list[int], copies: set[tuple[int, int]]
) -> list[list[int]]:
    """The Gram matrix with each sender's update divided by its crowd (itself and its near
    copies in keep, in fixed point): near copies count together as one sender."""
    crowd = crowds(keep, copies)
    w = {a: (1 << CLIP_BITS) // crowd[a] for a in keep}
    return [
        [dots[a][b] * w[a] * w[b] if a in w and b in w else 0 for b in range(len(dots))]
        for a in range(len(dots))
    ]


def few_echoes(echo: set[tuple[int, int]], keep: list[int]) -> set[tuple[int, int]]:
    """The echo pairs of senders whose echoes could all be colluders (with it, at most a third
    of `keep`): many agreeing senders are the honest majority, and are not left out."""
    few = (len(keep) - 1) // 3
    echoes = Counter(a for a, b in echo if a in keep and b in keep)
    return {(a, b) for a, b in echo if a in keep and b in keep and echoes[a] + 1 <= few}


def references(
    dots: list[list[int]], keep: list[int], echo: set[tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """Per sender a in keep, (d, q) with cos(v_a, S_ref) = d / sqrt(q): S_ref the sum over keep
    without v_a and its echoes ((a, b) in echo), d = <v_a, S_ref>, q = |v_a|^2 |S_ref|^2."""
    total = sum(dots[a][b] for a in keep for b in keep)
    rows = {a: sum(dots[a][b] for b in keep) for a in keep}
    out = {}
    for a in keep:
        gone = [a] + [b for b in keep if (a, b) in echo]
        d = rows[a] - sum(dots[a][x] for x in gone)
        s2 = total - 2 * sum(rows[x] for x in gone) + sum(dots[x][y] for x in gone for y in gone)
        out[a] = (d, dots[a][a] * s2)
    return out


def _direction(
    dots: list[list[int]],
    echo: set[tuple[int, int]],
    copies: set[tuple[int, int]],
    keep: list[int],
    cfg: RobustConfig,
) -> list[int]:
    """Senders in `keep` dropped for direction: repeatedly the one with the lowest cosine to
    the sum of the other remaining senders (updates clipped to the median norm, near copies
    counted together as one; senders whose cosine with it exceeds cos_echo left out of its
    sum when they are, with it, at most a third of the senders), while it is below cos_min
    and at least min_direction senders remain. One at a time, so that a bad sender does not
    drag the reference of the honest ones down when they are judged."""
    c = Fraction(cfg.cos_min)
    dots = crowded(dots, keep, copies)
    echo = few_echoes(echo, keep)
    keep, out = list(keep), []
    while len(keep) >= cfg.min_direction:
        ref = references(dots, keep, echo)
        bad = [(d, q, a) for a, (d, q) in ref.items() if q and below(d, q, 1, c)]
        if not bad:
            break
        worst = min(bad, key=cmp_to_key(_cmp))[2]  # ties: the first by address
        keep.remove(worst)
        out.append(worst)
    return out


def screen(spec: Spec, packets: Packets, cfg: RobustConfig) -> tuple[list, dict[Hashable, str]]:
    """Split decoded packets into (kept, {sender: reason}); a function of the packets only.

    The result does not depend on the order of `packets` (decisions are per sender and every
    statistic is symmetric in the senders).
    """
    kept, out, _ = _judged(spec, packets, cfg)
    return kept, out


def screen_clipped(
    spec: Spec, packets: Packets, cfg: RobustConfig
) -> tuple[list, dict[Hashable, str], dict[Hashable, int]]:
    """`screen`, with every kept packet bounded (the module's Bound): (kept, excluded,
    {sender: the largest power of two its parameters were scaled down by, when any})."""
    return screen_weighted(spec, packets, cfg)[:3]


class Screened(NamedTuple):
    """What `screen_weighted` decided: the kept packets (bounded), {excluded sender: reason},
    {kept sender: the largest power of two it was scaled down by, when any}, what the mean
    divides by (None: the kept senders' count), the kept senders the trust rule scaled down,
    and the groups of kept senders that sent near copies of each other (what a node reports
    as a suspected coalition)."""

    kept: list
    excluded: dict[Hashable, str]
    clipped: dict[Hashable, int]
    weight: Fraction | None
    distrusted: tuple[Hashable, ...] = ()
    copies: tuple[tuple[Hashable, ...], ...] = ()


def screen_weighted(spec: Spec, packets: Packets, cfg: RobustConfig) -> Screened:
    """`screen_clipped`, and what the mean divides by: the kept senders' weights summed
    (`RobustConfig.weighted`), or None for their count."""
    kept, out, judged = _judged(spec, packets, cfg)
    if judged is None or not judged[1] or not cfg.clip:
        return Screened(kept, out, {}, None)
    G, keep, copies, distrusted = judged
    shifts = clip_shifts(G, keep, Fraction(cfg.clip) ** 2)
    crowd = crowds(keep, copies)
    weight = Fraction(0)
    for a in keep:  # near copies share one sender's weight: 2^-ceil(log2 crowd) each
        extra = (crowd[a] - 1).bit_length() + distrusted.get(a, 0)
        shifts[a] = [x + extra for x in shifts[a]]
        weight += Fraction(1, 1 << extra)
    bounded, clipped = [], {}
    for a, p in zip(keep, kept, strict=True):
        s = shifts[a]
        if any(s):
            per_tensor = [0] * len(spec.names)
            for t, x in zip(spec.groups, s, strict=True):
                for i in t:
                    per_tensor[i] = x
            p = (p[0], lowered(spec, p[1], per_tensor))
            clipped[p[0]] = max(s)
        bounded.append(p)
    name = {a: p[0] for a, p in zip(keep, kept, strict=True)}
    groups = {
        tuple(sorted([name[a]] + [name[b] for b in keep if (a, b) in copies], key=str))
        for a in keep
        if crowd[a] > 1
    }
    return Screened(
        bounded,
        out,
        clipped,
        weight if cfg.weighted else None,
        tuple(name[a] for a in keep if distrusted.get(a)),
        tuple(sorted(groups, key=str)),
    )


def clip_shifts(G: list[list[list[int]]], keep: list[int], c2: Fraction) -> dict[int, list[int]]:
    """Per kept sender, per parameter: the least s >= 0 with |v|^2 <= c2 * m * 4^s, m the kept
    senders' lower median |v|^2 (exact integers; s = 0 where m = 0: nothing to scale to)."""
    out = {a: [0] * len(G) for a in keep}
    for t, g in enumerate(G):
        sq = sorted(g[b][b] for b in keep)
        m = sq[(len(sq) - 1) // 2] * c2.numerator
        if not m:
            continue
        for a in keep:
            n, s = g[a][a] * c2.denominator, 0
            while n > m << (2 * s):
                s += 1
            out[a][t] = s
    return out


def lowered(spec: Spec, packet: Sequence[Sparse], shifts: Sequence[int]) -> Sequence[Sparse]:
    """The packet with tensor i's exponent lowered by shifts[i] (its update times 2^-shift)."""
    if readable(spec, packet):
        d = packet  # type: ignore[assignment]
        exps = d.exps - np.asarray(shifts, dtype=d.exps.dtype)  # type: ignore[attr-defined]
        return Decoded(spec, d.values, d.levels, exps)  # type: ignore[attr-defined]
    return [replace(t, exp=t.exp - s) for t, s in zip(packet, shifts, strict=True)]


def distrusted(
    dots: list[list[int]], keep: list[int], copies: set[tuple[int, int]], c: Fraction, e: float
) -> set[int]:
    """Senders in keep whose cosine with the sum of the other senders in keep is below c,
    exactly: near copies counted together as one (`crowded`), and, as in the direction rule,
    without the sender's echoes (cosine above e with it) when they could all be colluders, so
    that colluders sending one direction do not vouch for each other."""
    echo = few_echoes(echo_pairs(dots, keep, e), keep)
    ref = references(crowded(dots, keep, copies), keep, echo)
    return {a for a, (d, q) in ref.items() if q and below(d, q, 1, c)}


def against_the_rest(
    dots: list[list[int]], keep: list[int], copies: set[tuple[int, int]]
) -> dict[int, tuple[int, int]]:
    """Per sender a in keep, (d, q) with cos(v_a, S - v_a) = d / sqrt(q), S the sum over keep
    (near copies counted together as one, `crowded`): d = <v_a, S - v_a>, q = |v_a|^2 |S - v_a|^2
    (0 when either is 0)."""
    return references(crowded(dots, keep, copies), keep, set())


def graded(
    dots: list[list[int]], keep: list[int], copies: set[tuple[int, int]], most: int
) -> dict[int, int]:
    """Per sender in keep, the least t in [0, most] with cos_a * 2^t >= the lower median of
    the kept senders' cosines with the sum of the others (near copies as one), exactly; `most`
    for a cosine <= 0, and 0 for everyone when that median is <= 0. 2^-t is then about the
    sender's agreement relative to the typical kept sender's."""
    cos = {
        a: (d if q else 0, q or 1, a) for a, (d, q) in against_the_rest(dots, keep, copies).items()
    }
    ranked = sorted(cos.values(), key=cmp_to_key(_cmp))
    ref = ranked[(len(ranked) - 1) // 2]
    if ref[0] <= 0:
        return {a: 0 for a in keep}
    out = {}
    for a, (d, q, _) in cos.items():
        t = 0
        while t < most and (d <= 0 or d * d * ref[1] << (2 * t) < ref[0] * ref[0] * q):
            t += 1
        out[a] = t
    return out


def _judged(
    spec: Spec, packets: Packets, cfg: RobustConfig
) -> tuple[list, dict[Hashable, str], tuple[list, list[int], set, dict[int, int]] | None]:
    """(kept, excluded, (parameter Gram matrices, kept positions, near-copy pairs, {kept
    position: its trust shift, where any}), or None when nothing was judged)."""
    if not cfg.enabled or len(packets) < 2:
        return list(packets), {}, None
    order = aggregate.by_sender(packets)
    G, names = by_parameter(spec, gram(spec, order))
    out: dict[Hashable, str] = {}
    keep = []
    for a, p in enumerate(order):
        r = _norm_reason(names, G, a, cfg)
        if r is None:
            keep.append(a)
        else:
            out[p[0]] = r
    copies: set[tuple[int, int]] = set()
    low: dict[int, int] = {}
    if len(keep) >= cfg.min_direction:
        dots = clipped(G, keep)
        echo = echo_pairs(dots, keep, cfg.cos_echo)
        copies = {(a, b) for a, b in echo if _echo(dots, a, b, cfg.cos_copy)}
        for a in _direction(dots, echo, copies, keep, cfg):
            out[order[a][0]] = "direction"
            keep.remove(a)
        if cfg.trust_shift and cfg.graded:
            low = graded(clipped(G, keep), keep, copies, cfg.trust_shift)
        elif cfg.trust_shift:
            low = {
                a: cfg.trust_shift
                for a in distrusted(
                    clipped(G, keep), keep, copies, Fraction(cfg.cos_trust), cfg.cos_echo
                )
            }
    return [order[a] for a in keep], out, (G, keep, copies, low)


def stats(spec: Spec, packets: Packets) -> dict[Hashable, tuple[float, list[float]]]:
    """Diagnostics only (floats, never used to decide): per sender, the cosine to the sum of
    all other senders and each tensor's norm divided by the lower median norm."""
    order = aggregate.by_sender(packets)
    G = by_parameter(spec, gram(spec, order))[0]
    dots = [[sum(g[a][b] for g in G) for b in range(len(order))] for a in range(len(order))]
    total = sum(sum(r) for r in dots)
    out = {}
    for a, p in enumerate(order):
        n2, d = dots[a][a], sum(dots[a]) - dots[a][a]
        s2 = total - 2 * sum(dots[a]) + n2
        cos = d / math.sqrt(n2 * s2) if n2 and s2 else 0.0
        rel = []
        for g in G:
            sq = sorted(g[b][b] for b in range(len(g)))
            rel.append(math.sqrt(g[a][a] / sq[(len(sq) - 1) // 2]) if sq[(len(sq) - 1) // 2] else 0)
        out[p[0]] = (cos, rel)
    return out

"""Exact aggregation of decoded packets: the shared update, bitwise identical everywhere.

Why it is exact: every sender's value is lvl * 2^exp with a small integer lvl. Per tensor we
pick one common exponent e0 and turn every value into the integer lvl * 2^(exp - e0), then sum
senders into an int64 coefficient array A (integer addition: order cannot matter). The inverse
transform uses the integer basis Bq = round(B * 2^15):

    X = Bq^T @ A @ Bq   (per 64x64 chunk; A @ Bq per 64-vector)   computed in float64

Every product and every partial sum of these matmuls is an integer of magnitude at most
bmax^2 * sum|A| (bmax = max|Bq| = 5793 for n=64), and we choose e0 so that this bound stays
below 2^53. Float64 represents all such integers exactly, so no rounding ever happens: BLAS
blocking, summation order, thread count, FMA and device cannot change a bit. The true update
is X * 2^(e0 - 30) (2-D) or X * 2^(e0 - 15) (1-D); scaling by powers of two, lr and 1/N,
converting to the parameter dtype and the elementwise apply are single IEEE operations.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import torch

from dtrain_node.optim import dct, inverse, packed
from dtrain_node.optim.codec import Spec, readable
from dtrain_node.optim.compress import Sparse

LIMIT = 2**53  # float64 holds every integer below this exactly
SHIFT_MAX = 24  # at most this many bits of dynamic range between senders' scales
DENSE_WIDTH = 64  # entries per matrix chunk from which the dense inverse is used (the sparse
# one measured faster up to 48: docs/benchmarks.md, Scaling)
MEAN_BITS = 6  # extra fraction bits of a per-coefficient mean (integer division, rounded)


@dataclass
class Aggregate:
    """Sum over senders of the transmitted tensors, held as exact integers.

    For tensor i the summed update is sums[i] * 2^exps[i]; sums are float64 tensors holding
    integers exactly. `senders` is the canonical (sorted) list that was summed.
    """

    sums: list[torch.Tensor]
    exps: list[int]
    senders: tuple[Hashable, ...]
    per_coefficient: bool = False  # sums already hold each coefficient's mean over its senders
    weight: Fraction | None = None  # what the mean divides by (None: the senders' count)

    def update(
        self, i: int, lr: float, sign: bool, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The step for tensor i: lr * sign(sum) or lr * mean over senders, in `dtype`."""
        x = self.sums[i]
        if sign:
            return (torch.sign(x) * float(lr)).to(dtype)
        # lr / N rounds once in Python float64; ldexp is exact; x * c rounds once per element
        n = 1 if self.per_coefficient else (self.weight or len(self.senders))
        c = math.ldexp(float(Fraction(lr) / n), self.exps[i])
        return (x * c).to(dtype)

    def digest(self) -> str:
        """sha256 over exponents and the float64 bytes of every sum."""
        h = hashlib.sha256()
        if self.weight is not None:
            h.update(f"weight {self.weight}".encode())
        for x, e in zip(self.sums, self.exps, strict=True):
            h.update(struct.pack("<q", e))
            h.update(x.detach().cpu().contiguous().numpy().astype("<f8").tobytes())
        return h.hexdigest()


def _shift(v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """v * 2^m elementwise in int64; where m < 0 round half away from zero (integer ops only)."""
    if not bool((m < 0).any()):  # no sender is rounded (the common case)
        return v << m
    # levels are int8 (|v| <= 128): from 9 bits down everything rounds to 0; bounding the
    # shift keeps the rounding constant inside int64 for any exponent spread
    d = (-m).clamp(0, 16)
    a = (v.abs() + ((1 << d) >> 1)) >> d
    return torch.where(m >= 0, v << m.clamp(min=0), torch.where(v < 0, -a, a))


def _dense(idx, val, nc, ce, n, dims, Bq) -> torch.Tensor:
    """Inverse via the dense coefficient array A: Bq^T @ A @ Bq per chunk.

    For matrices A is laid out (row, chunk, column): then A @ Bq and Bq^T @ (A @ Bq) are one
    flat (n x n) product each over all chunks, instead of 2 x nc small ones. Each output entry
    is the same sum of exact integer products, whatever the layout."""
    if dims == 1:
        A = torch.zeros(nc, ce, dtype=torch.float64, device=val.device)
        return A.scatter_add_(1, idx, val) @ Bq
    chunk = torch.arange(nc, device=idx.device).unsqueeze(1)
    at = (idx.div(n, rounding_mode="floor") * nc + chunk) * n + idx.remainder(n)
    A = torch.zeros(n * nc * n, dtype=torch.float64, device=val.device)
    A.index_add_(0, at.reshape(-1), val.reshape(-1))
    X = Bq.T @ (A.view(n * nc, n) @ Bq).view(n, nc * n)
    return X.view(n, nc, n).transpose(0, 1)


def _runs(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per row, the indices sorted, the permutation that sorts them, and each sorted entry's
    distinct-index number (0, 1, ... in order): what groups a coefficient's senders."""
    sidx, perm = idx.sort(dim=1)
    first = torch.ones_like(sidx, dtype=torch.bool)
    first[:, 1:] = sidx[:, 1:] != sidx[:, :-1]
    return sidx, perm, first.cumsum(1) - 1


def _coefficient_mean(idx: torch.Tensor, val: torch.Tensor, m: int):
    """Per row, each distinct index once with round(2^m * sum / count) of the senders that sent
    it (integer division, half away from zero: exact and order-free), padded with (0, 0) to the
    input width so tensors keep batching together."""
    sidx, perm, pos = _runs(idx)
    total = torch.zeros_like(val).scatter_add_(1, pos, val.gather(1, perm))
    count = torch.zeros_like(val).scatter_add_(1, pos, torch.ones_like(val)).clamp_(min=1)
    num = total << m
    q = (num.abs() * 2 + count).div(2 * count, rounding_mode="floor")
    return torch.zeros_like(idx).scatter_(1, pos, sidx), torch.where(num < 0, -q, q)


def _supported(
    idx: torch.Tensor, val: torch.Tensor, least: int, majority: bool = False
) -> torch.Tensor:
    """`val` with every entry zeroed whose index appears fewer than `least` times in its row
    (a coefficient of a chunk sent by fewer than `least` senders: each sends it at most once)
    and, with `majority`, every entry whose sign is against its coefficient's net sign over
    its senders. Integer counts only: exact and order-free."""
    _, perm, pos = _runs(idx)
    count = torch.zeros_like(idx).scatter_add_(1, pos, torch.ones_like(idx))
    keep = count.gather(1, pos) >= least
    if majority:
        sign = val.gather(1, perm).sign()
        net = torch.zeros_like(idx).scatter_add_(1, pos, sign).gather(1, pos).sign()
        keep &= sign * net >= 0
    kept = torch.empty_like(keep).scatter_(1, perm, keep)
    return torch.where(kept, val, torch.zeros_like(val))


def _integers(spec: Spec, order, ts: list[int], ex: torch.Tensor, s_max: int):
    """A group of tensors' entries, every sender's side by side, as integers
    lvl * 2^(exp - e0) with each tensor's common exponent e0 at most `s_max` below its largest.

    order are the (sender, tensors) packets and ex[s] sender s's exponents of the group.
    Returns (e0 per tensor, indices, values): rows are the group's chunks in tensor order,
    columns the senders' k entries in sender order."""
    k, S = spec.layout[ts[0]][2], len(order)
    e0 = torch.maximum(ex.min(0).values, ex.max(0).values - s_max)
    span = _span(spec, tuple(ts))
    if span is not None and all(readable(spec, p[1]) for p in order):
        w, start, size, at, rows = span  # the group's fields straight from the packets' arrays
        i = np.stack([p[1].values[w][start : start + size] for p in order])
        lv = np.stack([p[1].levels[at] for p in order])
        i, v = packed.entries(i, lv, (ex - e0).numpy(), rows, k)
        return e0.tolist(), torch.from_numpy(i), torch.from_numpy(v)
    idx = torch.stack([torch.cat([p[1][i].idx.reshape(-1) for i in ts]) for p in order])
    lvl = torch.stack([torch.cat([p[1][i].lvl.reshape(-1) for i in ts]) for p in order])
    idx, lvl = (x.view(S, -1, k).transpose(0, 1).reshape(-1, S * k) for x in (idx, lvl))
    rows = torch.tensor([spec.layout[i][0] for i in ts])
    sh = (ex - e0).repeat_interleave(rows, dim=1).T.repeat_interleave(k, dim=1)
    return e0.tolist(), idx.to(torch.int64), _shift(lvl.to(torch.int64), sh)


def _exponents(spec: Spec, packet: Sequence[Sparse]) -> list[int]:
    if readable(spec, packet):
        return packet.exps.tolist()  # type: ignore[attr-defined]
    return [t.exp for t in packet]


@functools.cache
def _span(spec: Spec, ts: tuple[int, ...]) -> tuple[int, int, int, np.ndarray, np.ndarray] | None:
    """Where a group's fields sit in a Decoded packet: (index width, first index, number of
    indices, positions of its levels, chunks per tensor), or None if its indices are not one
    run of one width."""
    spans = [spec.fields.spans[i] for i in ts]
    sizes = [spec.layout[i][0] * spec.layout[i][2] for i in ts]
    w, start = spans[0][0], spans[0][1]
    ends = [sp[1] + m for sp, m in zip(spans, sizes, strict=True)]
    if any(sp[0] != w for sp in spans) or [sp[1] for sp in spans[1:]] != ends[:-1]:
        return None
    at = np.concatenate([np.arange(sp[3], sp[3] + m) for sp, m in zip(spans, sizes, strict=True)])
    rows = np.array([spec.layout[i][0] for i in ts], np.int64)
    return w, start, sum(sizes), at, rows


@functools.cache
def bound_shift(nsend: int, k: int, max_level: int, bmax: int, dims: int) -> int:
    """Largest scale spread s <= SHIFT_MAX such that the integer inverse stays below 2^53.

    sum|A| per chunk <= nsend * k * max_level * 2^s, and every partial sum of the inverse is
    at most bmax^dims times that. Raises ValueError if even s = 0 would not be exact.
    """
    per = nsend * k * max_level * bmax**dims
    if per >= LIMIT:
        raise ValueError(
            f"{nsend} senders x k={k} x level {max_level} x bmax^{dims}={bmax**dims} = {per}"
            f" >= 2^53: the aggregate cannot be computed exactly; use fewer senders or smaller k"
        )
    s = 0
    while s < SHIFT_MAX and per << (s + 1) < LIMIT:
        s += 1
    return s


def _inverse(spec: Spec, ts: list[int], idx, val, Bq, dense: bool | None) -> list[torch.Tensor]:
    """The group's tensors from their summed sparse coefficients, by one of three algorithms
    that compute the very same exact integers: dense (Bq^T A Bq), the compiled inverse on the
    CPU (inverse.py), or batched outer products."""
    n, shapes = spec.cfg.chunk, [spec.shapes[i] for i in ts]
    dims = 2 if spec.layout[ts[0]][1] != n else 1
    if dense is None and Bq.device.type == "cpu":
        return inverse.tensors(idx, val, Bq, shapes)
    if dense if dense is not None else idx.shape[1] >= (n if dims == 1 else DENSE_WIDTH):
        X = _dense(idx, val, idx.shape[0], n if dims == 1 else n * n, n, dims, Bq)
    else:
        X = dct.ichunks_sparse(idx, val, n, dims == 1, Bq)
        if dct.basis_has_zero(n) or not bool((val != 0).any(1).all()):
            # sums of only +-0 products must read +0 as on the dense path: chunks whose
            # entries are all 0, or any chunk when Bq has 0 entries (docs/demo-optimizer.md)
            X = X + 0.0
    counts = [spec.layout[i][0] for i in ts]
    return [dct.from_chunks(x, s, n) for x, s in zip(X.split(counts), shapes, strict=True)]


def by_sender(packets: Sequence[tuple[Hashable, Any]]) -> list[tuple[Hashable, Any]]:
    """The packets in canonical sender order: hex addresses by address (their lowercase
    spelling; as checksum strings two addresses can sort the other way), other ids by value."""
    return sorted(packets, key=lambda p: p[0].lower() if isinstance(p[0], str) else p[0])


def aggregate(
    spec: Spec,
    packets: Sequence[tuple[Hashable, Sequence[Sparse]]],
    device: torch.device | str | None = None,
    dense: bool | None = None,
    per_coefficient: bool = False,
    least_senders: int = 1,
    majority_sign: bool = False,
) -> Aggregate:
    """Sum decoded packets exactly. Senders must be distinct and mutually sortable (ids).

    `dense` picks the inverse-transform algorithm: True the dense one, False batched outer
    products, None (default) the compiled inverse on the CPU and otherwise by sparsity. All
    give the same bits because all compute exact integers. `per_coefficient` divides each DCT
    coefficient by the number of senders that sent it (the DeMo reference's mean) instead of
    the whole sum by the number of senders. `least_senders`: a coefficient of a chunk is
    summed only when at least that many senders sent it (1: every one); `majority_sign`: an
    entry against its coefficient's net sign over the senders that sent it is left out.
    """
    if not packets:
        raise ValueError("no packets to aggregate")
    order = by_sender(packets)
    senders = tuple(p[0] for p in order)
    if len(set(senders)) != len(senders):
        raise ValueError("duplicate sender ids")
    n = spec.cfg.chunk
    Bq = dct.basis_q(n).to(device=device, dtype=torch.float64)
    bmax = int(dct.basis_q(n).abs().max())
    # tensors of the same kind (matrix or vector) and k form one group: every sender's entries
    # of the group side by side as integers (repeated indices add up inside the inverse), then
    # one inverse per group: every product and partial sum is still an exact integer per
    # chunk
    m = MEAN_BITS if per_coefficient else 0
    ex = torch.tensor([_exponents(spec, p[1]) for p in order], dtype=torch.int64)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (_, ce, k, _, _) in enumerate(spec.layout):
        groups.setdefault((1 if ce == n else 2, k), []).append(i)
    exps: list[int] = [0] * len(spec.layout)
    sums: list[torch.Tensor | None] = [None] * len(spec.layout)
    for (dims, k), ts in groups.items():
        s_max = bound_shift(len(order) << m, k, spec.cfg.max_level, bmax, dims)
        e0, idx, val = _integers(spec, order, ts, ex[:, ts], s_max)
        if least_senders > 1 or majority_sign:
            val = _supported(idx, val, least_senders, majority_sign)
        if per_coefficient:
            idx, val = _coefficient_mean(idx, val, m)
        l1 = int(val.abs().sum(1).max()) if idx.shape[0] else 0
        if l1 * bmax**dims >= LIMIT:  # guaranteed by bound_shift; checked because it MUST hold
            names = ", ".join(spec.names[i] for i in ts)
            raise ValueError(f"{names}: sum|A|={l1} breaks the 2^53 exactness bound")
        for i, e in zip(ts, e0, strict=True):
            exps[i] = e - m - dims * dct.QBITS
        idx, val = idx.to(device), val.to(device=device, dtype=torch.float64)
        tensors = _inverse(spec, ts, idx, val, Bq, dense)
        for i, x in zip(ts, tensors, strict=True):
            sums[i] = x
    return Aggregate(sums, exps, senders, per_coefficient)  # type: ignore[arg-type]

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

import hashlib
import math
import struct
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from dtrain_node.optim import dct
from dtrain_node.optim.codec import Spec
from dtrain_node.optim.compress import Sparse

LIMIT = 2**53  # float64 holds every integer below this exactly
SHIFT_MAX = 24  # at most this many bits of dynamic range between senders' scales


@dataclass
class Aggregate:
    """Sum over senders of the transmitted tensors, held as exact integers.

    For tensor i the summed update is sums[i] * 2^exps[i]; sums are float64 tensors holding
    integers exactly. `senders` is the canonical (sorted) list that was summed.
    """

    sums: list[torch.Tensor]
    exps: list[int]
    senders: tuple[Hashable, ...]

    def update(
        self, i: int, lr: float, sign: bool, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The step for tensor i: lr * sign(sum) or lr * mean over senders, in `dtype`."""
        x = self.sums[i]
        if sign:
            return (torch.sign(x) * float(lr)).to(dtype)
        # lr / N rounds once in Python float64; ldexp is exact; x * c rounds once per element
        c = math.ldexp(float(lr) / len(self.senders), self.exps[i])
        return (x * c).to(dtype)

    def digest(self) -> str:
        """sha256 over exponents and the float64 bytes of every sum."""
        h = hashlib.sha256()
        for x, e in zip(self.sums, self.exps, strict=True):
            h.update(struct.pack("<q", e))
            h.update(x.detach().cpu().contiguous().numpy().astype("<f8").tobytes())
        return h.hexdigest()


def _shift(lvl: torch.Tensor, m: int) -> torch.Tensor:
    """lvl * 2^m in int64; for m < 0 round half away from zero (integer ops only)."""
    v = lvl.to(torch.int64)
    if m >= 0:
        return v << m
    # levels are int8 (|v| <= 128): from 9 bits down everything rounds to 0; bounding m keeps
    # the rounding constant inside int64 for any exponent spread (up to EXP_MAX - EXP_MIN)
    m = max(m, -16)
    a = (v.abs() + (1 << (-m - 1))) >> (-m)
    return torch.where(v < 0, -a, a)


def _dense(idx, val, nc, ce, n, dims, Bq) -> torch.Tensor:
    """Inverse via the dense coefficient array A: Bq^T @ A @ Bq per chunk."""
    A = torch.zeros(nc, ce, dtype=torch.float64, device=val.device).scatter_add_(1, idx, val)
    if dims == 1:
        return A @ Bq
    A = A.reshape(nc, n, n)
    return Bq.T @ A @ Bq


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


def aggregate(
    spec: Spec,
    packets: Sequence[tuple[Hashable, Sequence[Sparse]]],
    device: torch.device | str | None = None,
    dense: bool | None = None,
) -> Aggregate:
    """Sum decoded packets exactly. Senders must be distinct and mutually sortable (ids).

    `dense` picks the inverse-transform algorithm (default: by sparsity); both give the same
    bits because both compute exact integers.
    """
    if not packets:
        raise ValueError("no packets to aggregate")
    order = sorted(packets, key=lambda p: p[0])  # canonical: by sender id
    senders = tuple(p[0] for p in order)
    if len(set(senders)) != len(senders):
        raise ValueError("duplicate sender ids")
    n = spec.cfg.chunk
    Bq = dct.basis_q(n).to(device=device, dtype=torch.float64)
    bmax = int(dct.basis_q(n).abs().max())
    sums, exps = [], []
    for i, (shape, (nc, ce, k, _, _)) in enumerate(zip(spec.shapes, spec.layout, strict=True)):
        dims = 1 if ce == n else 2
        s_max = bound_shift(len(order), k, spec.cfg.max_level, bmax, dims)
        ex = [p[1][i].exp for p in order]
        e0 = max(min(ex), max(ex) - s_max)
        # all senders' entries side by side; repeated indices add up inside the matmul
        idx = torch.cat([p[1][i].idx.to(torch.int64) for p in order], dim=1)
        val = torch.cat([_shift(p[1][i].lvl, e - e0) for p, e in zip(order, ex, strict=True)], 1)
        l1 = int(val.abs().sum(1).max()) if nc else 0
        if l1 * bmax**dims >= LIMIT:  # guaranteed by bound_shift; checked because it MUST hold
            raise ValueError(f"{spec.names[i]}: sum|A|={l1} breaks the 2^53 exactness bound")
        idx, val = idx.to(device), val.to(device=device, dtype=torch.float64)
        if dense if dense is not None else val.shape[1] >= n:
            X = _dense(idx, val, nc, ce, n, dims, Bq)
        else:  # fewer products, the very same exact integers
            X = dct.ichunks_sparse(idx, val, n, dims == 1, Bq)
        sums.append(dct.from_chunks(X, shape, n))
        exps.append(e0 - dims * dct.QBITS)
    return Aggregate(sums, exps, senders)

"""The top-k of every matrix chunk of the error feedback, compiled with numba (feedback.py
calls it; its layout is feedback.py's (row frequency, chunk, column frequency)).

The k largest |e| of a chunk lie in the k rows with the largest maxima: a row outside them has
k rows above it, each holding an entry at least as large. So per chunk, in one pass over it:
the row maxima, a selection of k rows among n by their maxima, then of k entries among those
rows' k x n, each by insertion into a sorted run of k (ties keep the first seen). e is local
state: which of equal entries is sent only decides this node's packet.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from numba import njit

from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, LEVELS


def topk(m3: torch.Tensor, k: int, bound: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Indices (row * n + column, ascending) and values of the k largest |e| of every chunk of
    m3, a float32 (n, chunks, n) layout; None if some |e| is above `bound` or NaN."""
    n, nc, n2 = m3.shape
    if n != n2 or m3.dtype != torch.float32 or not 1 <= k <= n:
        raise ValueError(f"top-{k} of float32 chunks {tuple(m3.shape)}, not {m3.dtype}")
    idx, val = np.empty((nc, k), np.int64), np.empty((nc, k), np.float32)
    limit = int(np.array(bound, np.float32).view(np.int32))
    if not _topk(m3.numpy(), m3.numpy().view(np.int32), k, limit, idx, val):
        return None
    return torch.from_numpy(idx), torch.from_numpy(val)


@njit(cache=True, nogil=True)
def _topk(m3, bits, k, limit, idx, val):  # pragma: no cover - compiled
    """Magnitudes are compared as the bits of |e| (a non-negative float's bits order like it,
    and integer maxima vectorize); a NaN's or anything above `limit`'s bits stop the pass."""
    n = m3.shape[0]
    top, rows = np.empty(k, np.int64), np.empty(k, np.int64)
    mag, peak = np.empty(k, np.int32), np.empty(n, np.int32)
    for c in range(m3.shape[1]):
        for r in range(n):
            p = 0
            for j in range(n):
                p = max(p, bits[r, c, j] & 0x7FFFFFFF)
            peak[r] = p
        w = 0
        for r in range(n):
            if peak[r] > limit:
                return False
            w = _insert(top, mag, w, k, r, peak[r])
        rows[:] = top
        w = 0
        for r in rows:
            for j in range(n):
                w = _insert(top, mag, w, k, r * n + j, bits[r, c, j] & 0x7FFFFFFF)
        top.sort()
        for t in range(k):
            idx[c, t] = top[t]
            val[c, t] = m3[top[t] // n, c, top[t] % n]
    return True


def quantize(
    m3: torch.Tensor, idx: torch.Tensor, vals: torch.Tensor, rows: np.ndarray, bits: int
) -> tuple[torch.Tensor, list[int]]:
    """Levels and one scale exponent per tensor (tensor t owns the next rows[t] chunks) of the
    values topk took, as compress.quantize computes them; what is sent is taken out of m3 in
    place (e = v - lvl * 2^exp, float32). Returns (levels int8, exponents). Vector chunks
    (chunks, n) pass as m3 of shape (1, chunks, n)."""
    nc, k = idx.shape
    if tuple(vals.shape) != (nc, k) or int(rows.sum()) != nc or m3.shape[1] != nc:
        raise ValueError(f"quantize: {tuple(vals.shape)} values, {nc} chunks, rows {rows.sum()}")
    if bits not in LEVELS:
        raise ValueError(f"bits must be one of {sorted(LEVELS)}, got {bits}")
    if m3.dtype != torch.float32 or vals.dtype != torch.float32:
        raise ValueError(f"quantize: float32 chunks and values, not {m3.dtype}, {vals.dtype}")
    # the compiled loop writes m3 at each index without bounds checks
    top = m3.shape[0] * m3.shape[2]
    if idx.numel() and not (int(idx.min()) >= 0 and int(idx.max()) < top):
        raise ValueError(f"quantize: index outside [0, {top}): {idx.min()}..{idx.max()}")
    lvl, exps = np.empty((nc, k), np.int8), np.empty(len(rows), np.int64)
    _quantize(m3.numpy(), idx.numpy(), vals.numpy(), rows, bits, lvl, exps)
    return torch.from_numpy(lvl), exps.tolist()


@njit(cache=True, nogil=True)
def _quantize(m3, idx, vals, rows, bits, lvl, exps):  # pragma: no cover - compiled
    n, k = m3.shape[2], idx.shape[1]
    c0 = 0
    for t in range(rows.shape[0]):
        total = 0.0
        for c in range(c0, c0 + rows[t]):
            for j in range(k):
                total += abs(np.float64(vals[c, j]))
        mean = total / (rows[t] * k)
        e = min(max(np.rint(np.log2(mean)) - (bits - 1), EXP_MIN), EXP_MAX) if mean > 0 else EXP_MIN
        exps[t] = e
        inv, scale = 2.0**-e, np.float32(2.0**e)  # powers of two: exact
        for c in range(c0, c0 + rows[t]):
            for j in range(k):
                v = vals[c, j]
                if bits == 1:
                    q = 1 if v >= 0 else -1
                else:
                    q = min(max(2 * np.floor(np.float64(v) * inv / 2) + 1, -3), 3)
                lvl[c, j] = q
                m3[idx[c, j] // n, c, idx[c, j] % n] = v - np.float32(q) * scale
        c0 += rows[t]


@njit(cache=True, nogil=True, inline="always")
def _insert(top, mag, w, k, key, x):  # pragma: no cover - compiled
    """Insert key of magnitude x into the descending run (top, mag) of w <= k entries if it
    is among the k largest; returns the new length."""
    if w == k and not x > mag[k - 1]:
        return w
    t = w if w < k else k - 1
    while t > 0 and x > mag[t - 1]:
        top[t], mag[t] = top[t - 1], mag[t - 1]
        t -= 1
    top[t], mag[t] = key, x
    return min(w + 1, k)


@functools.cache
def warm() -> None:
    """Compile (or load from numba's cache) ahead of the first round."""
    m3 = torch.ones(2, 1, 2)
    idx, vals = topk(m3, 1, 1.0)  # type: ignore[misc]
    for bits in LEVELS:
        quantize(m3, idx, vals, np.ones(1, np.int64), bits)

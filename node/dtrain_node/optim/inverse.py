"""The exact sparse inverse of the matrix chunks of one aggregation group, written straight into
the tensors (aggregate.py calls it, dct.py defines the layout).

Per chunk, X = sum_e v_e outer(Bq[r_e], Bq[c_e]) over its entries (r_e, c_e) = divmod(idx_e, n).
Entries sharing a column c are summed first into G[c] = sum v_e Bq[r_e] (or, when the chunk has
fewer distinct rows than columns, the same with rows and columns swapped), so a chunk costs
(distinct columns) x n^2 products instead of (entries) x n^2: on real packets at 8 senders x
k = 6, 48 entries share ~13 columns or rows. The grouping and the placement into the tensors
are compiled loops (numba); the products are batched float64 matmuls, one per bucket of chunks
with about as many keys. Every value is an integer and every partial sum stays below the bound
aggregate.py checks (sum|v| * max|Bq|^2 < 2^53), so float64 computes them exactly: grouping,
bucketing, BLAS order and FMA cannot change a bit. Each output is stored as `x + 0.0`, so a sum
of only +-0 products reads +0 whatever the BLAS did.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
from numba import njit

from dtrain_node.optim import dct

STEP = 8  # chunks whose key counts round up to the same multiple of STEP share a product


@functools.cache
def placement(shapes: tuple[tuple[int, ...], ...], n: int) -> tuple[np.ndarray, int]:
    """Where each matrix chunk of `shapes` (in order) lands in one flat output holding the
    tensors back to back: rows (offset, row stride, rows inside the tensor, columns inside
    it), and the output's length."""
    rows, at = [], 0
    for shape in shapes:
        R, C = dct.view2(shape)
        for a in range(-(-R // n)):
            for b in range(-(-C // n)):
                rows.append((at + a * n * C + b * n, C, min(n, R - a * n), min(n, C - b * n)))
        at += R * C
    return np.array(rows, dtype=np.int64).reshape(-1, 4), at


def matrices(
    idx: torch.Tensor, val: torch.Tensor, Bq: torch.Tensor, shapes: Sequence[tuple[int, ...]]
) -> list[torch.Tensor]:
    """The tensors of `shapes` (2-D views, in order) from their chunks' sparse coefficients:
    idx, val (chunks, m) int64 and exact-integer float64, Bq the (n, n) integer basis as
    float64. Same values, bit for bit, as the dense inverse of scatter_add(idx, val).

    Chunks are bucketed by their number of keys (up to STEP apart) and each bucket is one
    batched product L^T @ R, padded with zero rows to its widest chunk."""
    n = Bq.shape[0]
    place, size = placement(tuple(tuple(s) for s in shapes), n)
    if val.shape != idx.shape or Bq.shape != (n, n):
        raise ValueError(
            f"values {tuple(val.shape)} for indices {tuple(idx.shape)}, basis {tuple(Bq.shape)}"
        )
    if place.shape[0] != idx.shape[0]:
        raise ValueError(f"{idx.shape[0]} chunks of coefficients for {place.shape[0]} chunks")
    # the compiled loops do not check bounds: an index outside the chunk must never reach them
    if idx.numel() and not (int(idx.min()) >= 0 and int(idx.max()) < n * n):
        raise ValueError(f"coefficient index outside [0, {n * n}): {idx.min()}..{idx.max()}")
    c = np.ascontiguousarray
    I, V, B = c(idx.numpy()), c(val.numpy()), c(Bq.numpy())
    out = np.empty(size)
    w = _widths(I, n)
    bucket = -(-w // STEP)
    for b in np.unique(bucket):
        which = np.flatnonzero(bucket == b)
        L = np.zeros((len(which), int(w[which].max()), n))
        R = np.zeros_like(L)
        _fill(I, V, B, which, L, R)
        X = torch.bmm(torch.from_numpy(L).transpose(1, 2), torch.from_numpy(R))
        _put(X.numpy(), which, place, out)
    flat, views, at = torch.from_numpy(out), [], 0
    for s in shapes:
        views.append(flat[at : at + math.prod(s)].view(s))
        at += math.prod(s)
    return views


@functools.cache
def warm() -> None:
    """Compile (or load from numba's cache) ahead of the first round: a node calls this when
    its optimizer starts, so no sync round waits for the compiler."""
    one = torch.ones(1, 1, dtype=torch.float64)
    matrices(torch.zeros(1, 1, dtype=torch.int64), one, dct.basis_q(4).double(), [(4, 4)])


@njit(cache=True, nogil=True)
def _widths(idx, n):  # pragma: no cover - compiled
    """Keys per chunk: min(distinct rows, distinct columns) of its entries."""
    out = np.empty(idx.shape[0], np.int64)
    seen = np.zeros((2, n), np.int64)
    for ch in range(idx.shape[0]):
        dr, dc = _distinct(idx[ch], n, seen, ch + 1)
        out[ch] = min(dr, dc)
    return out


@njit(cache=True, nogil=True)
def _fill(idx, val, Bq, which, L, R):  # pragma: no cover - compiled
    """For chunk which[i]: X = L[i]^T @ R[i], with (L, R) = (G, Bq[keys]) grouped by column or
    (Bq[keys], G) grouped by row, whichever has fewer keys; rows past the keys stay 0."""
    n = Bq.shape[0]
    keys = np.empty(idx.shape[1], np.int64)
    slot = np.full(n, -1, np.int64)
    seen = np.zeros((2, n), np.int64)
    for i in range(which.shape[0]):
        ch = which[i]
        dr, dc = _distinct(idx[ch], n, seen, i + 1)
        byrow = dc > dr
        G = R[i] if byrow else L[i]
        w = _group(idx[ch], val[ch], Bq, byrow, G, keys, slot)
        H = L[i] if byrow else R[i]
        for j in range(w):
            H[j, :] = Bq[keys[j], :]


@njit(cache=True, nogil=True)
def _put(X, which, place, out):  # pragma: no cover - compiled
    """Chunk X[i] into its tensor at place[which[i]], cropped; stored as x + 0.0 (never -0)."""
    for i in range(which.shape[0]):
        at, stride, rows, cols = place[which[i]]
        for a in range(rows):
            o = at + a * stride
            for b in range(cols):
                out[o + b] = X[i, a, b] + 0.0


@njit(cache=True, nogil=True)
def _distinct(idx, n, seen, stamp):  # pragma: no cover - compiled
    """(distinct rows, distinct columns) of a chunk's entries; seen rows hold stamps."""
    dr, dc = 0, 0
    for e in range(idx.shape[0]):
        r, c = idx[e] // n, idx[e] % n
        if seen[0, r] != stamp:
            seen[0, r] = stamp
            dr += 1
        if seen[1, c] != stamp:
            seen[1, c] = stamp
            dc += 1
    return dr, dc


@njit(cache=True, nogil=True)
def _group(idx, val, Bq, byrow, G, keys, slot):  # pragma: no cover - compiled
    """G[j] = sum of v_e Bq[other_e] over the entries whose key (column, or row if byrow) is
    keys[j]; returns the number of keys. slot is all -1 before and after."""
    n = Bq.shape[0]
    w = 0
    for e in range(idx.shape[0]):
        r, c = idx[e] // n, idx[e] % n
        key, other = (r, c) if byrow else (c, r)
        j = slot[key]
        if j < 0:
            j = w
            slot[key] = j
            keys[j] = key
            G[j, :n] = 0.0
            w += 1
        v = val[e]
        for b in range(n):
            G[j, b] += v * Bq[other, b]
    for j in range(w):
        slot[keys[j]] = -1
    return w

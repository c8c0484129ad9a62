"""The exact sparse inverse of one aggregation group's chunks, written straight into the
tensors (compiled with numba; aggregate.py calls it, dct.py defines the layout). Vectors: each
n-vector is sum_e v_e Bq[idx_e]. Matrices: see below.

Per chunk, X = sum_e v_e outer(Bq[r_e], Bq[c_e]) over its entries (r_e, c_e) = divmod(idx_e, n).
Entries sharing a column c are summed first into G[c] = sum v_e Bq[r_e] (or, when the chunk has
fewer distinct rows than columns, the same with rows and columns swapped), so a chunk costs
(distinct columns) x n^2 products instead of (entries) x n^2: on real packets at 8 senders x
k = 6, 48 entries share ~13 columns or rows. The basis mirrors, Bq[k, n - 1 - j] =
(-1)^k Bq[k, j], so the sums over even and odd keys, E and O, of one half of a chunk give both
halves: E + O and E - O (half the products). Each output row is summed in a small buffer and
stored once, cropped, into its tensor. Every value is an integer and every partial sum stays
below the bound aggregate.py checks (sum|v| * max|Bq|^2 < 2^53), so float64 computes them
exactly: grouping, order and FMA contraction cannot change a bit. Each output is stored as
`x + 0.0`, so it never reads -0.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np
import torch
from numba import njit

from dtrain_node.optim import dct


@functools.cache
def placement(shapes: tuple[tuple[int, ...], ...], n: int) -> tuple[np.ndarray, int]:
    """Where each chunk of `shapes` (in order) lands in one flat output holding the tensors back
    to back: rows (offset, row stride, rows inside the tensor, columns inside it), and the
    output's length. A vector of length L is one row of L (its chunks are n-vectors)."""
    rows, at = [], 0
    for shape in shapes:
        v = dct.view2(shape)
        R, C = v if len(v) == 2 else (1, v[0])
        for a in range(-(-R // n)):
            for b in range(-(-C // n)):
                rows.append((at + a * n * C + b * n, C, min(n, R - a * n), min(n, C - b * n)))
        at += R * C
    return np.array(rows, dtype=np.int64).reshape(-1, 4), at


def tensors(
    idx: torch.Tensor, val: torch.Tensor, Bq: torch.Tensor, shapes: Sequence[tuple[int, ...]]
) -> list[torch.Tensor]:
    """The tensors of `shapes` (in order; all matrices or all vectors, as dct.view2 sees them)
    from their chunks' sparse coefficients: idx, val (chunks, m) int64 and exact-integer
    float64, Bq the (n, n) integer basis as float64. Same values, bit for bit, as the dense
    inverse of scatter_add(idx, val)."""
    n = Bq.shape[0]
    kinds = {len(dct.view2(s)) for s in shapes}
    if len(kinds) > 1:
        raise ValueError(f"one call inverts matrices or vectors, not both: {list(shapes)}")
    vector = kinds == {1}
    place, size = placement(tuple(tuple(s) for s in shapes), n)
    if val.shape != idx.shape or Bq.shape != (n, n):
        raise ValueError(
            f"values {tuple(val.shape)} for indices {tuple(idx.shape)}, basis {tuple(Bq.shape)}"
        )
    if place.shape[0] != idx.shape[0]:
        raise ValueError(f"{idx.shape[0]} chunks of coefficients for {place.shape[0]} chunks")
    # the compiled loops do not check bounds: an index outside the chunk must never reach them
    top = n if vector else n * n
    if idx.numel() and not (int(idx.min()) >= 0 and int(idx.max()) < top):
        raise ValueError(f"coefficient index outside [0, {top}): {idx.min()}..{idx.max()}")
    c = np.ascontiguousarray
    out = np.empty(size)
    (_vectors if vector else _matrices)(c(idx.numpy()), c(val.numpy()), c(Bq.numpy()), out, place)
    flat, views, at = torch.from_numpy(out), [], 0
    for s in shapes:
        views.append(flat[at : at + math.prod(s)].view(s))
        at += math.prod(s)
    return views


@functools.cache
def warm() -> None:
    """Compile (or load from numba's cache) ahead of the first round: a node calls this when
    its optimizer starts, so no sync round waits for the compiler."""
    one, Bq = torch.ones(1, 1, dtype=torch.float64), dct.basis_q(4).double()
    for shape in ((4, 4), (4,)):
        tensors(torch.zeros(1, 1, dtype=torch.int64), one, Bq, [shape])


@njit(cache=True, nogil=True)
def _vectors(idx, val, Bq, out, place):  # pragma: no cover - compiled
    n = Bq.shape[0]
    acc = np.empty(n)
    for ch in range(idx.shape[0]):
        acc[:] = 0.0
        for e in range(idx.shape[1]):
            v, r = val[ch, e], idx[ch, e]
            for b in range(n):
                acc[b] += v * Bq[r, b]
        at, cols = place[ch, 0], place[ch, 3]
        for b in range(cols):
            out[at + b] = acc[b] + 0.0


@njit(cache=True, nogil=True)
def _matrices(idx, val, Bq, out, place):  # pragma: no cover - compiled
    nc, m = idx.shape
    n = Bq.shape[0]
    G = np.zeros((m, n + 3))  # 3 spare columns: a last block of 4 rows may read past n
    K = np.zeros((m, n + 3))
    keys = np.empty(m, np.int64)
    slot = np.full(n, -1, np.int64)
    seen = np.zeros((2, n), np.int64)
    acc = np.empty((2, 4, n))
    for ch in range(nc):
        dr, dc = _distinct(idx[ch], n, seen, ch + 1)
        byrow = dc > dr
        w = _group(idx[ch], val[ch], Bq, byrow, G, keys, slot)
        even = _by_parity(G, keys, w, Bq, K)
        if byrow:
            _rows_mirrored(G, K, even, w, acc, out, place[ch])
        else:
            _columns_mirrored(G, K, even, w, acc, out, place[ch])


@njit(cache=True, nogil=True)
def _columns_mirrored(G, K, even, w, acc, out, place):  # pragma: no cover - compiled
    """A chunk grouped by column: X[a, b] = sum_j G[j, a] Bq[keys[j], b] with K[j] =
    Bq[keys[j]], even keys first; columns b and n - 1 - b come from the same products."""
    n = acc.shape[2]
    h = (n + 1) // 2
    at, stride, rows, cols = place[0], place[1], place[2], place[3]
    for a in range(0, rows, 4):
        acc[:, :, :h] = 0.0
        _four_rows(acc[0], G, K, 0, even, a, h)
        _four_rows(acc[1], G, K, even, w, a, h)
        for i in range(min(4, rows - a)):
            o = at + (a + i) * stride
            for b in range(min(h, cols)):
                out[o + b] = acc[0, i, b] + acc[1, i, b] + 0.0
            for b in range(h, cols):
                out[o + b] = acc[0, i, n - 1 - b] - acc[1, i, n - 1 - b] + 0.0


@njit(cache=True, nogil=True)
def _rows_mirrored(G, K, even, w, acc, out, place):  # pragma: no cover - compiled
    """A chunk grouped by row: X[a, b] = sum_j Bq[keys[j], a] G[j, b] with K[j] =
    Bq[keys[j]], even keys first; rows a and n - 1 - a come from the same products."""
    n = acc.shape[2]
    h = (n + 1) // 2
    at, stride, rows, cols = place[0], place[1], place[2], place[3]
    for a in range(0, h, 4):
        acc[:, :, :cols] = 0.0
        _four_rows(acc[0], K, G, 0, even, a, cols)
        _four_rows(acc[1], K, G, even, w, a, cols)
        for i in range(min(4, h - a)):
            r, q = a + i, n - 1 - a - i
            if r < rows:
                for b in range(cols):
                    out[at + r * stride + b] = acc[0, i, b] + acc[1, i, b] + 0.0
            if q != r and q < rows:
                for b in range(cols):
                    out[at + q * stride + b] = acc[0, i, b] - acc[1, i, b] + 0.0


@njit(cache=True, nogil=True, fastmath={"contract"})
def _four_rows(acc, S, X, j0, j1, a, nb):  # pragma: no cover - compiled
    """acc[i, :nb] += sum over j in [j0, j1) of S[j, a + i] X[j, :nb], for i < 4: four output
    rows share each load of X[j]."""
    for j in range(j0, j1):
        s0, s1, s2, s3 = S[j, a], S[j, a + 1], S[j, a + 2], S[j, a + 3]
        for b in range(nb):
            x = X[j, b]
            acc[0, b] += s0 * x
            acc[1, b] += s1 * x
            acc[2, b] += s2 * x
            acc[3, b] += s3 * x


@njit(cache=True, nogil=True)
def _by_parity(G, keys, w, Bq, K):  # pragma: no cover - compiled
    """Put the even keys first (moving G's rows along) and fill K[j] = Bq[keys[j]]; returns the
    number of even keys."""
    n = Bq.shape[0]
    even = 0
    for j in range(w):
        if keys[j] % 2 == 0:
            if j != even:
                keys[j], keys[even] = keys[even], keys[j]
                for b in range(n):
                    G[j, b], G[even, b] = G[even, b], G[j, b]
            even += 1
    for j in range(w):
        for b in range(n):
            K[j, b] = Bq[keys[j], b]
    return even


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

"""Compiled reads and writes of packet fields, with numba: the encoder's bit packing
(codec.py) and, from a round's decoded packets (codec.Decoded value arrays), the exact integer
entries of an aggregation group (aggregate.py) and the level dot products of the robust screen
(robust.py). All are integer arithmetic only, so they give the very numbers (and bytes) of the
numpy and torch code they stand in for; the tests compare the two on every path.

The reads take per sender rows of one field width: `idx[s]` the indices and `lvl[s]` the levels of
the tensors read, chunk after chunk, k entries per chunk, strictly increasing within a chunk
(the decoder checks that before a packet is Decoded).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

SHIFT_CAP = 16  # a right shift of an int8 level by more than 8 bits leaves 0 anyway


def entries(
    idx: np.ndarray, lvl: np.ndarray, shift: np.ndarray, rows: np.ndarray, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """A group's entries with every sender's side by side: rows are the chunks in tensor order,
    columns the senders' k entries in sender order; values lvl * 2^shift[s, t] as int64, a
    negative shift rounding half away from zero. `rows[t]` chunks belong to tensor t."""
    S, R = idx.shape[0], int(rows.sum())
    if idx.shape != lvl.shape or idx.shape[1] != R * k or shift.shape != (S, len(rows)):
        raise ValueError(f"entries: {idx.shape} indices, {lvl.shape} levels, shifts {shift.shape}")
    out_i, out_v = np.empty((R, S * k), np.int64), np.empty((R, S * k), np.int64)
    _entries(idx, lvl, shift, rows, k, out_i, out_v)
    return out_i, out_v


@njit(cache=True, nogil=True)
def _entries(idx, lvl, shift, rows, k, out_i, out_v):  # pragma: no cover - compiled
    S = idx.shape[0]
    r = 0
    for t in range(rows.shape[0]):
        for _ in range(rows[t]):
            for s in range(S):
                m = shift[s, t]
                d = min(-m, SHIFT_CAP)
                for j in range(k):
                    v = np.int64(lvl[s, r * k + j])
                    if m >= 0:
                        v = v << m
                    else:
                        a = (abs(v) + ((1 << d) >> 1)) >> d
                        v = -a if v < 0 else a
                    out_i[r, s * k + j] = idx[s, r * k + j]
                    out_v[r, s * k + j] = v
            r += 1


def dots(idx: np.ndarray, lvl: np.ndarray, tensors: np.ndarray) -> np.ndarray:
    """Per tensor t = (first entry, chunks, k) of the rows: D[t, a, b] = the sum, over the
    (chunk, index) pairs both senders a and b sent, of lvl_a * lvl_b (int64; |D| is at most
    9 x entries, far inside int64)."""
    if idx.shape != lvl.shape or tensors.ndim != 2 or tensors.shape[1] != 3:
        raise ValueError(f"dots: {idx.shape} indices, {lvl.shape} levels, {tensors.shape}")
    if tensors.size and int((tensors[:, 0] + tensors[:, 1] * tensors[:, 2]).max()) > idx.shape[1]:
        raise ValueError(f"dots: tensors reach past the {idx.shape[1]} entries per sender")
    if tensors.size and int(tensors.min()) < 0:
        raise ValueError("dots: negative entry, chunk count or k")
    out = np.zeros((tensors.shape[0], idx.shape[0], idx.shape[0]), np.int64)
    _dots(idx, lvl, tensors, out)
    return out


@njit(cache=True, nogil=True)
def _dots(idx, lvl, tensors, out):  # pragma: no cover - compiled
    S = idx.shape[0]
    for t in range(tensors.shape[0]):
        start, nc, k = tensors[t, 0], tensors[t, 1], tensors[t, 2]
        for c in range(nc):
            lo = start + c * k
            for a in range(S):
                for b in range(a, S):
                    i, j, acc = lo, lo, 0
                    while i < lo + k and j < lo + k:  # merge two ascending runs
                        x, y = idx[a, i], idx[b, j]
                        if x == y:
                            acc += np.int64(lvl[a, i]) * np.int64(lvl[b, j])
                        i += x <= y
                        j += y <= x
                    out[t, a, b] += acc
        for a in range(S):
            for b in range(a + 1, S):
                out[t, b, a] = out[t, a, b]


def put_bits(buf: np.ndarray, values: np.ndarray, first: np.ndarray) -> None:
    """OR each value into the uint8 buffer, least significant bit at bit `first[i]` (bit 0 is
    the LSB of byte 0). A value must fit below the next field (the codec checks its bound before
    it packs); here negative input and the buffer's end are refused."""
    if values.shape != first.shape:
        raise ValueError(f"put_bits: {values.shape} values for {first.shape} positions")
    if values.size and (int(values.min()) < 0 or int(first.min()) < 0):
        raise ValueError("put_bits: negative value or bit position")
    top = int(first.max()) // 8 + (int(values.max()).bit_length() + 7) // 8 if values.size else 0
    if top + 1 > len(buf):
        raise ValueError(f"put_bits: a field reaches past the {len(buf)}-byte buffer")
    _put_bits(buf, values, first)


@njit(cache=True, nogil=True)
def _put_bits(buf, values, first):  # pragma: no cover - compiled
    for i in range(values.shape[0]):
        x, b = values[i] << (first[i] & 7), first[i] >> 3
        while x:
            buf[b] |= x & 0xFF
            x >>= 8
            b += 1


def get_bits(
    raw: np.ndarray, first: np.ndarray, w: int, hi: np.ndarray, step: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The w-bit fields (w <= 24) of every row of raw (packets of one length, uint8) whose least
    significant bits sit at bit `first[i]`, as int64; and per row whether every value is below
    hi[i] and, where step[i], above the value before it."""
    if not (first.shape == hi.shape == step.shape and 1 <= w <= 24 and raw.ndim == 2):
        raise ValueError(f"get_bits: {first.shape} fields of {w} bits in {raw.shape} bytes")
    if first.size and (int(first.min()) < 0 or (int(first.max()) + w + 7) // 8 > raw.shape[1]):
        raise ValueError(f"get_bits: a field lies outside the {raw.shape[1]}-byte rows")
    out, ok = np.empty((raw.shape[0], first.size), np.int64), np.ones(raw.shape[0], np.bool_)
    _get_bits(raw, first, w, hi, step, out, ok)
    return out, ok


@njit(cache=True, nogil=True)
def _get_bits(raw, first, w, hi, step, out, ok):  # pragma: no cover - compiled
    L, mask = raw.shape[1], (1 << w) - 1
    for p in range(raw.shape[0]):
        prev = 0
        for i in range(first.shape[0]):
            b, x = first[i] >> 3, np.int64(0)
            for q in range(min(4, L - b)):  # 4 bytes hold any field of <= 24 bits + a shift
                x |= np.int64(raw[p, b + q]) << (8 * q)
            v = (x >> (first[i] & 7)) & mask
            out[p, i] = v
            if v >= hi[i] or (step[i] and v <= prev):
                ok[p] = False
            prev = v


@functools.cache
def warm() -> None:
    """Compile (or load from numba's cache) ahead of the first round."""
    one = np.ones((1, 1), np.int64)
    entries(one, np.ones((1, 1), np.int8), np.zeros((1, 1), np.int64), np.ones(1, np.int64), 1)
    dots(one, np.ones((1, 1), np.int8), np.array([[0, 1, 1]], np.int64))
    put_bits(np.zeros(2, np.uint8), np.ones(1, np.int64), np.zeros(1, np.int64))
    z, raw = np.zeros(1, np.int64), np.zeros((1, 2), np.uint8)
    get_bits(raw, z, 1, z + 2, np.zeros(1, np.bool_))
    raw.flags.writeable = False  # packets arrive as bytes: read-only arrays, their own signature
    get_bits(raw, z, 1, z + 2, np.zeros(1, np.bool_))

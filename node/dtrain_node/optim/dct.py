"""Chunked orthonormal DCT-II: float (local path) and a fixed-point integer table (shared path).

Layout rules (one place, used by compression, codec and aggregation):
- 2-D tensor (R, C): zero-padded to (ceil(R/n)*n, ceil(C/n)*n), cut into n x n blocks, block
  (i, j) is chunk i * (C'/n) + j; each block is transformed as B @ X @ B^T.
- 1-D tensor (L,): zero-padded to ceil(L/n)*n and cut into n-vectors, each transformed as B @ x.
- 0-D tensors are treated as 1-D of length 1; tensors with more than 2 dims are flattened to
  (shape[0], prod(shape[1:])) and then treated as 2-D.
Padding never disables compression: a padded block's coefficients are all meaningful (the
inverse transform fills the pad region too, and it is cropped away), so every index is valid.
"""

from __future__ import annotations

import hashlib
import math
from functools import cache

import torch

N = 64  # default chunk side: 64x64 blocks (4096 coefficients) for matrices, 64 for vectors
QBITS = 15  # fixed-point scale of the integer basis: Bq = round(B * 2^15)


def basis(n: int = N) -> torch.Tensor:
    """Orthonormal DCT-II matrix B (float64), rows are frequencies: coefficients = B @ x.

    The cosines come from math.cos (the C library's, one entry at a time on this thread), not
    torch.cos: on a float64 tensor of more than 2048 entries torch.cos runs MKL's vector cosine
    on several threads, and its first call in a process now and then returns the part a worker
    thread computed with only ~1e-8 relative accuracy (torch 2.13, MKL 2024.2, 2 threads: about
    1 process in 20). _basis64 caches the first basis of the process, so every float transform
    of that process was then orthonormal only to ~1e-8.
    """
    s = math.sqrt(2.0 / n)
    B = torch.tensor(
        [[math.cos(math.pi * (2 * j + 1) * k / (2 * n)) * s for j in range(n)] for k in range(n)],
        dtype=torch.float64,
    )
    B[0] /= math.sqrt(2.0)
    return B


@cache
def _basis64(n: int) -> torch.Tensor:
    return basis(n)


@cache
def basis_as(n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The float basis converted once per (n, dtype, device): the very values of
    basis(n).to(dtype), so every transform gives the same bits as converting on each call."""
    return _basis64(n).to(device=device, dtype=dtype)


@cache
def basis_q(n: int = N) -> torch.Tensor:
    """Fixed-point basis Bq = round(B * 2^15) as int64, identical on every machine.

    Built from float64 cosines, so we check it is far from rounding ties: a different libm
    could otherwise move an entry by one unit. The table's sha256 is pinned in a test.
    """
    x = _basis64(n) * 2.0**QBITS
    frac = (x - x.floor() - 0.5).abs()
    if float(frac.min()) < 1e-6:
        raise ValueError(f"DCT basis n={n} has an entry within 1e-6 of a rounding tie")
    return torch.round(x).to(torch.int64)


@cache
def basis_has_zero(n: int = N) -> bool:
    """Whether Bq has an entry 0 (never for powers of two: cos(pi (2j+1) r / 2n) is 0 only
    when (2j+1) r is an odd multiple of n)."""
    return bool((basis_q(n) == 0).any())


def basis_q_sha256(n: int = N) -> str:
    """sha256 of the integer basis as little-endian int64 bytes, row-major."""
    return hashlib.sha256(basis_q(n).numpy().astype("<i8").tobytes()).hexdigest()


def view2(shape: torch.Size | tuple[int, ...]) -> tuple[int, ...]:
    """Logical shape the transform sees: (L,) for 0-D/1-D, (R, C) for 2-D and higher."""
    if len(shape) == 0:
        return (1,)
    if len(shape) == 1:
        return (int(shape[0]),)
    return (int(shape[0]), math.prod(int(s) for s in shape[1:]))


def nchunks(shape: torch.Size | tuple[int, ...], n: int = N) -> int:
    """Number of chunks of a tensor of this shape."""
    v = view2(shape)
    if len(v) == 1:
        return -(-v[0] // n)
    return (-(-v[0] // n)) * (-(-v[1] // n))


def chunk_elems(shape: torch.Size | tuple[int, ...], n: int = N) -> int:
    """Coefficients per chunk: n*n for matrices, n for vectors."""
    return n if len(view2(shape)) == 1 else n * n


def to_chunks(x: torch.Tensor, n: int = N) -> torch.Tensor:
    """Pad and cut into chunks: (nchunks, n) for 1-D views, (nchunks, n, n) for 2-D views."""
    v = view2(x.shape)
    x = x.reshape(v)
    if len(v) == 1:
        L = -(-v[0] // n) * n
        return torch.nn.functional.pad(x, (0, L - v[0])).reshape(-1, n)
    R, C = -(-v[0] // n) * n, -(-v[1] // n) * n
    x = torch.nn.functional.pad(x, (0, C - v[1], 0, R - v[0]))
    return x.reshape(R // n, n, C // n, n).permute(0, 2, 1, 3).reshape(-1, n, n)


def from_chunks(c: torch.Tensor, shape: torch.Size | tuple[int, ...], n: int = N) -> torch.Tensor:
    """Inverse of to_chunks: reassemble, crop the padding and restore the original shape."""
    v = view2(shape)
    if len(v) == 1:
        return c.reshape(-1)[: v[0]].reshape(shape)
    r, cc = -(-v[0] // n), -(-v[1] // n)
    x = c.reshape(r, cc, n, n).permute(0, 2, 1, 3).reshape(r * n, cc * n)
    return x[: v[0], : v[1]].reshape(shape)


def dct(x: torch.Tensor, n: int = N) -> torch.Tensor:
    """Forward chunked DCT-II of x (any shape): returns (nchunks, chunk_elems) coefficients."""
    c = to_chunks(x, n)
    B = basis_as(n, x.dtype, x.device)
    if c.dim() == 2:
        return c @ B.T
    return (B @ c @ B.T).reshape(c.shape[0], -1)


def idct(coef: torch.Tensor, shape: torch.Size | tuple[int, ...], n: int = N) -> torch.Tensor:
    """Inverse of dct: (nchunks, chunk_elems) coefficients -> tensor of the given shape."""
    B = basis_as(n, coef.dtype, coef.device)
    if len(view2(shape)) == 1:
        return from_chunks(coef @ B, shape, n)
    c = coef.reshape(-1, n, n)
    return from_chunks(B.T @ c @ B, shape, n)


def ichunks_sparse(
    idx: torch.Tensor, val: torch.Tensor, n: int, vector: bool, B: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse transform of sparse coefficients, chunk-wise: idx, val (nchunks, m) -> chunks
    (nchunks, n) if `vector` else (nchunks, n, n).

    Same as inverting scatter_add(idx, val) (repeated indices sum) at O(m n^2) per chunk
    instead of O(n^3): X = sum_e val_e * outer(B[r_e], B[c_e]) with idx_e = r_e * n + c_e.
    B defaults to the float basis; aggregation passes the integer basis as float64.
    """
    if B is None:
        B = basis_as(n, val.dtype, val.device)
    if vector:
        return (val.unsqueeze(1) @ B[idx]).squeeze(1)  # (nc, 1, m) @ (nc, m, n)
    r, c = idx.div(n, rounding_mode="floor"), idx.remainder(n)
    return (B[r] * val.unsqueeze(2)).transpose(1, 2) @ B[c]  # (nc, n, m) @ (nc, m, n)


def idct_sparse(
    idx: torch.Tensor, val: torch.Tensor, shape: torch.Size | tuple[int, ...], n: int = N
) -> torch.Tensor:
    """idct of sparse coefficients (nchunks, m) straight to a tensor of `shape`."""
    vector = len(view2(shape)) == 1
    return from_chunks(ichunks_sparse(idx, val, n, vector), shape, n)

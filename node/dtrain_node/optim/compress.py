"""Top-k per DCT chunk, power-of-two quantization and error feedback (the local, float path).

A tensor's transmitted part is a `Sparse`: per chunk the k coefficient indices (sorted
ascending, unique) and their integer levels, plus one scale exponent for the whole tensor, so
the value of entry j is lvl[j] * 2^exp. Levels are +-1 (1 bit, sign) or +-1, +-3 (2 bits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dtrain_node.optim import dct

EXP_MIN, EXP_MAX = -100, 20  # allowed scale exponents; a tensor needing more is broken
LEVELS = {1: (-1, 1), 2: (-3, -1, 1, 3)}  # code c (an unsigned int) -> level LEVELS[bits][c]
K_AUTO = -1  # CompressConfig.k_token: chosen by segments.plan from the model's shapes


@dataclass(frozen=True)
class CompressConfig:
    """Compression parameters; every node of a job must use the same ones (bound in the packet).

    chunk: side of a DCT block (64 -> 64x64 = 4096 coefficients per matrix chunk, 64 per vector
    chunk). k2d / k1d: coefficients kept per matrix / vector chunk. bits: 1 (sign) or 2 (levels).
    Token tensors (the input embedding and the output head, whose rows are unrelated tokens
    and move only when their token is in the batch): k_token coefficients per chunk (0: k2d;
    K_AUTO: the most the upload budget allows, segments.plan) and one scale per block of
    token_rows rows (0: one per tensor), so that a block nobody's batch touched sends its k
    values at 2^EXP_MIN instead of at the busy blocks' scale. ring: the members of the dense
    bf16 ring all-reduce whose upload bounds K_AUTO's budget (the job's seats).
    k_mean (0: off): an output head's whole blocks of rows beyond the tokenizer's length are
    sent as one mean row, a vector tensor with k_mean coefficients per vector chunk applied to
    every row of the head. Rows no token reaches move together (the softmax pushes all their
    logits down along the same hidden direction), so their blocks would spend the token k on
    one move (segments.plan).
    """

    chunk: int = dct.N
    k2d: int = 4
    k1d: int = 1
    bits: int = 1
    k_token: int = 0
    token_rows: int = 0
    ring: int = 4
    k_mean: int = 0

    def __post_init__(self) -> None:
        if not 2 <= self.chunk <= 64:
            raise ValueError(f"chunk must be in [2, 64], got {self.chunk}")
        if not 1 <= self.k2d <= self.chunk**2:
            raise ValueError(f"k2d must be in [1, {self.chunk**2}], got {self.k2d}")
        if not 1 <= self.k1d <= self.chunk:
            raise ValueError(f"k1d must be in [1, {self.chunk}], got {self.k1d}")
        if self.bits not in LEVELS:
            raise ValueError(f"bits must be 1 or 2, got {self.bits}")
        if not (self.k_token == K_AUTO or 0 <= self.k_token <= self.chunk**2):
            raise ValueError(
                f"k_token must be in [0, {self.chunk**2}] or {K_AUTO} (auto), got {self.k_token}"
            )
        if self.token_rows < 0 or self.token_rows % self.chunk:
            raise ValueError(
                f"token_rows must be 0 or a multiple of chunk {self.chunk}, got {self.token_rows}"
            )
        if not 0 <= self.k_mean <= self.chunk:
            raise ValueError(f"k_mean must be in [0, {self.chunk}], got {self.k_mean}")
        if self.ring < 2:
            raise ValueError(f"ring must count at least 2 members, got {self.ring}")

    def k(self, shape: torch.Size | tuple[int, ...], token: bool = False) -> int:
        if len(dct.view2(shape)) == 1:
            return self.k1d
        if token and self.k_token == K_AUTO:
            raise ValueError("k_token is auto: segments.plan resolves it for a model")
        return (self.k_token or self.k2d) if token else self.k2d

    @property
    def tokens_apart(self) -> bool:
        """Whether token tensors are compressed otherwise than the other matrices."""
        return bool((self.k_token and self.k_token != self.k2d) or self.token_rows or self.k_mean)

    def index_bits(self, shape: torch.Size | tuple[int, ...]) -> int:
        """Width of one packed index: 12 for a 4096-chunk, 6 for a 64-chunk."""
        return max(1, math.ceil(math.log2(dct.chunk_elems(shape, self.chunk))))

    @property
    def max_level(self) -> int:
        return max(LEVELS[self.bits])


@dataclass
class Sparse:
    """Transmitted part of one tensor: idx (nchunks, k) int64, lvl (nchunks, k) int8, exp int."""

    idx: torch.Tensor
    lvl: torch.Tensor
    exp: int

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sparse):
            return NotImplemented
        return (
            self.exp == other.exp
            and torch.equal(self.idx, other.idx)
            and torch.equal(self.lvl, other.lvl)
        )

    __hash__ = None  # type: ignore[assignment]


GROUP = 64  # top-k of a long row looks only inside the k groups of GROUP with the largest max


def topk(coef: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest |coef| per chunk (row), sorted ascending within each row.

    A long row is cut into groups of GROUP entries. The k largest entries lie in the k groups
    with the largest maxima (a group outside them has k groups above it, each holding an entry
    at least as large), so a cheap max per group and a top-k over k x GROUP entries replace
    one top-k pass over the row: the same values, about 2x faster at 4096 per row and small k.
    """
    a = coef.abs()
    rows, width = a.shape
    if width < 16 * GROUP or width % GROUP or k > width // (4 * GROUP):
        return torch.topk(a, k, dim=1, sorted=False).indices.sort(dim=1).values
    groups = a.view(rows, width // GROUP, GROUP)
    top = torch.topk(groups.amax(2), k, dim=1, sorted=False).indices  # (rows, k)
    cand = groups.gather(1, top.unsqueeze(2).expand(rows, k, GROUP)).reshape(rows, k * GROUP)
    pick = torch.topk(cand, k, dim=1, sorted=False).indices
    start = top.gather(1, pick.div(GROUP, rounding_mode="floor")) * GROUP
    return (start + pick.remainder(GROUP)).sort(dim=1).values


def quantize(v: torch.Tensor, bits: int) -> tuple[torch.Tensor, int]:
    """Quantize values to integer levels and one power-of-two scale exponent.

    The scale is 2^round(log2(mean|v|)) for signs (mean|v| is the L2-optimal sign scale) and half
    that for 2-bit levels, so that +-1, +-3 straddle the mean. Raises on non-finite input.
    """
    if v.numel() == 0:
        return torch.zeros(v.shape, dtype=torch.int8), EXP_MIN
    exp = scale_exp(v, bits)
    return levels(v, 2.0**-exp, bits), exp


def scale_exp(v: torch.Tensor, bits: int) -> int:
    """The scale exponent quantize picks for v (EXP_MIN for an empty or all-zero v)."""
    if v.numel() == 0:
        return EXP_MIN
    # the float64 mean of float32 magnitudes is finite exactly when every value is finite
    m = float(v.abs().double().mean())
    if not math.isfinite(m):
        raise ValueError("cannot quantize non-finite values")
    if m == 0.0:
        return EXP_MIN
    exp = round(math.log2(m)) - (bits - 1)
    if exp > EXP_MAX:
        raise ValueError(f"scale 2^{exp} above 2^{EXP_MAX}: values too large (mean {m:.3g})")
    return max(exp, EXP_MIN)


def levels(v: torch.Tensor, inv_scale: float | torch.Tensor, bits: int) -> torch.Tensor:
    """int8 levels of v at scale 1 / inv_scale (a float, or float64 values broadcast to v)."""
    if bits == 1:
        lvl = torch.where(v >= 0, 1, -1)
    else:
        u = v.double() * inv_scale  # a power of two: exact
        lvl = (2 * torch.floor(u / 2) + 1).clamp(-3, 3)
    return lvl.to(torch.int8)


def dequantize(lvl: torch.Tensor, exp: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return lvl.to(dtype) * 2.0**exp


def compress(x: torch.Tensor, cfg: CompressConfig) -> Sparse:
    """DCT x chunk-wise, keep the top-k coefficients per chunk and quantize them."""
    coef = dct.dct(x.detach(), cfg.chunk)
    idx = topk(coef, cfg.k(x.shape))
    lvl, exp = quantize(coef.gather(1, idx), cfg.bits)
    return Sparse(idx, lvl, exp)


def decompress(
    s: Sparse, shape: torch.Size | tuple[int, ...], cfg: CompressConfig, dtype=torch.float32
) -> torch.Tensor:
    """Float reconstruction of one sender's transmitted tensor (local path, not bit-exact)."""
    return dct.idct_sparse(s.idx, dequantize(s.lvl, s.exp, dtype), shape, cfg.chunk)


def compress_ef(e: torch.Tensor, cfg: CompressConfig) -> Sparse:
    """Compress the error-feedback buffer e and subtract what is transmitted from it, in place.

    Afterwards (transmitted + e_new) == e_old up to float rounding: nothing is lost, what was
    not sent stays in e for later rounds.
    """
    s = compress(e, cfg)
    e.sub_(decompress(s, e.shape, cfg, e.dtype))
    return s

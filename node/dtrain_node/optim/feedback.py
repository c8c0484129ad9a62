"""The error-feedback momentum e, held as DCT coefficients.

The DCT is orthonormal and linear, so DCT(beta * e + delta) = beta * DCT(e) + DCT(delta): a
node can keep e in the coefficient domain, where the compressor works anyway. A round then costs
one forward DCT of the pseudo-gradient (fused with the fold into e) and the transmitted part is
taken out of e by writing k entries per chunk, not by an inverse transform. e is local state:
only the packets it yields are shared, and aggregate.py makes their sum exact.

Layout: every matrix chunk of every tensor sits in one buffer `mat` of shape (n, chunks, n),
indexed (row frequency, chunk, column frequency). That layout makes both halves of the
2-D transform flat matrix products over all chunks at once (B @ X per chunk is B times the
chunks laid side by side; X @ B^T per chunk is one product over all rows), and each chunk row
(the n coefficients of one row frequency) is contiguous, which is what the grouped top-k reads.
Vector chunks sit in `vec`, (chunks, n). Chunking and padding follow dct.py.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dtrain_node.optim import dct, select
from dtrain_node.optim.compress import EXP_MAX, CompressConfig, Sparse

# |coefficient| bound: keeps every scale exponent <= EXP_MAX (mean |v| <= 2^EXP_MAX)
C_MAX = 2.0**EXP_MAX
LAYOUT = "dct-rcc-1"  # (row frequency, chunk, column frequency); saved with the state


class Feedback:
    """e for tensors of the given shapes (one CompressConfig), float32 on the CPU. `ks` are
    the matrices' coefficients per chunk when they differ (token tensors: codec.Spec); the
    matrices of one k then sit side by side in `mat`, in order of first appearance."""

    def __init__(
        self,
        shapes: Sequence[tuple[int, ...]],
        cfg: CompressConfig,
        ks: Sequence[int] = (),
    ) -> None:
        self.cfg, self.shapes = cfg, [tuple(s) for s in shapes]
        n = cfg.chunk
        self.mats = [i for i, s in enumerate(self.shapes) if len(dct.view2(s)) == 2]
        self.vecs = [i for i, s in enumerate(self.shapes) if len(dct.view2(s)) == 1]
        self.counts = {i: dct.nchunks(s, n) for i, s in enumerate(self.shapes)}
        k_of = {i: ks[i] if ks else cfg.k2d for i in self.mats}
        k_of |= {i: ks[i] if ks else cfg.k1d for i in self.vecs}
        self.start: dict[int, int] = {}
        # per k: (k, its tensors, their first chunk, their chunk count) in `mat` / `vec`
        self.mat_groups = self._place(self.mats, k_of)
        self.vec_groups = self._place(self.vecs, k_of)
        nm, nv = sum(self.counts[i] for i in self.mats), sum(self.counts[i] for i in self.vecs)
        self.mat = torch.zeros(n, nm, n)
        self.vec = torch.zeros(nv, n)
        # a round's delta in the layout and B @ delta: kept, because fresh buffers of this size
        # are fresh pages each round (a fold per tensor through a small scratch measured
        # ~1 ms slower per round in the training loop: more, smaller products)
        self._delta = (torch.empty_like(self.mat), torch.empty_like(self.vec))
        self._half = torch.empty(n, nm * n)
        self._edges = (self._edge(self.mats), self._edge(self.vecs))

    def _place(
        self, tensors: list[int], k_of: dict[int, int]
    ) -> list[tuple[int, list[int], int, int]]:
        """Chunk positions for `tensors`, those of one k side by side (first appearance order)."""
        by_k: dict[int, list[int]] = {}
        for i in tensors:
            by_k.setdefault(k_of[i], []).append(i)
        groups, at = [], 0
        for k, group in by_k.items():
            first = at
            for i in group:
                self.start[i], at = at, at + self.counts[i]
            groups.append((k, group, first, at - first))
        return groups

    def _edge(self, group: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Positions and masks (1 inside the tensor, 0 in the padding) of the group's chunks
        that reach into padding; None if no chunk does."""
        n, pos, masks = self.cfg.chunk, [], []
        for i in group:
            v = dct.view2(self.shapes[i])
            R, C = (1, v[0]) if len(v) == 1 else v
            ra, cb = -(-R // n), -(-C // n)
            # only the last row and the last column of blocks can reach into padding
            edge = {(ra - 1, b) for b in range(cb)} if R % n else set()
            edge |= {(a, cb - 1) for a in range(ra)} if C % n else set()
            for a, b in sorted(edge):
                rows, cols = min(n, R - a * n), min(n, C - b * n)
                m = torch.zeros(n, n) if len(v) == 2 else torch.zeros(n)
                m[..., :cols] = 1.0
                if len(v) == 2:
                    m[rows:] = 0.0
                pos.append(self.start[i] + a * cb + b)
                masks.append(m)
        return (torch.tensor(pos), torch.stack(masks)) if pos else None

    # ------------------------------------------------------------------ state

    def state(self) -> dict:
        return {"layout": LAYOUT, "mat": self.mat, "vec": self.vec}

    def load(self, state: dict) -> None:
        """Restore a saved state; ValueError if it was saved in another layout or shape."""
        if not isinstance(state, dict) or state.get("layout") != LAYOUT:
            raise ValueError(f"error feedback saved in another layout (want {LAYOUT})")
        for name in ("mat", "vec"):
            have, want = tuple(state[name].shape), tuple(getattr(self, name).shape)
            if have != want:
                raise ValueError(f"error feedback {name}: saved {have}, model needs {want}")
        self.mat.copy_(state["mat"])
        self.vec.copy_(state["vec"])

    def coefficients(self, i: int) -> torch.Tensor:
        """Tensor i's e as (chunks, chunk elements), row-major within a chunk (a copy)."""
        n, s, c = self.cfg.chunk, self.start[i], self.counts[i]
        if i in self.vecs:
            return self.vec[s : s + c].clone()
        return self.mat[:, s : s + c].permute(1, 0, 2).reshape(c, n * n)

    # ------------------------------------------------------------------ a round

    def fold(
        self,
        beta: float,
        a: Sequence[torch.Tensor],
        b: Sequence[torch.Tensor | None] | None = None,
    ) -> None:
        """e = beta * e + DCT(delta) with delta = a - b (or a, where b or b[i] is None), per
        tensor, on the CPU."""
        n = self.cfg.chunk
        xm, xv = self._delta
        for i in self.mats:
            dst = xm[:, self.start[i] : self.start[i] + self.counts[i]]
            self._chunks_into(dst, a[i], None if b is None else b[i])
        for i in self.vecs:
            bi = None if b is None else b[i]
            x = a[i] if bi is None else a[i] - bi
            dst = xv[self.start[i] : self.start[i] + self.counts[i]]
            dst.copy_(dct.to_chunks(x.reshape(-1), n))
        B = dct.basis_as(n, torch.float32)
        nm = xm.shape[1]
        if nm:  # e = beta e + (B @ X) @ B^T, both as flat products over all chunks
            y = torch.mm(B, xm.view(n, nm * n), out=self._half).view(n * nm, n)
            self.mat.view(n * nm, n).addmm_(y, B.T, beta=beta)
        if xv.shape[0]:
            self.vec.addmm_(xv, B.T, beta=beta)

    def _chunks_into(self, dst: torch.Tensor, a: torch.Tensor, b: torch.Tensor | None) -> None:
        """Write the matrix chunks of a - b (or a) into dst, an (n, chunks, n) slice of the
        layout; unpadded float32 tensors go there in one pass, without a temporary."""
        n = self.cfg.chunk
        R, C = dct.view2(a.shape)
        if R % n or C % n:  # padded: through dct.to_chunks
            x = (a if b is None else a - b).reshape(R, C)
            dst.copy_(dct.to_chunks(x, n).permute(1, 0, 2))
            return
        out = dst.view(n, R // n, C // n, n)

        def grid(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(R // n, n, C // n, n).permute(1, 0, 2, 3)

        if b is None:
            out.copy_(grid(a))
        elif a.dtype == b.dtype == torch.float32:
            torch.sub(grid(a), grid(b), out=out)
        else:
            out.copy_(grid(a - b))

    def take(self) -> list[Sparse]:
        """Top-k of every chunk of e, quantized with one scale exponent per tensor, and taken
        out of e (what is not sent stays for later rounds). Returns one Sparse per tensor.

        First a non-finite coefficient becomes 0 and every one is clamped to [-C_MAX, C_MAX]:
        a broken local state must not stop the node (quantization would raise)."""
        out: list[Sparse | None] = [None] * len(self.shapes)
        for k, group, first, count in self.mat_groups:
            m3 = self.mat if count == self.mat.shape[1] else self.mat[:, first : first + count]
            top = _topk_rows(m3, k)
            if top is None:
                torch.nan_to_num_(m3, 0.0, 0.0, 0.0).clamp_(-C_MAX, C_MAX)
                top = _topk_rows(m3, k)
            self._quantize(m3, group, *top, out)  # type: ignore[misc]
        if self.vecs and not float(self.vec.abs().max()) <= C_MAX:  # false for NaN too
            torch.nan_to_num_(self.vec, 0.0, 0.0, 0.0).clamp_(-C_MAX, C_MAX)
        for k, group, first, count in self.vec_groups:
            v = self.vec[first : first + count]
            idx = torch.topk(v.abs(), k, dim=1, sorted=False).indices.sort(dim=1).values
            self._quantize(v.unsqueeze(0), group, idx, v.gather(1, idx), out)
        self._crop()
        return out  # type: ignore[return-value]

    def give(self, sent: Sequence[Sparse]) -> None:
        """Add what take() returned back into e (the inverse of its take-out, up to float32
        rounding)."""
        n, nm = self.cfg.chunk, self.mat.shape[1]
        for i, sp in enumerate(sent):
            c = torch.arange(self.start[i], self.start[i] + self.counts[i]).unsqueeze(1)
            v = sp.lvl.to(torch.float32).reshape(-1) * 2.0**sp.exp
            if i in self.vecs:
                self.vec.view(-1).index_add_(0, (c * n + sp.idx).reshape(-1), v)
            else:  # (row frequency, chunk, column frequency)
                at = sp.idx.div(n, rounding_mode="floor") * (nm * n) + c * n + sp.idx % n
                self.mat.view(-1).index_add_(0, at.reshape(-1), v)
        self._crop()

    def _crop(self) -> None:
        """Zero the padding of chunks that reach into it. The sent values are spread over a
        whole chunk, padding included; what they leave there is no parameter's error and
        would otherwise be sent again (the spatial e of a padded tensor is cropped the same
        way)."""
        B = dct.basis_as(self.cfg.chunk, torch.float32)
        if self._edges[0] is not None:
            pos, mask = self._edges[0]
            c = self.mat[:, pos].transpose(0, 1)  # (m, n, n)
            x = (B.T @ c @ B) * mask
            self.mat[:, pos] = (B @ x @ B.T).transpose(0, 1)
        if self._edges[1] is not None:
            pos, mask = self._edges[1]
            self.vec[pos] = ((self.vec[pos] @ B) * mask) @ B.T

    def _quantize(self, m3, which, idx, vals, out) -> None:
        """Levels with one scale per tensor of `which` (their chunks in order) into out; what
        is sent is taken out of m3 (select.quantize)."""
        rows = np.array([self.counts[i] for i in which], np.int64)
        lvl, exps = select.quantize(m3, idx, vals, rows, self.cfg.bits)
        split = rows.tolist()
        for i, ix, lv, e in zip(which, idx.split(split), lvl.split(split), exps, strict=True):
            out[i] = Sparse(ix, lv, e)


def _topk_rows(m3: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Indices (row * n + column, ascending) and values of the k largest |e| of every chunk of
    m3, an (n, chunks, n) layout; None if some |e| is above C_MAX or NaN.

    When k <= n / 4 the compiled selection reads only the k rows (row frequencies) with the
    largest maxima (select.py); otherwise one top-k over each chunk's n x n entries."""
    n, nc, _ = m3.shape
    if k <= n // 4:
        return select.topk(m3, k, C_MAX)
    rows = m3.permute(1, 0, 2).reshape(nc, n * n)
    a = rows.abs()
    if not float(a.max()) <= C_MAX:  # false for NaN too
        return None
    idx = torch.topk(a, k, dim=1, sorted=False).indices.sort(dim=1).values
    return idx, rows.gather(1, idx)

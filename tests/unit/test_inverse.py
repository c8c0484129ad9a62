"""The compiled grouped inverse (optim/inverse.py) gives the exact integers of Bq^T A Bq.

Checked against the same transform in pure int64 arithmetic, on chunks that group by column,
by row, not at all, on padded and >2-D shapes, across several buckets, and at the 2^53 bound
that aggregation guarantees (a sender can push sum|A| up to it)."""

from __future__ import annotations

import pytest
import torch

from dtrain_node.optim import dct, inverse
from dtrain_node.optim.aggregate import LIMIT


def _reference(idx: torch.Tensor, val: torch.Tensor, shapes, n: int) -> list[torch.Tensor]:
    Bq = dct.basis_q(n)
    vector = len(dct.view2(shapes[0])) == 1
    A = torch.zeros(idx.shape[0], n if vector else n * n, dtype=torch.int64)
    A.scatter_add_(1, idx, val.to(torch.int64))
    X = A @ Bq if vector else Bq.T @ A.view(-1, n, n) @ Bq  # int64: exact by construction
    counts = [dct.nchunks(s, n) for s in shapes]
    return [dct.from_chunks(x, s, n) for x, s in zip(X.split(counts), shapes, strict=True)]


def _check(idx, val, shapes, n=64) -> list[torch.Tensor]:
    got = inverse.tensors(idx, val.double(), dct.basis_q(n).double(), shapes)
    for g, want in zip(got, _reference(idx, val, shapes, n), strict=True):
        assert g.dtype == torch.float64 and tuple(g.shape) == tuple(want.shape)
        assert torch.equal(g, want.double())
        assert not bool(torch.signbit(g[g == 0]).any())  # +0, never -0
    return got


def _entries(g: torch.Generator, chunks: int, m: int, rows: int, cols: int, n: int = 64):
    """m entries per chunk drawn from `rows` row frequencies and `cols` column frequencies."""
    r = torch.randint(0, rows, (chunks, m), generator=g)
    c = torch.randint(0, cols, (chunks, m), generator=g)
    val = torch.randint(-40, 41, (chunks, m), generator=g)
    return r * n + c, val


@pytest.mark.parametrize(("rows", "cols"), [(64, 3), (3, 64), (64, 64), (1, 1), (20, 16)])
def test_grouped_by_column_or_row_is_exact(rows: int, cols: int) -> None:
    shapes = [(128, 192), (64, 64)]
    idx, val = _entries(torch.Generator().manual_seed(rows * 100 + cols), 7, 48, rows, cols)
    _check(idx, val, shapes)


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8, 31, 32])
def test_small_and_odd_chunks_are_exact(n: int) -> None:
    """Rows (or columns) a and n - 1 - a share their products; an odd n has a middle one."""
    shapes = [(3 * n + 1, 2 * n - 1), (n, n), (1, n + 2)]
    chunks = sum(dct.nchunks(s, n) for s in shapes)
    g = torch.Generator().manual_seed(n)
    for rows, cols in ((n, 1), (1, n), (n, n)):
        idx, val = _entries(g, chunks, 2 * n, rows, cols, n)
        _check(idx, val, shapes, n)


@pytest.mark.parametrize("n", [2, 5, 64])
def test_the_integer_basis_mirrors(n: int) -> None:
    """What the inverse relies on: Bq[k, n - 1 - j] = (-1)^k Bq[k, j], exactly."""
    Bq = dct.basis_q(n)
    sign = (-1) ** torch.arange(n).unsqueeze(1)
    assert torch.equal(Bq.flip(1), sign * Bq)


def test_padded_and_higher_dim_shapes_are_cropped_exactly() -> None:
    shapes = [(100, 70), (3, 40, 7), (1, 65), (130, 64)]
    chunks = sum(dct.nchunks(s) for s in shapes)
    idx, val = _entries(torch.Generator().manual_seed(1), chunks, 24, 64, 64)
    got = _check(idx, val, shapes)
    assert [tuple(x.shape) for x in got] == [tuple(s) for s in shapes]


def test_vectors_are_exact_and_cropped() -> None:
    shapes = [(130,), (), (64,), (1,)]
    chunks = sum(dct.nchunks(s) for s in shapes)
    g = torch.Generator().manual_seed(4)
    idx = torch.randint(0, 64, (chunks, 9), generator=g)
    val = torch.randint(-300, 301, (chunks, 9), generator=g)
    got = _check(idx, val, shapes)
    assert [tuple(x.shape) for x in got] == [tuple(s) for s in shapes]


def test_chunks_of_every_width_are_exact() -> None:
    # from 1 to 64 distinct rows and columns per chunk
    g = torch.Generator().manual_seed(2)
    parts = [_entries(g, 1, 64, w, w) for w in range(1, 65)]
    idx, val = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    _check(idx, val, [(64 * 8, 64 * 8)])


def test_cancelling_entries_read_plus_zero() -> None:
    idx = torch.tensor([[5 * 64 + 9, 5 * 64 + 9, 7 * 64 + 1, 7 * 64 + 1]])
    got = _check(idx, torch.tensor([[3, -3, -2, 2]]), [(64, 64)])
    assert bool((got[0] == 0).all())


def test_values_at_the_exactness_bound_stay_exact() -> None:
    """sum|A| * max|Bq|^2 just below 2^53: what a sender at the largest allowed scale reaches."""
    n, m = 64, 48
    bmax = int(dct.basis_q(n).abs().max())
    per = (LIMIT - 1) // (bmax**2 * m)
    g = torch.Generator().manual_seed(3)
    idx, _ = _entries(g, 4, m, 64, 64)
    sign = torch.randint(0, 2, (4, m), generator=g) * 2 - 1
    val = sign * per
    assert int(val.abs().sum(1).max()) * bmax**2 < LIMIT
    _check(idx, val, [(128, 128)])


def test_chunk_count_must_match_the_shapes() -> None:
    idx, val = torch.zeros(3, 2, dtype=torch.int64), torch.ones(3, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="3 chunks of coefficients for 4 chunks"):
        inverse.tensors(idx, val, dct.basis_q().double(), [(128, 128)])


@pytest.mark.parametrize(("bad", "shape"), [(-1, (64, 64)), (64 * 64, (64, 64)), (64, (64,))])
def test_an_index_outside_the_chunk_is_refused(bad: int, shape) -> None:
    """The compiled loops index without bounds checks; the decoder never yields such an index,
    and the inverse refuses one anyway rather than write outside its buffers."""
    idx = torch.tensor([[3, bad]])
    with pytest.raises(ValueError, match="coefficient index outside"):
        inverse.tensors(idx, torch.ones(1, 2, dtype=torch.float64), dct.basis_q().double(), [shape])


def test_matrices_and_vectors_are_not_mixed() -> None:
    idx, val = torch.zeros(2, 1, dtype=torch.int64), torch.ones(2, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match="matrices or vectors, not both"):
        inverse.tensors(idx, val, dct.basis_q().double(), [(64, 64), (64,)])

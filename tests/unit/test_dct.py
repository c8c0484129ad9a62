import hashlib

import pytest
import torch

from dtrain_node.optim import dct

BASIS_Q_SHA256 = "bd2dd8755b8f36b39baa2ef7dde7b4d710dc0be7929f0f55ce58dbc477047fe8"


@pytest.mark.parametrize("n", [8, 48, 64])
def test_basis_orthonormal(n):
    B = dct.basis(n)
    assert torch.allclose(B @ B.T, torch.eye(n, dtype=torch.float64), atol=1e-13)
    assert torch.allclose(B.T @ B, torch.eye(n, dtype=torch.float64), atol=1e-13)


def test_cached_float_basis_does_not_depend_on_torch_cos(monkeypatch):
    """torch.cos of a float64 tensor (MKL's vector cosine, on several threads) now and then
    returns the part a worker thread computed with only ~1e-8 accuracy on its first call in a
    process; a basis built from it and cached would leave every float transform of that
    process orthonormal only to ~1e-8. Simulate that call: the basis must not change."""
    real = torch.cos

    def inaccurate(x, *args, **kwargs):
        y = real(x, *args, **kwargs)
        half = (torch.arange(y.numel()) >= y.numel() // 2).reshape(y.shape).to(y.dtype)
        return y * (1 + 1e-8 * half)

    monkeypatch.setattr(torch, "cos", inaccurate)
    dct._basis64.cache_clear()
    dct.basis_as.cache_clear()
    try:
        B = dct.basis_as(64, torch.float64)
        assert (B @ B.T - torch.eye(64, dtype=torch.float64)).abs().max() < 1e-14
        assert torch.equal(B, dct.basis(64))
    finally:
        monkeypatch.undo()
        dct._basis64.cache_clear()
        dct.basis_as.cache_clear()


def test_basis_matches_dct_definition():
    # DCT-II of a constant vector puts everything into coefficient 0 (orthonormal scaling)
    c = dct.basis(64) @ torch.ones(64, dtype=torch.float64)
    assert c[0].item() == pytest.approx(8.0)
    assert c[1:].abs().max().item() < 1e-12


def test_integer_basis_is_pinned():
    Bq = dct.basis_q(64)
    assert Bq.dtype == torch.int64 and Bq.shape == (64, 64)
    assert dct.basis_q_sha256(64) == BASIS_Q_SHA256
    raw = hashlib.sha256(Bq.numpy().astype("<i8").tobytes()).hexdigest()
    assert raw == BASIS_Q_SHA256
    assert int(Bq[0, 0]) == 4096  # 2^15 / sqrt(64)
    assert int(Bq.abs().max()) == 5791


@pytest.mark.parametrize(
    "shape", [(64, 64), (128, 192), (100, 70), (3, 5), (130,), (64,), (1,), (), (6, 8, 10)]
)
def test_round_trip(shape):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g, dtype=torch.float64)
    c = dct.dct(x)
    assert c.shape == (dct.nchunks(shape), dct.chunk_elems(shape))
    y = dct.idct(c, shape)
    assert y.shape == x.shape
    assert torch.allclose(x, y, atol=1e-12)


def test_energy_preserved_per_chunk():
    x = torch.randn(128, 64, dtype=torch.float64)
    c = dct.dct(x)
    chunks = dct.to_chunks(x).reshape(2, -1)
    assert torch.allclose(c.pow(2).sum(1), chunks.pow(2).sum(1))


def test_chunk_layout_2d():
    # block (i, j) of a 128x192 matrix is chunk i * 3 + j
    x = torch.arange(128 * 192, dtype=torch.float64).reshape(128, 192)
    ch = dct.to_chunks(x)
    assert ch.shape == (6, 64, 64)
    assert torch.equal(ch[4], x[64:128, 64:128])
    assert torch.equal(dct.from_chunks(ch, x.shape), x)


def test_padding_keeps_compressing():
    # 100x70 pads to 128x128: 4 chunks; the padding is zero and cropped on the way back
    x = torch.randn(100, 70, dtype=torch.float64)
    ch = dct.to_chunks(x)
    assert ch.shape == (4, 64, 64)
    assert ch[3, 36:, :].abs().sum() == 0 and ch[3, :, 6:].abs().sum() == 0
    assert dct.nchunks((100, 70)) == 4 and dct.nchunks((130,)) == 3
    assert dct.view2((6, 8, 10)) == (6, 80) and dct.view2(()) == (1,)

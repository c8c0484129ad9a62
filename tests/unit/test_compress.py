import math

import pytest
import torch

from dtrain_node.optim import dct
from dtrain_node.optim.compress import (
    CompressConfig,
    compress,
    compress_ef,
    decompress,
    dequantize,
    quantize,
    topk,
)


def test_topk_picks_true_largest():
    g = torch.Generator().manual_seed(1)
    coef = torch.randn(50, 4096, generator=g)
    idx = topk(coef, 7)
    assert idx.shape == (50, 7)
    for r in range(50):
        want = sorted(torch.argsort(coef[r].abs(), descending=True)[:7].tolist())
        assert idx[r].tolist() == want


@pytest.mark.parametrize("k", [1, 4, 6, 16])
def test_topk_of_long_rows_keeps_the_largest_values_even_with_ties(k):
    """Long rows take the grouped path; whatever it picks among equal values, it picks k
    distinct indices holding exactly the k largest magnitudes."""
    g = torch.Generator().manual_seed(k)
    rows = [
        torch.randn(4096, generator=g),
        torch.zeros(4096),
        torch.randint(-3, 4, (4096,), generator=g).float(),  # many ties at the top
        torch.randn(4096, generator=g) * (torch.arange(4096) < 70),  # all in one or two groups
    ]
    coef = torch.stack(rows)
    idx = topk(coef, k)
    assert idx.shape == (4, k) and (idx.diff(dim=1) > 0).all()
    got = coef.abs().gather(1, idx).sort(dim=1).values
    assert torch.equal(got, coef.abs().topk(k, dim=1).values.sort(dim=1).values)


def test_topk_indices_sorted_unique():
    idx = topk(torch.randn(10, 64), 5)
    assert (idx.diff(dim=1) > 0).all()


def test_quantize_sign():
    v = torch.tensor([0.3, -0.2, 0.1, -0.4])
    lvl, e = quantize(v, 1)
    assert lvl.tolist() == [1, -1, 1, -1]
    assert e == round(math.log2(0.25))
    assert torch.equal(dequantize(lvl, e), torch.tensor([0.25, -0.25, 0.25, -0.25]))


def test_quantize_two_bit_nearest_level():
    v = torch.tensor([0.1, 1.0, -0.4, -2.0, 5.0, 1.9, 2.1], dtype=torch.float64)
    lvl, e = quantize(v, 2)
    u = 2.0**e
    levels = torch.tensor([-3, -1, 1, 3], dtype=torch.float64) * u
    for x, q in zip(v.tolist(), lvl.tolist(), strict=True):
        assert q in (-3, -1, 1, 3)
        assert abs(q * u - x) <= (levels - x).abs().min().item() + 1e-12


def test_quantize_rejects_nonfinite():
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError):
            quantize(torch.tensor([1.0, bad]), 1)
    with pytest.raises(ValueError, match="too large"):
        quantize(torch.tensor([1e30]), 1)


def test_quantize_zero():
    lvl, e = quantize(torch.zeros(4), 2)
    assert e == -100 and lvl.abs().max() <= 3


@pytest.mark.parametrize("bits", [1, 2])
@pytest.mark.parametrize("shape", [(128, 64), (100, 70), (200,), (7,)])
def test_error_feedback_conserves_mass(bits, shape):
    cfg = CompressConfig(k2d=8, k1d=2, bits=bits)
    e = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    before = e.clone()
    s = compress_ef(e, cfg)
    sent = decompress(s, shape, cfg, torch.float64)
    assert sent.abs().sum() > 0
    assert torch.allclose(sent + e, before, atol=1e-12, rtol=0)
    if dct.to_chunks(before).numel() != before.numel():
        return  # padded: the pad region of what was sent is cropped, so only space-domain holds
    # unpadded: the residual lost exactly the quantized values at the chosen coefficients
    coef_before, coef_after = dct.dct(before), dct.dct(e)
    diff = coef_before - coef_after
    deq = dequantize(s.lvl, s.exp, torch.float64)
    assert torch.allclose(diff.gather(1, s.idx), deq, atol=1e-12)
    mask = torch.ones_like(diff, dtype=torch.bool).scatter_(1, s.idx, False)
    assert diff[mask].abs().max() < 1e-12


def test_compress_shapes_and_density():
    cfg = CompressConfig(k2d=4, k1d=1)
    s = compress(torch.randn(256, 320), cfg)
    assert s.idx.shape == (4 * 5, 4) and s.lvl.shape == (20, 4)
    s = compress(torch.randn(100), cfg)
    assert s.idx.shape == (2, 1)


def test_config_validation():
    for kw in ({"chunk": 1}, {"chunk": 65}, {"k2d": 0}, {"k2d": 4097}, {"k1d": 65}, {"bits": 3}):
        with pytest.raises(ValueError):
            CompressConfig(**kw)
    assert CompressConfig().index_bits((64, 64)) == 12
    assert CompressConfig().index_bits((64,)) == 6

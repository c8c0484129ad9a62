import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from harness import harness_env

from dtrain_node.optim import dct
from dtrain_node.optim.aggregate import LIMIT, aggregate, bound_shift
from dtrain_node.optim.codec import Spec, decode, encode
from dtrain_node.optim.compress import CompressConfig, compress, decompress

HERE = Path(__file__).parent
SHAPES = [("w", (256, 192)), ("v", (100, 70)), ("b", (130,)), ("s", ())]


def packets(n=5, cfg=None, scale=2.0, shapes=SHAPES):
    cfg = cfg or CompressConfig(k2d=8, k1d=2, bits=2)
    spec = Spec(tuple(a for a, _ in shapes), tuple(s for _, s in shapes), cfg)
    out = []
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        ts = [compress(torch.randn(s, generator=g) * scale**i, cfg) for _, s in shapes]
        out.append((i, decode(spec, encode(spec, ts))))
    return spec, out


def test_order_invariant():
    spec, pk = packets()
    ref = aggregate(spec, pk)
    for seed in range(5):
        p = list(pk)
        random.Random(seed).shuffle(p)
        agg = aggregate(spec, p)
        assert agg.digest() == ref.digest()
        assert agg.senders == (0, 1, 2, 3, 4)
        for i in range(len(SHAPES)):
            assert torch.equal(agg.update(i, 0.01, False), ref.update(i, 0.01, False))


@pytest.mark.parametrize("k", [2, 40])
def test_sparse_and_dense_inverse_identical(k):
    spec, pk = packets(cfg=CompressConfig(k2d=k, k1d=2, bits=2))
    a, b = aggregate(spec, pk, dense=True), aggregate(spec, pk, dense=False)
    assert a.digest() == b.digest()
    assert aggregate(spec, pk).digest() == a.digest()


def test_matches_integer_reference():
    # the float64 matmuls equal the same computation done in pure int64 arithmetic
    spec, pk = packets()
    agg = aggregate(spec, pk)
    Bq = dct.basis_q()
    for i, (_, shape) in enumerate(SHAPES):
        ex = [p[1][i].exp for p in pk]
        e0 = agg.exps[i] + (15 if len(dct.view2(shape)) == 1 else 30)
        assert min(ex) <= e0 <= max(ex)
        A = torch.zeros(dct.nchunks(shape), dct.chunk_elems(shape), dtype=torch.int64)
        for _, ts in pk:
            t = ts[i]
            assert t.exp >= e0  # spread is small here: no rounding shifts
            A.scatter_add_(1, t.idx, t.lvl.to(torch.int64) << (t.exp - e0))
        if len(dct.view2(shape)) == 1:
            X = A @ Bq
        else:
            A = A.reshape(-1, 64, 64)
            X = Bq.T @ A @ Bq
        want = dct.from_chunks(X, shape).to(torch.float64)
        assert torch.equal(agg.sums[i], want)
        assert agg.sums[i].abs().max() < LIMIT


def test_close_to_float_reference():
    spec, pk = packets()
    agg = aggregate(spec, pk)
    for i, (_, shape) in enumerate(SHAPES):
        ref = sum(decompress(ts[i], shape, spec.cfg, torch.float64) for _, ts in pk) / len(pk)
        got = agg.update(i, 1.0, False, torch.float64)
        # Bq approximates B to 2^-16: relative error ~1e-4 of the update's scale
        assert torch.allclose(got, ref, atol=2e-4 * ref.abs().max().item(), rtol=0)
        s = agg.update(i, 0.5, True, torch.float64)
        assert set(s.unique().tolist()) <= {-0.5, 0.0, 0.5}


def test_thread_count_and_order_subprocesses():
    outs = set()
    for threads, order in ((1, 0), (2, 1), (4, 2)):
        r = subprocess.run(
            [sys.executable, "-m", "harness.exact_worker", str(threads), str(order)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            env=harness_env(),
        )
        nt, digest, upd = r.stdout.split()
        assert int(nt) == threads
        outs.add((digest, upd))
    assert len(outs) == 1


def test_wide_exponent_spread_is_rounded_not_overflowed():
    # senders 2^40 apart: the small ones are shifted down (rounded), sums stay exact integers
    spec, pk = packets(n=3, scale=2.0**-20)
    agg = aggregate(spec, pk)
    for x in agg.sums:
        assert x.abs().max() < LIMIT
        assert torch.equal(x, x.round())
    big = decompress(pk[0][1][0], SHAPES[0][1], spec.cfg, torch.float64) / 3
    got = agg.update(0, 1.0, False, torch.float64)
    assert torch.allclose(got, big, atol=2e-4 * big.abs().max().item(), rtol=0)


def test_bound_shift():
    b = int(dct.basis_q().abs().max())
    s = bound_shift(4, 4, 3, b, 2)
    assert 4 * 4 * 3 * b**2 << s < LIMIT
    with pytest.raises(ValueError, match="2\\^53"):
        bound_shift(10**6, 4096, 3, b, 2)


def test_rejects_duplicates_and_empty():
    spec, pk = packets(n=2)
    with pytest.raises(ValueError):
        aggregate(spec, [pk[0], (pk[0][0], pk[1][1])])
    with pytest.raises(ValueError):
        aggregate(spec, [])


def test_any_exponent_spread_aggregates():
    # one sender at EXP_MAX, one at EXP_MIN: the small one rounds to zero instead of
    # overflowing the int64 rounding constant (the robust rule normally excludes one of them)
    from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, Sparse

    spec, pk = packets(n=2)
    lo = [Sparse(s.idx, s.lvl, EXP_MIN) for s in pk[0][1]]
    hi = [Sparse(s.idx, s.lvl, EXP_MAX) for s in pk[1][1]]
    agg = aggregate(spec, [(0, lo), (1, hi)])
    ref = aggregate(spec, [(1, hi)])
    for i in range(len(SHAPES)):
        # the same sum (power-of-two scalings are exact in float64)
        assert torch.equal(agg.sums[i] * 2.0 ** agg.exps[i], ref.sums[i] * 2.0 ** ref.exps[i])


def test_per_coefficient_mean_is_exact_and_averages_each_coefficient_over_its_senders():
    spec, pk = packets(scale=1.0)
    ref = aggregate(spec, pk, per_coefficient=True)
    for seed in range(3):  # order-free, and the same bits through either inverse
        p = list(pk)
        random.Random(seed).shuffle(p)
        assert aggregate(spec, p, per_coefficient=True).digest() == ref.digest()
    for dense in (True, False):
        assert aggregate(spec, pk, dense=dense, per_coefficient=True).digest() == ref.digest()
    assert ref.digest() != aggregate(spec, pk).digest()
    Bq = dct.basis_q().to(torch.float64)
    for i, (_, shape) in enumerate(SHAPES):
        two_d = len(dct.view2(shape)) == 2
        A = torch.zeros(dct.nchunks(shape), dct.chunk_elems(shape), dtype=torch.float64)
        count = torch.zeros_like(A)
        for _, ts in pk:
            t = ts[i]
            A.scatter_add_(1, t.idx, t.lvl.to(torch.float64) * 2.0**t.exp)
            count.scatter_add_(1, t.idx, torch.ones_like(t.lvl, dtype=torch.float64))
        A = A / count.clamp(min=1)
        X = Bq.T @ A.reshape(-1, 64, 64) @ Bq if two_d else A @ Bq
        want = dct.from_chunks(X, shape) * 2.0 ** (-30 if two_d else -15)
        got = ref.update(i, 1.0, False, torch.float64)
        # the mean is rounded to 2^-MEAN_BITS of the smallest sender's unit, Bq to 2^-16
        assert torch.allclose(got, want, atol=2e-2 * want.abs().max().item(), rtol=0)
        if bool((count[count > 0] < len(pk)).any()):  # some coefficient sent by fewer than all
            plain = aggregate(spec, pk).update(i, 1.0, False, torch.float64)
            assert not torch.allclose(plain, want, atol=2e-2 * want.abs().max().item(), rtol=0)


def test_a_coefficient_too_few_senders_sent_is_left_out_exactly():
    """`least_senders`: a coefficient of a chunk enters the sum only when at least that many
    senders sent it; the result is the integer reference over only those entries, in every
    sender order."""
    spec, pk = packets(n=4)
    for least in (2, 3):
        agg = aggregate(spec, pk, least_senders=least)
        for seed in range(3):
            p = list(pk)
            random.Random(seed).shuffle(p)
            assert aggregate(spec, p, least_senders=least).digest() == agg.digest()
        Bq = dct.basis_q()
        for i, (_, shape) in enumerate(SHAPES):
            e0 = agg.exps[i] + (15 if len(dct.view2(shape)) == 1 else 30)
            count = torch.zeros(dct.nchunks(shape), dct.chunk_elems(shape), dtype=torch.int64)
            for _, ts in pk:
                count.scatter_add_(1, ts[i].idx, torch.ones_like(ts[i].idx))
            A = torch.zeros_like(count)
            for _, ts in pk:
                t = ts[i]
                sent = (t.lvl.to(torch.int64) << (t.exp - e0)) * (count.gather(1, t.idx) >= least)
                A.scatter_add_(1, t.idx, sent)
            X = A @ Bq if len(dct.view2(shape)) == 1 else Bq.T @ A.reshape(-1, 64, 64) @ Bq
            assert torch.equal(agg.sums[i], dct.from_chunks(X, shape).to(torch.float64))
    assert aggregate(spec, pk, least_senders=1).digest() == aggregate(spec, pk).digest()
    assert aggregate(spec, pk, least_senders=5).digest() != aggregate(spec, pk).digest()


def test_an_entry_against_its_coefficients_net_sign_is_left_out_exactly():
    """`majority_sign`: per coefficient of a chunk, the entries whose sign is against the net
    sign of the senders that sent it are left out (a tie keeps both): the integer reference
    over the rest, in every sender order."""
    spec, pk = packets(n=5)
    agg = aggregate(spec, pk, majority_sign=True)
    p = list(pk)
    random.Random(1).shuffle(p)
    assert aggregate(spec, p, majority_sign=True).digest() == agg.digest()
    assert agg.digest() != aggregate(spec, pk).digest()
    Bq = dct.basis_q()
    for i, (_, shape) in enumerate(SHAPES):
        e0 = agg.exps[i] + (15 if len(dct.view2(shape)) == 1 else 30)
        net = torch.zeros(dct.nchunks(shape), dct.chunk_elems(shape), dtype=torch.int64)
        for _, ts in pk:
            net.scatter_add_(1, ts[i].idx, ts[i].lvl.to(torch.int64).sign())
        A = torch.zeros_like(net)
        for _, ts in pk:
            t = ts[i]
            lvl = t.lvl.to(torch.int64)
            kept = lvl.sign() * net.gather(1, t.idx).sign() >= 0
            A.scatter_add_(1, t.idx, (lvl << (t.exp - e0)) * kept)
        X = A @ Bq if len(dct.view2(shape)) == 1 else Bq.T @ A.reshape(-1, 64, 64) @ Bq
        assert torch.equal(agg.sums[i], dct.from_chunks(X, shape).to(torch.float64))

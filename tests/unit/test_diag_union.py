"""The sharing rules of scripts/diag_union.py: what each member's e loses is what the shared
update gains, and a union delivers coinciding values at full size where own picks divide them."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import diag_union as du  # noqa: E402


def _layout(rows: int = 64, cols: int = 128, k: int = 2) -> du.Tensor:
    return du.Tensor(torch.Size((rows, cols)), k, token=False)


def test_scales_are_powers_of_two_of_each_groups_mean() -> None:
    v = torch.tensor([3.0, -5.0, 0.5, 0.0])
    s = du.scales(v, torch.tensor([0, 0, 1, 1]), 2)
    assert s.tolist() == [4.0, 4.0, 0.25, 0.25]  # 2^round(log2 4), 2^round(log2 0.25)
    assert du.scales(torch.zeros(2), torch.tensor([0, 0]), 1).tolist() == [2.0**-100] * 2


def test_union_lists_each_picked_coefficient_once() -> None:
    t = _layout()
    a = torch.tensor([[1, 5], [0, 2]])
    b = torch.tensor([[5, 9], [0, 2]])
    rows, cols = du.union([a, b], t)
    assert list(zip(rows.tolist(), cols.tolist(), strict=True)) == [
        (0, 1), (0, 5), (0, 9), (1, 0), (1, 2),
    ]  # fmt: skip


def test_a_vote_keeps_only_coefficients_enough_members_picked() -> None:
    t = _layout()
    a, b, c = (
        torch.tensor([[1, 5], [0, 2]]),
        torch.tensor([[5, 9], [0, 2]]),
        torch.tensor([[5, 7], [3, 2]]),
    )
    pairs = lambda at: list(zip(at[0].tolist(), at[1].tolist(), strict=True))  # noqa: E731
    assert pairs(du.voted([a, b, c], t, 2)) == [(0, 5), (1, 0), (1, 2)]
    assert pairs(du.voted([a, b, c], t, 3)) == [(0, 5), (1, 2)]
    assert pairs(du.voted([a, b, c], t, 1)) == [
        (0, 1), (0, 5), (0, 7), (0, 9), (1, 0), (1, 2), (1, 3),
    ]  # fmt: skip


def test_what_leaves_e_is_what_the_update_gets() -> None:
    torch.manual_seed(0)
    t = _layout()
    e = torch.randn(t.n, t.width)
    before, agg = e.clone(), torch.zeros_like(e)
    du._send_own(e, t, agg)
    assert torch.allclose(e + agg, before)
    assert int((agg != 0).sum(1).max()) == t.k
    e2, agg2 = before.clone(), torch.zeros_like(e)
    du._send_at(e2, t, du.union([torch.tensor([[3, 7], [1, 4]])], t), agg2)
    assert torch.allclose(e2 + agg2, before) and int((agg2 != 0).sum()) == 4


def test_members_that_agree_arrive_whole_in_a_union_and_divided_by_own_picks() -> None:
    """Two members whose e differ only in which coefficient is their largest (2 against 1):
    own picks put each one's value in the sum once, so the mean halves it; the union has both
    members send both (1-bit, at the scale of their mean 1.5, rounded to 2)."""
    t = _layout(k=1)
    e = [torch.zeros(t.n, t.width) for _ in range(2)]
    for ei, top in zip(e, (3, 8), strict=True):
        ei[:, 3], ei[:, 8] = 1.0, 1.0
        ei[:, top] = 2.0
    own = torch.zeros(t.n, t.width)
    for ei in [x.clone() for x in e]:
        du._send_own(ei, t, own)
    shared = torch.zeros(t.n, t.width)
    at = du.union([du.topk(ei, t.k) for ei in e], t)
    for ei in [x.clone() for x in e]:
        du._send_at(ei, t, at, shared)
    assert (own / 2)[:, [3, 8]].eq(1.0).all() and int((own != 0).sum()) == 2 * t.n
    assert (shared / 2)[:, [3, 8]].eq(2.0).all() and int((shared != 0).sum()) == 2 * t.n


def test_random_coefficients_are_shared_and_paid_for_by_own_picks_bits() -> None:
    """rand: the same coefficients for every member holding the round's seed, as many per
    chunk as own's k picks' index and level bits buy (k = 2 at 12 index bits: 26 at 1 bit)."""
    t = _layout(k=2)
    a = du.drawn(t, torch.Generator().manual_seed(7))
    b = du.drawn(t, torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    rows, cols = a
    assert torch.bincount(rows).tolist() == [26] * t.n
    assert all(len(set(cols[rows == r].tolist())) == 26 for r in range(t.n))
    t2 = du.Tensor(torch.Size((64, 128)), 2, token=False, bits=2)
    assert torch.bincount(du.drawn(t2, torch.Generator().manual_seed(7))[0]).tolist() == [13] * 2


def test_runs_send_whole_runs_of_neighbours_and_what_leaves_e_is_what_the_update_gets() -> None:
    """grp: the run with the most energy goes whole (4 neighbours from a multiple of 4), even
    where a single coefficient elsewhere is larger."""
    t = _layout(k=1)
    e = torch.zeros(t.n, t.width)
    e[:, 8:12] = torch.tensor([1.0, -1.0, 1.0, 1.0])  # energy 4 in run 2
    e[:, 100] = 1.5  # energy 2.25 alone in run 25
    before, agg = e.clone(), torch.zeros_like(e)
    du._send_runs(e, t, agg, 4, 1)
    assert torch.allclose(e + agg, before)
    assert (agg != 0).nonzero()[:, 1].unique().tolist() == [8, 9, 10, 11]
    assert torch.equal(agg[:, 8:12], before[:, 8:12])  # levels +-1 at scale 1: all of it


def test_dense_sync_moves_the_shared_state_to_the_members_mean() -> None:
    """dense: nothing compressed, so a round lands every member on the mean of their
    parameters (up to the DCT's float round trip) and leaves no error feedback behind."""
    torch.manual_seed(0)
    ms = [torch.nn.Linear(128, 64) for _ in range(3)]
    shared = [torch.zeros_like(p) for p in ms[0].parameters()]
    lay = [du.Tensor(p.shape, 1, token=False) for p in shared]
    e = [[torch.zeros(t.n, t.width) for t in lay] for _ in ms]
    mean = [torch.stack(ps).mean(0) for ps in zip(*(m.parameters() for m in ms), strict=True)]
    bits = du.sync(ms, e, shared, lay, "dense", {}, 0.95, [None] * 2, torch.Generator())
    assert bits == 16 * (64 * 128 + 64)
    for th, mu in zip(shared, mean, strict=True):
        assert torch.allclose(th, mu, atol=1e-5)
    assert all(float(x.abs().max()) == 0.0 for ei in e for x in ei)
    assert all(torch.equal(p, th) for m in ms for p, th in zip(m.parameters(), shared, strict=True))


def test_a_full_rank_unquantised_image_sends_all_of_e_and_the_mean_reaches_the_shared_state():
    """lowrank: what leaves each member's weight-space e is its image, the shared state moves
    by the images' mean, and with rank = the matrix's and no quantisation the image is all of
    e (one power iteration from a full-rank start spans the whole column space)."""
    torch.manual_seed(0)
    th = torch.randn(8, 6)
    ps = [th - torch.randn(8, 6) for _ in range(2)]
    es = [(torch.zeros(8, 6), torch.randn(6, 6)) for _ in ps]
    before = th.clone()
    bits = du._lowrank(es, th, ps, {"r": 6, "fb": 0}, 0.95)
    assert bits == 6 * (8 + 6) * 16 + 2 * 6 * 8
    assert all(float(ew.abs().max()) < 1e-4 for ew, _ in es)
    assert torch.allclose(th, torch.stack(ps).mean(0), atol=1e-4)
    es1 = [(torch.zeros(8, 6), torch.randn(6, 1)) for _ in ps]
    th1 = before.clone()
    du._lowrank(es1, th1, ps, {"r": 1, "fb": 1}, 0.95)
    sent = [before - p - ew for p, (ew, _) in zip(ps, es1, strict=True)]
    assert all(int(torch.linalg.matrix_rank(s)) == 1 for s in sent)
    assert torch.allclose(before - th1, torch.stack(sent).mean(0), atol=1e-5)


def test_keep_starts_a_member_from_the_shared_state_minus_its_own_unsent_e() -> None:
    """keep=1: after a round a member holds theta_sync - idct(e), and its next round adds only
    what it moved from there to e (not the unsent e a second time)."""
    torch.manual_seed(0)
    m = torch.nn.Linear(128, 64, bias=False)
    shared = [m.weight.detach().clone()]
    lay = [du.Tensor(m.weight.shape, 2, token=False)]
    e = [[torch.zeros(lay[0].n, lay[0].width)]]
    args = ([None], torch.Generator())
    for _ in range(2):
        with torch.no_grad():
            step = 0.01 * torch.randn_like(m.weight)
            m.weight.sub_(step)
        e_before, th_before = e[0][0].clone(), shared[0].clone()
        du.sync([m], e, shared, lay, "own", {"keep": 1}, 0.9, *args)
        sent = du.dct.dct(th_before - shared[0])  # one member: the update is what it sent
        assert torch.allclose(e[0][0] + sent, 0.9 * e_before + du.dct.dct(step), atol=1e-5)
        assert torch.allclose(m.weight, shared[0] - du.dct.idct(e[0][0], shared[0].shape))


def test_paper_moves_each_weight_by_lr_against_the_sign_of_what_was_sent() -> None:
    """paper: e folds the gradient (DCT), what leaves e is the picks, and the shared state
    moves by -lr sign(idct(mean of the picks)); the member is reset to it, gradient cleared."""
    torch.manual_seed(0)
    m = torch.nn.Linear(128, 64, bias=False)
    shared = [m.weight.detach().clone()]
    lay = [du.Tensor(m.weight.shape, 2, token=False)]
    e = [[torch.randn(lay[0].n, lay[0].width)]]
    e_before, th_before = e[0][0].clone(), shared[0].clone()
    m.weight.grad = torch.randn_like(m.weight)
    g = m.weight.grad.clone()
    bits = du.paper([m], e, shared, lay, 0.01, 0.9)
    assert bits == lay[0].n * 2 * 13 + 8
    sent = 0.9 * e_before + du.dct.dct(g) - e[0][0]
    assert int((sent.abs() > 1e-6).sum(1).max()) == 2  # k picks per chunk left e
    step = th_before - shared[0]
    assert torch.allclose(step, 0.01 * torch.sign(du.dct.idct(sent, step.shape)), atol=1e-7)
    assert torch.equal(m.weight, shared[0]) and m.weight.grad is None


def test_glob_spends_owns_bits_on_a_groups_largest_values_wherever_they_are() -> None:
    """glob: one chunk holds every large value; own picks take k from each chunk, glob takes
    the group's largest (all in that chunk), as many as own's bits pay for at 13 index bits
    instead of 12 (2 chunks x k 4 x 13 bits / 14 = 7), and what leaves e is what arrives."""
    torch.manual_seed(0)
    t = _layout(k=4)
    assert t.n == 2 and t.width == 4096
    e = torch.randn(t.n, t.width) * 0.01
    e[1, :20] = torch.linspace(1.0, 2.0, 20)
    before, agg = e.clone(), torch.zeros_like(e)
    bits = du._send_glob(e, t, agg)
    assert bits == 7 * (13 + 1) + 8 <= t.own_bits
    assert torch.allclose(e + agg, before)
    sent = agg.nonzero().tolist()
    assert len(sent) == 7 and all(r == 1 and c >= 13 for r, c in sent)  # the 7 largest


def test_an_arm_spec_parses_to_typed_options_and_a_bad_one_exits_with_one_line() -> None:
    assert du.parse_arm("own,k=5,olr=2,b1=0.5") == ("own", {"k": 5, "olr": 2.0, "b1": 0.5})
    for bad, says in (
        ("nope", "one of"),
        ("own,k=x", "key=number"),
        ("own,b1=1", "beta1, in [0, 1)"),
        ("own,b1=-0.1", "beta1, in [0, 1)"),
    ):
        try:
            du.parse_arm(bad)
        except SystemExit as e:
            assert says in str(e) and "\n" not in str(e)
        else:
            raise AssertionError(f"{bad!r} was accepted")


def test_ternary_levels_send_nothing_where_e_is_below_half_the_scale() -> None:
    """At a union of four entries holding 4, -4, 0.9 and 0.5 (mean 2.35, scale 2): 1-bit levels
    send +-2 everywhere; ternary levels send +2, -2 and nothing at the two small entries, which
    stay in e, at log2(3) bits a level."""
    one, tern = _layout(k=1), du.Tensor(torch.Size((64, 128)), 1, token=False, tern=1)
    at = (torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 2, 3]))
    sent = []
    for t in (one, tern):
        e, agg = torch.zeros(t.n, t.width), torch.zeros(t.n, t.width)
        e[0, :4] = torch.tensor([4.0, -4.0, 0.9, 0.5])
        du._send_at(e, t, at, agg)
        assert torch.equal(e[0, :4] + agg[0, :4], torch.tensor([4.0, -4.0, 0.9, 0.5]))
        sent.append(agg[0, :4].tolist())
    assert sent == [[2.0, -2.0, 2.0, 2.0], [2.0, -2.0, 0.0, 0.0]]
    assert one.level_bits == 1 and abs(tern.level_bits - 1.585) < 1e-3

"""Shared error feedback (DeMoConfig.shared_feedback): e loses what the shared state moved.

The case it answers, written first: with each member's own feedback, a member's e drops by
what it sent, but the shared state moves by the mean over N members, so a coefficient only
one member picked moves by 1/N of what that member's e gave up, and the member never asks for
the rest. With shared feedback every member's e drops by the shared move instead: the members'
mean e is about the same as with their own feedback, each member's e keeps what it wants that the
job has not done, and a member whose packet was left out keeps all of it.
"""

import copy

import pytest
import torch

from dtrain.errors import ConfigError
from dtrain.models import Job, JobSpec
from dtrain.recipe import Recipe
from dtrain_node.operator import roundstate
from dtrain_node.optim import settings
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.feedback import Feedback
from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep

SHAPES = {"w": (96, 70), "v": (130,), "m": (64, 128), "s": (3,)}


def named(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(n, torch.nn.Parameter(torch.randn(s, generator=g) * 0.02)) for n, s in SHAPES.items()]


def config(shared: bool) -> DeMoConfig:
    compress = CompressConfig(k2d=4, k1d=1)
    return DeMoConfig(sync_interval=1, lr=1.0, beta=0.8, compress=compress, shared_feedback=shared)


def members(shared: bool, n: int) -> list[DeMo]:
    return [DeMo(named(), config(shared), f"m{i}") for i in range(n)]


def train(opts: list[DeMo], seed: int) -> None:
    """One inner step's worth of movement, different per member, the same in both arms."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for o in opts:
            for p in o.params:
                p.add_(torch.randn(p.shape, generator=g) * 1e-3)


def flat(f: Feedback) -> torch.Tensor:
    return torch.cat([f.coefficients(i).reshape(-1) for i in range(len(f.shapes))])


def e(o: DeMo) -> torch.Tensor:
    return flat(o.feedback)


def test_give_undoes_take_on_padded_matrices_and_vectors():
    shapes = list(SHAPES.values())
    fb = Feedback(shapes, CompressConfig(k2d=4, k1d=1))
    g = torch.Generator().manual_seed(1)
    fb.fold(0.8, [torch.randn(s, generator=g) for s in shapes])
    start = copy.deepcopy(fb.state())
    sent = fb.take()
    assert not torch.allclose(fb.mat, start["mat"])
    fb.give(sent)
    torch.testing.assert_close(fb.mat, start["mat"], atol=1e-5, rtol=0)
    torch.testing.assert_close(fb.vec, start["vec"], atol=1e-5, rtol=0)


def wanted(o: DeMo, local: list[torch.Tensor]) -> torch.Tensor:
    """DCT(theta_sync - local) in e's layout: from e = 0, what a member that trained to `local`
    wants of the job once the shared state is theta_sync."""
    f = Feedback(o.feedback.shapes, o.cfg.compress)
    f.fold(1.0, list(o.theta_sync), local)
    return flat(f)


def test_after_one_round_e_is_where_the_member_went_less_where_the_job_went():
    opts = members(True, 3)
    train(opts, 0)
    local = [[p.detach().clone() for p in o.params] for o in opts]
    lockstep(opts)
    assert not torch.equal(opts[0].theta_sync[0], named()[0][1])  # the job moved
    for o, mine in zip(opts, local, strict=True):
        torch.testing.assert_close(e(o), wanted(o, mine), atol=1e-5, rtol=0)


def test_own_feedback_keeps_less_and_the_members_mean_e_stays():
    own, shared = members(False, 3), members(True, 3)
    for r in range(3):
        train(own, r)
        train(shared, r)
        lockstep(own)
        lockstep(shared)
    # a member's own picks leave its e whole, but the job moved by a third of them
    assert (e(own[0]) - e(shared[0])).abs().max() > 1e-4
    mean_own = torch.stack([e(o) for o in own]).mean(0)
    mean_shared = torch.stack([e(o) for o in shared]).mean(0)
    assert (mean_own - mean_shared).norm() < 0.2 * mean_own.norm()


def test_a_member_left_out_keeps_all_it_wanted():
    (o,) = members(True, 1)
    train([o], 0)
    local = [p.detach().clone() for p in o.params]
    o.prepare()
    after_take = e(o)
    st = o.apply([])  # no packet arrived: the shared state did not move
    assert st.applied == ()
    assert (e(o) - after_take).abs().max() > 1e-4  # its picks came back
    torch.testing.assert_close(e(o), wanted(o, local), atol=1e-5, rtol=0)


def test_a_replay_leaves_e_alone_even_after_a_prepared_round():
    a, b = members(True, 2)
    train([a, b], 0)
    packets = [(a.sender, a.prepare()), (b.sender, b.prepare())]
    start = [th.clone() for th in a.theta_sync]
    a.apply(packets)
    a.prepare()  # a round prepared but not applied (a restart, a referee's own round)
    kept = e(a).clone()
    a.replay(start, [packets])
    assert torch.equal(e(a), kept)


def test_paper_mode_refuses_it():
    with pytest.raises(ValueError, match="shared_feedback needs local mode"):
        DeMoConfig(mode="paper", sync_interval=1, lr=1e-3, shared_feedback=True)


def test_the_recipe_field_reaches_the_node_and_keeps_older_recipes_hash():
    spec = JobSpec(price_per_operator_epoch=1, model_uri="builtin:tiny")
    job = Job(1, spec, None)
    for value, want in (("own", False), ("shared", True)):
        cfg = settings.demo_config(None, job, Recipe(error_feedback=value))  # type: ignore[arg-type]
        assert cfg.shared_feedback is want
    assert "error_feedback" not in Recipe().canonical()  # a recipe written before it: same hash
    assert Recipe(error_feedback="shared").hash() != Recipe().hash()


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"error_feedback": "both"}, "own or shared"),
        (
            {"error_feedback": "shared", "demo_mode": "paper", "outer_lr": 1e-3},
            "needs demo_mode 'local'",
        ),
    ],
)
def test_a_recipe_it_cannot_run_is_a_config_error(fields, why):
    with pytest.raises(ConfigError, match=why):
        Recipe(**fields)


def test_a_restarted_member_sends_the_packet_it_would_have_sent(tmp_path):
    """The round state is saved after apply, so it holds e with the shared move taken out."""
    opts = members(True, 2)
    train(opts, 0)
    lockstep(opts)
    path = roundstate.path(tmp_path, 0)
    roundstate.save(path, opts[0], 1, {})
    back = DeMo(named(), config(True), "m0")
    assert roundstate.load(path, back)["round"] == 1
    assert torch.equal(e(back), e(opts[0]))
    for o in (opts[0], back):
        for p, th in zip(o.params, o.theta_sync, strict=True):
            p.data.copy_(th + 1e-3)
    assert back.prepare() == opts[0].prepare()

"""Every packet is reproducible (dtrain_node.optim.reproduce), on the product's own model
(`builtin:tiny`): from the shared state, a member's committed private state and its batches,
anyone recomputes the member's packet byte for byte; a member that skipped the work does not
pass."""

from __future__ import annotations

import pytest
import torch

from dtrain_node.optim import reproduce as rp
from dtrain_node.optim.attacks import Attack
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.train.start import start_model

K = 2
CFG = DeMoConfig(
    mode="local", sync_interval=K, lr=1.0, compress=CompressConfig(k2d=4, k1d=1, bits=1)
)
URI = "builtin:tiny"


def _member(sender: str) -> tuple[torch.nn.Module, DeMo]:
    torch.manual_seed(0)
    model = start_model(URI).fresh()
    return model, DeMo(model.named_parameters(), CFG, sender=sender)


def _loss(model: torch.nn.Module):
    def loss(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, labels=ids).loss

    return loss


def _batches(seed: int, rnd: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + rnd)
    return [torch.randint(0, 256, (2, 32), generator=g) for _ in range(K)]


def _rounds(model, opt: DeMo, seed: int, rounds: int):
    """Trains `rounds` rounds alone (applying its own packet); per round: the shared state and
    private state it started from, and the packet it sent."""
    out = []
    loss = _loss(model)
    for r in range(rounds):
        shared = [t.clone() for t in opt.theta_sync]
        state = rp.private_state(opt)
        for b in _batches(seed, r):
            loss(b).backward()
            opt.inner_step()
        packet = opt.prepare()
        opt.apply([(opt.sender, packet)])
        out.append((shared, state, packet))
    return out


@pytest.fixture(scope="module")
def recorded():
    torch.set_num_threads(1)
    model, opt = _member("0x" + "aa" * 20)
    return _rounds(model, opt, seed=7, rounds=3)


def test_a_checker_reproduces_every_honest_packet_byte_for_byte(recorded) -> None:
    model, checker = _member("0x" + "bb" * 20)  # another process's model and optimizer
    for r, (shared, state, packet) in enumerate(recorded):
        got = rp.reproduce(checker, shared, state, _batches(7, r), _loss(model))
        assert got == packet, f"round {r}"


def test_work_skipped_does_not_reproduce(recorded) -> None:
    """A member that re-sends last round's packet (stale), sends honest-scale noise, or trains
    on other batches than its assigned ones fails the check."""
    model, checker = _member("0x" + "bb" * 20)
    shared, state, honest = recorded[2]
    want = rp.reproduce(checker, shared, state, _batches(7, 2), _loss(model))
    assert want == honest
    stale = recorded[1][2]
    noise = Attack.parse("noise")(checker.spec, honest, seed=3)
    other_batches = rp.reproduce(checker, shared, state, _batches(8, 2), _loss(model))
    for cheat in (stale, noise, other_batches):
        assert cheat != want


def test_the_private_state_commitment_binds_every_part(recorded) -> None:
    _, state, _ = recorded[1]
    d = rp.digest(state)
    assert d == rp.digest(rp.private_state(_rebuilt(state))) and len(d) == 32
    tampered = [dict(state, steps=state["steps"] + 1)]
    e = {**state["e"], "vec": state["e"]["vec"].clone()}
    e["vec"].view(-1)[0] += 1e-6
    tampered.append(dict(state, e=e))
    inner = {"param_groups": state["inner"]["param_groups"], "state": dict(state["inner"]["state"])}
    first = next(iter(inner["state"]))
    slot = dict(inner["state"][first])
    slot["exp_avg"] = slot["exp_avg"].clone()
    slot["exp_avg"].view(-1)[0] += 1e-6
    inner["state"][first] = slot
    tampered.append(dict(state, inner=inner))
    assert all(rp.digest(t) != d for t in tampered)


def _rebuilt(state: rp.PrivateState) -> DeMo:
    """A fresh optimizer loaded with `state` (what a checker holds after receiving it)."""
    _, opt = _member("0x" + "cc" * 20)
    rp.load_state(opt, opt.theta_sync, state)
    return opt


def test_reproduce_refuses_a_shared_state_of_another_shape(recorded) -> None:
    model, checker = _member("0x" + "bb" * 20)
    shared, state, _ = recorded[0]
    with pytest.raises(ValueError, match="shared has 1 tensors"):
        rp.reproduce(checker, shared[:1], state, _batches(7, 0), _loss(model))


def test_a_resumed_node_trains_round_r_on_the_batches_of_round_r() -> None:
    from dtrain_node.operator.epoch import from_round

    stream = list(from_round(iter(range(20)), 0, K))
    resumed = list(from_round(iter(range(20)), 3, K))
    assert resumed == stream[3 * K :] and resumed[:K] == [6, 7]

"""The DeMo paper's scheme as a job option (recipe `demo_mode = "paper"`), on the product's own
model (`builtin:tiny`): every step is a sync of the gradient's error feedback and an outer step
of lr x sign on a CPU shared state that the model always equals. The attacks come first: a
member that skips the gradient, re-sends an old packet or trains on other batches fails a
replay from its committed state file; a restarted member and a referee reach the live state
bit for bit; a recipe or job that cannot run paper mode is refused before anyone trains."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dtrain.errors import ConfigError
from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain.recipe import Recipe
from dtrain_node.errors import RecipeInvalid
from dtrain_node.operator import preflight, roundstate
from dtrain_node.operator.node import NodeConfig
from dtrain_node.optim import attacks, reproduce, statefile
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.optim.settings import demo_config
from dtrain_node.train import corpus
from dtrain_node.train.inner import InnerPlan, replay_round
from dtrain_node.train.start import model_hash, start_model

LR = 1e-3
CFG = DeMoConfig(
    mode="paper", lr=LR, beta=0.99, sign=True, compress=CompressConfig(k2d=4, k1d=1, bits=1)
)
PAPER = Recipe(demo_mode="paper", outer_lr=LR, outer_momentum=0.99, max_grad_norm=1.0)
PLAN = InnerPlan(PAPER, total_steps=8)
CPU = torch.device("cpu")
MEMBERS = ["0x" + c * 40 for c in "abc"]


class Member:
    """A member of a paper-mode job: the tiny model, its optimizer and its batch stream."""

    def __init__(self, sender: str, seed: int) -> None:
        torch.manual_seed(0)
        self.model = start_model("builtin:tiny").fresh()
        self.opt = DeMo.of_model(self.model, CFG, sender=sender)
        self.seed = seed

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=ids).loss

    def batch(self, rnd: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(1000 * self.seed + rnd)
        return torch.randint(0, 256, (2, 32), generator=g)

    def work(self, rnd: int) -> bytes:
        """Round `rnd` as the trainer takes it (InnerPlan: backward, clip, count); the packet."""
        replay_round(self.opt, self, [self.batch(rnd)], PLAN, 0, CPU)
        return self.opt.prepare()


def _shared(opt: DeMo) -> list[torch.Tensor]:
    return [t.clone() for t in opt.theta_sync]


@pytest.fixture(scope="module")
def job() -> dict:
    """Three members train four rounds; per round the shared and private state each started
    from, their packets, and the members at the end."""
    torch.set_num_threads(1)
    members = [Member(s, seed=i) for i, s in enumerate(MEMBERS)]
    start = _shared(members[0].opt)
    rounds = []
    for r in range(4):
        before = [(_shared(m.opt), reproduce.private_state(m.opt)) for m in members]
        packets = [(m.opt.sender, m.work(r)) for m in members]
        for m in members:
            m.opt.apply(packets)
        rounds.append((before, packets))
    return {"start": start, "rounds": rounds, "members": members}


def test_members_share_a_cpu_state_the_model_equals_and_it_moves_by_sign_steps(job) -> None:
    members, start = job["members"], job["start"]
    first = [t.numpy().tobytes() for t in members[0].opt.theta_sync]
    for m in members:
        assert [t.numpy().tobytes() for t in m.opt.theta_sync] == first
        assert all(t.device.type == "cpu" for t in m.opt.theta_sync)
        assert all(
            torch.equal(p.detach(), t) for p, t in zip(m.opt.params, m.opt.theta_sync, strict=True)
        )
        assert all(p.grad is None for p in m.opt.params)  # prepare() took the gradients
    moved = torch.cat(
        [(a - b).reshape(-1) for a, b in zip(members[0].opt.theta_sync, start, strict=True)]
    )
    steps = moved / LR
    assert steps.abs().max() > 0.5  # the state moved
    assert (steps - steps.round()).abs().max() < 1e-2  # by whole sign steps of lr
    assert steps.abs().max() <= len(job["rounds"]) + 1e-2


def _checker(before, sender_seed: int) -> tuple[Member, DeMo]:
    """A checker's replica loaded from the member's state file, as a replay check loads it."""
    shared, state = before
    checker = Member("0x" + "ee" * 20, seed=sender_seed)
    data = statefile.encode(state)
    statefile.load(checker.opt, shared, statefile.decode(data))
    return checker, checker.opt


def test_a_replay_from_the_committed_state_file_gives_the_packet_and_skipped_work_does_not(
    job,
) -> None:
    rnd, i = 2, 1
    before, packets = job["rounds"][rnd]
    honest = packets[i][1]
    checker, _ = _checker(before[i], sender_seed=i)
    assert checker.work(rnd) == honest
    stale = job["rounds"][rnd - 1][1][i][1]  # the member's previous packet, re-sent
    _, opt = _checker(before[i], sender_seed=i)
    opt.inner_step()  # counts the step, computes no gradient: e's decay alone
    other_batches, _ = _checker(before[i], sender_seed=i + 7)
    copied = packets[(i + 1) % len(packets)][1]  # another member's packet
    flipped = attacks.signflip(opt.spec, honest)
    for cheat in (stale, opt.prepare(), other_batches.work(rnd), copied, flipped):
        assert cheat != honest


def test_a_paper_member_refuses_a_state_file_with_adamw_moments(job) -> None:
    torch.manual_seed(0)
    model = start_model("builtin:tiny").fresh()
    local = DeMo.of_model(model, replace(CFG, mode="local", sign=False, sync_interval=2))
    model(input_ids=torch.zeros(1, 8, dtype=torch.long), labels=None).logits.sum().backward()
    local.inner_step()
    data = statefile.encode(reproduce.private_state(local))
    shared = job["rounds"][0][0][0][0]
    with pytest.raises(statefile.StateInvalid, match="AdamW moments"):
        statefile.load(Member(MEMBERS[0], 0).opt, shared, statefile.decode(data))


def test_a_restarted_member_resumes_its_paper_round_bit_for_bit(job, tmp_path) -> None:
    """Round state saved after round 1, a new process loads it and sends round 2's packet."""
    rnd, i = 2, 0
    before, packets = job["rounds"][rnd]
    live = Member(MEMBERS[i], seed=i)
    replay = Member(MEMBERS[i], seed=i)
    reproduce.load_state(live.opt, *before[i])
    path = tmp_path / "round.pt"
    roundstate.save(path, live.opt, rnd, dict.fromkeys(MEMBERS, rnd))
    assert roundstate.load(path, replay.opt) is not None
    for a, b in zip(replay.opt.theta_sync, before[i][0], strict=True):
        assert torch.equal(a, b)
    assert replay.work(rnd) == packets[i][1]


def test_a_referee_replays_the_paper_transcript_to_the_members_state(job) -> None:
    referee = Member("0x" + "00" * 20, seed=99)
    stats = referee.opt.replay(job["start"], [packets for _, packets in job["rounds"]])
    assert [len(s.applied) for s in stats] == [3] * len(job["rounds"])
    for a, b in zip(referee.opt.theta_sync, job["members"][0].opt.theta_sync, strict=True):
        assert torch.equal(a, b)
    for p, t in zip(referee.opt.params, referee.opt.theta_sync, strict=True):
        assert torch.equal(p.detach(), t)  # the checkpoint a referee hashes is the state


@pytest.mark.parametrize("kind", ["poison", "scale"])
def test_one_attacker_of_four_is_screened_out_of_every_paper_round(kind) -> None:
    """f = 1 < 4/3: a member that sends its honest packet poisoned or 128x each step is left
    out by the robust screen every round, and the shared state is bitwise what the three
    honest members reach without it. (A sign-flipped packet is not always: one step's
    gradients of different members are barely aligned, so its cosine to the others' sum is
    often above cos_min; the replay check catches it, below.)"""
    members = [Member(s, seed=i) for i, s in enumerate([*MEMBERS, "0x" + "dd" * 20])]
    alone = [Member(s, seed=i) for i, s in enumerate(MEMBERS)]
    cheat = members[-1].opt
    for r in range(3):
        packets = [(m.opt.sender, m.work(r)) for m in members]
        honest = packets[-1][1]
        if kind == "poison":
            bad = attacks.poison(cheat.spec, honest)
        else:
            bad = attacks.scale(cheat.spec, honest, 128.0)
        packets[-1] = (cheat.sender, bad)
        stats = [m.opt.apply(packets) for m in members[:3]]
        assert all(st.excluded.keys() == {cheat.sender} for st in stats), (r, stats[0].excluded)
        three = [(m.opt.sender, m.work(r)) for m in alone]
        for m in alone:
            m.opt.apply(three)
    for m in members[:3]:
        for a, b in zip(m.opt.theta_sync, alone[0].opt.theta_sync, strict=True):
            assert torch.equal(a, b)


# ---------------------------------------------------------------- the recipe and the job


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"demo_mode": "fast"}, "'demo_mode'"),
        ({"demo_mode": "paper"}, "'outer_lr'"),  # the local default 1.0 would wreck the model
        ({"demo_mode": "paper", "outer_lr": LR, "lr_schedule": "cosine"}, "'lr_schedule'"),
        ({"demo_mode": "paper", "outer_lr": LR, "warmup_steps": 5}, "'warmup_steps'"),
    ],
)
def test_a_recipe_that_cannot_run_paper_mode_is_a_config_error(fields, names) -> None:
    with pytest.raises(ConfigError, match=names):
        Recipe(**fields)


def test_paper_mode_is_pinned_and_a_local_recipe_keeps_its_hash(tmp_path) -> None:
    assert "demo_mode" not in Recipe().canonical()  # recipes written before it hash as before
    assert (
        '"demo_mode":"paper"' in PAPER.canonical()
        and PAPER.hash() != replace(PAPER, demo_mode="local").hash()
    )
    path = tmp_path / "paper.toml"
    path.write_text(PAPER.to_toml())
    assert Recipe.from_toml(path) == PAPER


def _job(tmp_path, recipe: Recipe, sync_interval: int) -> Job:
    data = tmp_path / "cpt.txt"
    corpus.build_stdlib_corpus(data, max_bytes=20_000)
    path = tmp_path / "recipe.toml"
    path.write_text(recipe.to_toml())
    spec = JobSpec(
        price_per_operator_epoch=1,
        steps_per_epoch=4,
        sync_interval=sync_interval,
        method=Method.CPT,
        model_uri="builtin:tiny",
        model_hash=model_hash("builtin:tiny"),
        dataset_uri=str(data),
        recipe_hash=recipe.hash(),
        recipe_uri=str(path),
    )
    state = JobState("0x" + "00" * 20, JobStatus.RUNNING, 0, 0, 0, 0, 0, b"\0" * 32)
    return Job(id=7, spec=spec, state=state)


def test_a_paper_recipe_builds_the_sign_step_of_its_outer_lr(tmp_path) -> None:
    cfg = NodeConfig(key="0x01", rpc_url="", contract="", data_dir=tmp_path / "n", job_id=7)
    demo = demo_config(cfg, _job(tmp_path, PAPER, 1), PAPER)
    assert (demo.mode, demo.sign, demo.lr, demo.beta, demo.sync_interval) == (
        "paper",
        True,
        LR,
        0.99,
        1,
    )


def test_a_paper_job_syncing_every_other_step_is_unworkable_before_training(tmp_path) -> None:
    job = _job(tmp_path, PAPER, 2)
    cfg = NodeConfig(key="0x01", rpc_url="", contract="", data_dir=tmp_path / "n", job_id=7)
    with pytest.raises(RecipeInvalid, match="syncs every 2"):
        demo_config(cfg, job, PAPER)
    reason = preflight.check(job, batch_size=2)
    assert reason is not None and reason.startswith("RecipeInvalid") and "--sync 1" in reason
    assert RecipeInvalid in preflight.PROVES_UNWORKABLE  # honest nodes vote it unworkable
    assert preflight.check(_job(tmp_path, PAPER, 1), batch_size=2) is None

"""Two operator nodes on a real anvil train a two-epoch job whose recipe sets every inner-step
field (a cosine schedule with warm-up, gradient clipping, accumulation), and one in the DeMo
paper's mode: each epoch both reveal the same checkpoint, both are paid, nobody is slashed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_operator import CALLER, OPERATORS, Operators, Running, events, metrics, submit_tiny_job

from dtrain.recipe import Recipe
from dtrain_node.train import checkpoint, corpus
from dtrain_node.train.start import start_model


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


def _two_nodes_train(
    chain, bsm, accounts, dataset, tmp_path, recipe: Recipe, **job: int
) -> tuple[int, Operators]:
    """A tiny CPT job pinning `recipe` (`job`: submit_tiny_job's steps, epochs, sync_interval),
    trained to completion by the first two operators."""
    path = tmp_path / "recipe.toml"
    path.write_text(recipe.to_toml())
    caller = bsm.with_account(accounts[CALLER].key)
    job_id = submit_tiny_job(caller, dataset, 2, recipe=(recipe.hash(), str(path)), **job)
    ops = Operators(chain, bsm, accounts, job_id, tmp_path)
    running = [Running(ops.node(i)) for i in OPERATORS[:2]]
    try:
        results = [r.wait(240) for r in running]
    finally:
        for r in running:
            r.node.stop_now.set()
    assert [r["status"] for r in results] == ["completed", "completed"]
    return job_id, ops


@pytest.mark.timeout(300)
def test_two_nodes_agree_on_every_epoch_with_the_inner_step_fields(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    recipe = Recipe(
        lr_schedule="cosine",
        warmup_steps=3,
        min_lr_ratio=0.1,
        max_grad_norm=0.5,
        grad_accum=2,
        batch_size=2,
    )
    job_id, ops = _two_nodes_train(
        chain, bsm, accounts, dataset, tmp_path, recipe, steps=4, epochs=2
    )
    revealed = events(bsm, job_id, "CheckpointRevealed")
    for epoch in (0, 1):
        votes = [bytes(e.args["checkpoint"]) for e in revealed if e.args["epoch"] == epoch]
        assert len(votes) == 2 and votes[0] == votes[1], epoch
    finalized = events(bsm, job_id, "EpochFinalized")
    assert [(e.args["epoch"], e.args["paidMembers"]) for e in finalized] == [(0, 2), (1, 2)]
    assert not events(bsm, job_id, "Slashed")
    for i in OPERATORS[:2]:  # two rounds of K = 2 steps an epoch, each step two micro-batches
        rounds = [m for m in metrics(ops.data_dir(i)) if m["kind"] == "round"]
        assert [(m["epoch"], m["round"], m["applied"]) for m in rounds] == [
            (0, 0, 2),
            (0, 1, 2),
            (1, 0, 2),
            (1, 1, 2),
        ]


@pytest.mark.timeout(300)
def test_two_nodes_train_a_paper_mode_job_in_sign_steps_of_its_outer_lr(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    """Paper mode as a caller picks it: a sync every step, a sign step of outer_lr on the
    shared state (the replay checks of its rounds: tests/e2e/test_replay_check_e2e.py)."""
    lr = 0.001
    recipe = Recipe(demo_mode="paper", outer_lr=lr, outer_momentum=0.99, batch_size=2)
    job_id, ops = _two_nodes_train(
        chain, bsm, accounts, dataset, tmp_path, recipe, steps=3, epochs=1, sync_interval=1
    )
    votes = [bytes(e.args["checkpoint"]) for e in events(bsm, job_id, "CheckpointRevealed")]
    assert len(votes) == 2 and votes[0] == votes[1]
    assert [e.args["paidMembers"] for e in events(bsm, job_id, "EpochFinalized")] == [2]
    assert not events(bsm, job_id, "Slashed")
    for i in OPERATORS[:2]:
        seen = metrics(ops.data_dir(i))
        rounds = [(m["round"], m["applied"]) for m in seen if m["kind"] == "round"]
        assert rounds == [(0, 2), (1, 2), (2, 2)]  # one step a round
    start = start_model("builtin:tiny").fresh().state_dict()
    job_dir = ops.data_dir(OPERATORS[0]) / "jobs" / str(job_id)
    (trained,) = job_dir.glob("attempt-*.safetensors")  # the one epoch's one attempt
    end = checkpoint.load(trained)
    moved = torch.cat([(end[n] - start[n]).reshape(-1) for n in start]) / lr
    assert moved.abs().max() > 0.5 and (moved - moved.round()).abs().max() < 1e-2  # sign steps

"""A job's pinned recipe reaches what the node builds: the backend's method settings, the batch
size and seed, the DeMo optimizer (inner AdamW and outer step); a recipe failing its hash is
`RecipeInvalid`; a job without one keeps the node's settings exactly as before."""

from __future__ import annotations

import pytest

from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain.recipe import Recipe
from dtrain_node.errors import RecipeInvalid
from dtrain_node.operator.node import NodeConfig
from dtrain_node.operator.preflight import CANNOT
from dtrain_node.optim.optimizer import DeMo
from dtrain_node.optim.settings import demo_config
from dtrain_node.train import tasks
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.train.finetune import MethodOptions

RECIPE = Recipe(
    batch_size=3,
    inner_lr=5e-4,
    inner_beta1=0.8,
    inner_beta2=0.9,
    inner_weight_decay=0.01,
    outer_lr=0.5,
    outer_momentum=0.7,
    outer_weight_decay=0.1,
    dpo_beta=0.3,
    grpo_group=4,
    grpo_kl=0.1,
    grpo_clip=0.3,
    grpo_iterations=2,
    heldout_fraction=0.2,
    seed=11,
)


def chain_job(method: Method, dataset, recipe_hash: bytes, recipe_uri: str) -> Job:
    spec = JobSpec(
        price_per_operator_epoch=1,
        method=method,
        model_uri="builtin:tiny",
        dataset_uri=str(dataset),
        recipe_hash=recipe_hash,
        recipe_uri=recipe_uri,
    )
    state = JobState("0x" + "00" * 20, JobStatus.RUNNING, 0, 0, 0, 0, 0, b"\0" * 32)
    return Job(id=7, spec=spec, state=state)


@pytest.fixture
def recipe_file(tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(RECIPE.to_toml())
    assert Recipe.from_toml(path) == RECIPE
    return str(path)


@pytest.fixture
def node_cfg(tmp_path) -> NodeConfig:
    return NodeConfig(key="0x01", rpc_url="", contract="", data_dir=tmp_path / "n", job_id=7)


def test_recipe_reaches_the_backend_and_the_optimizer(tmp_path, recipe_file, node_cfg) -> None:
    data = tmp_path / "dpo.jsonl"
    tasks.make_dataset(data, "dpo", tasks.reversal(60, length=4, seed=1))
    job = chain_job(Method.DPO, data, RECIPE.hash(), recipe_file)
    tj = TrainJob.from_job(job, batch_size=16)
    assert (tj.recipe, tj.batch_size, tj.seed_offset) == (RECIPE, 3, 11)  # not the node's 16
    backend = make_backend(tj)
    assert backend.opts.dpo_beta == 0.3 and backend.opts.heldout_fraction == 0.2
    assert len(backend.heldout) >= 0.2 * 60
    batch = next(backend.batches(backend_indices(backend), tj.batch_size, seed=0))
    assert batch[0].shape[0] == 2 * 3  # chosen and rejected rows of 3 records

    opt = DeMo(backend.model.named_parameters(), demo_config(node_cfg, job, tj.recipe))
    group = opt.inner.param_groups[0]
    assert (group["lr"], group["betas"], group["weight_decay"]) == (5e-4, (0.8, 0.9), 0.01)
    assert (opt.cfg.lr, opt.cfg.beta, opt.cfg.weight_decay) == (0.5, 0.7, 0.1)


def backend_indices(backend):
    import torch

    return torch.arange(backend.n_items())


def test_grpo_settings_come_from_the_recipe(tmp_path, recipe_file) -> None:
    data = tmp_path / "grpo.jsonl"
    tasks.make_dataset(data, "grpo", tasks.reversal(40, length=4, seed=2))
    backend = make_backend(
        TrainJob.from_job(chain_job(Method.GRPO, data, RECIPE.hash(), recipe_file))
    )
    o = backend.opts
    assert (o.grpo_group, o.grpo_kl, o.grpo_clip, o.grpo_iterations) == (4, 0.1, 0.3, 2)
    assert backend.repeats == 2


def test_a_grpo_rounds_inner_steps_report_their_mean_reward(tmp_path, node_cfg) -> None:
    """The round metric carries the reward of the completions the inner steps sampled (what
    the progress line shows); an SFT round has none."""
    from types import SimpleNamespace

    import torch

    from dtrain_node.operator.epoch import EpochTrainer

    for method, task in ((Method.GRPO, "grpo"), (Method.SFT, "sft")):
        data = tmp_path / f"{task}.jsonl"
        tasks.make_dataset(data, task, tasks.reversal(40, length=4, seed=2))
        job = chain_job(method, data, b"\0" * 32, "")
        tj = TrainJob.from_job(job, batch_size=4)
        backend = make_backend(tj)
        spec = SimpleNamespace(sync_interval=2, steps_per_epoch=4, total_epochs=1)
        trainer = SimpleNamespace(
            job=SimpleNamespace(spec=spec, state=SimpleNamespace(epoch=0)),
            batches=backend.batches(backend_indices(backend), 4, seed=0),
            device=torch.device("cpu"),
            train_job=tj,
            backend=backend,
            opt=DeMo(backend.model.named_parameters(), demo_config(node_cfg, job, tj.recipe)),
            rewards=[],
        )
        tokens, _ = EpochTrainer._inner_steps(trainer)  # type: ignore[arg-type]
        assert tokens > 0
        if method == Method.GRPO:
            assert len(trainer.rewards) == 2 and all(0 <= x <= 1 for x in trainer.rewards)
        else:
            assert trainer.rewards == []


def test_no_recipe_keeps_the_node_settings(tmp_path, node_cfg) -> None:
    data = tmp_path / "sft.jsonl"
    tasks.make_dataset(data, "sft", tasks.reversal(30, length=4, seed=3))
    job = chain_job(Method.SFT, data, b"\0" * 32, "")
    tj = TrainJob.from_job(job, batch_size=16)
    assert (tj.recipe, tj.batch_size, tj.seed_offset) == (None, 16, 0)
    assert make_backend(tj).opts == MethodOptions()
    cfg = demo_config(node_cfg, job, tj.recipe)
    assert (cfg.lr, cfg.beta, cfg.inner_lr) == (node_cfg.outer_lr, node_cfg.beta, node_cfg.inner_lr)
    assert cfg.inner_betas == (0.9, 0.95) and cfg.weight_decay == cfg.inner_weight_decay == 0.0


@pytest.mark.parametrize("case", ["mismatch", "missing", "invalid", "no-uri"])
def test_a_recipe_failing_its_pin_is_recipe_invalid(tmp_path, recipe_file, case) -> None:
    pin, uri = RECIPE.hash(), recipe_file
    if case == "mismatch":
        pin = Recipe().hash()
    elif case == "missing":
        uri = str(tmp_path / "gone.toml")
    elif case == "invalid":
        (tmp_path / "bad.toml").write_text("batch_size = 0\n")
        uri = str(tmp_path / "bad.toml")
    else:
        uri = ""
    with pytest.raises(RecipeInvalid) as exc:
        TrainJob.from_job(chain_job(Method.SFT, tmp_path / "x.jsonl", pin, uri))
    assert isinstance(exc.value, CANNOT)
    assert {"mismatch": "hashes to", "missing": "cannot be read", "invalid": "'batch_size'",
            "no-uri": "no recipe URI"}[case] in str(exc.value)  # fmt: skip

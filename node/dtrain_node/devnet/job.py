"""The job the devnet trains: its dataset file, the built-in tiny model and the `JobSpec`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .money import ETH

if TYPE_CHECKING:
    import torch

    from dtrain import BSM, JobSpec

PRICE = ETH // 100  # per operator and epoch
CORPUS_BYTES = 600_000
# The devnet's deploy parameters for epochs: the contract wants the unbonding period at least
# 4 x (START_GRACE + MIN_EPOCH_DURATION + REVEAL_WINDOW) and every epoch within
# max_epoch_duration().
UNBONDING_PERIOD = 3600
START_GRACE = 30  # seconds between an epoch's start condition and its epochDuration
MIN_EPOCH_DURATION = 60
# Reveals open early once every member committed; only an epoch with a silent member waits for
# its deadline and then the whole window before it can be finalized, so keep it short.
REVEAL_WINDOW = 15
# Certified is final at once on the devnet unless a run asks for challenges (every epoch would
# wait the window out); the challenge e2e tests deploy with a window of their own.
CHALLENGE_WINDOW = 0
SEAT_DRAW_WINDOW = 0  # the first joiners are seated at once (the draw has its own tests)
OPEN_TIMEOUT = 300  # a job that lost its members may be failed by anyone after this
SEAT_BOND = ETH // 10  # the devnet's least seat bond; every operator's 1 ETH covers its seat


def max_epoch_duration() -> int:
    """The longest `epochDuration` the devnet's contract accepts (its `maxEpochDuration()`)."""
    return UNBONDING_PERIOD // 4 - START_GRACE - REVEAL_WINDOW - 4 * CHALLENGE_WINDOW


def deploy_params(
    treasury: str,
    developer: str,
    challenge_window: int = CHALLENGE_WINDOW,
    seat_draw_window: int = SEAT_DRAW_WINDOW,
) -> Any:
    """The devnet's `dtrain.Params`: SDK defaults but for the epoch timing, seat bond,
    challenge window and seat draw window above (or the arguments)."""
    from dtrain import Params

    return Params(
        treasury=treasury,
        developer=developer,
        unbonding_period=UNBONDING_PERIOD,
        min_epoch_duration=MIN_EPOCH_DURATION,
        start_grace=START_GRACE,
        reveal_window=REVEAL_WINDOW,
        open_timeout=OPEN_TIMEOUT,
        min_seat_bond=SEAT_BOND,
        challenge_window=challenge_window,
        seat_draw_window=seat_draw_window,
    )


def make_dataset(
    run_dir: Path, method: str, corpus_bytes: int = CORPUS_BYTES
) -> tuple[Path, bytes]:
    """The job's dataset file and its sha256: stdlib sources for CPT, generated tasks with
    checkable answers for the others."""
    from dtrain_node.train import corpus, tasks

    if method == "cpt":
        path = run_dir / "corpus.txt"
        return path, corpus.build_stdlib_corpus(path, max_bytes=corpus_bytes)
    problems = {
        "sft": lambda: tasks.addition(600, digits=2, seed=0),
        "dpo": lambda: tasks.reversal(600, length=4, seed=0),
        "grpo": lambda: tasks.last_letter(600, length=4, seed=0),
    }[method]()
    path = run_dir / f"{method}.jsonl"
    return path, tasks.make_dataset(path, method, problems)


@dataclass(frozen=True)
class JobOptions:
    """The job a devnet submits and how its nodes run it (named as the demo's options)."""

    operators: int  # operators starting with the job
    epochs: int = 1
    steps: int = 10  # training steps per epoch
    sync: int = 2  # DeMo sync every K steps (the `dtrain job submit` default)
    epoch_duration: int = 150  # seconds
    round_deadline: float = 30.0  # seconds
    method: str = "cpt"
    late_seats: int = 0  # max_operators - operators: seats for operators joining later
    corpus_bytes: int = CORPUS_BYTES  # for CPT
    model: str = "builtin:tiny"  # the start model: a model URI (a Hugging Face folder, ...)
    dataset: str | None = None  # the caller's dataset file; None: one generated for `method`
    recipe: str | None = None  # the job's recipe TOML; None: the reference defaults
    # Members every epoch needs (the job's min_operators, at least 2); None: `operators`.
    min_operators: int | None = None

    def __post_init__(self) -> None:
        if not 2 <= (self.min_operators or self.operators) <= self.operators:
            raise ValueError(
                f"an epoch needs 2 <= min_operators <= operators ({self.operators}), "
                f"got {self.min_operators or self.operators}"
            )

    @classmethod
    def from_args(cls, a: argparse.Namespace, **changes: Any) -> JobOptions:
        known = {f.name: getattr(a, f.name) for f in fields(cls) if hasattr(a, f.name)}
        return cls(**{**known, **changes})


def tiny_job(bsm: BSM, run_dir: Path, options: JobOptions) -> tuple[JobSpec, torch.nn.Module]:
    """The spec of a job on `bsm`: the options' model (the built-in tiny one by default)
    trained on their dataset (by default one written into `run_dir`), at `PRICE`. Returns the
    spec and the initial model."""
    from dtrain import JobSpec, Method
    from dtrain.models import default_topk
    from dtrain.pins import dataset_hash
    from dtrain.recipe import ZERO_HASH, Recipe
    from dtrain_node.train.start import start_model

    o = options
    if o.dataset:
        data, digest = Path(o.dataset), dataset_hash(o.dataset)
    else:
        data, digest = make_dataset(run_dir, o.method, o.corpus_bytes)
    start = start_model(o.model)
    init = start.fresh()
    recipe = Recipe.from_toml(o.recipe) if o.recipe else None
    job = JobSpec(
        price_per_operator_epoch=PRICE,
        total_epochs=o.epochs,
        steps_per_epoch=o.steps,
        sync_interval=o.sync,
        # the member floor of `job submit`'s default: a devnet epoch is a few syncs long, where
        # the coverage term would send a sixth of every chunk; these jobs show the protocol
        topk_per_chunk=default_topk(o.operators + o.late_seats),
        quant_bits=1,
        min_operators=o.min_operators or o.operators,
        max_operators=o.operators + o.late_seats,
        method=Method[o.method.upper()],
        model_hash=start.pin(init.state_dict()),
        model_uri=o.model,
        dataset_hash=digest,
        dataset_uri=str(data),
        epoch_duration=o.epoch_duration,
        seat_bond=SEAT_BOND,
        recipe_hash=recipe.hash() if recipe else ZERO_HASH,
        recipe_uri=o.recipe or "",
    )
    return job, init

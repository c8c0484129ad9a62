"""What a backend is given of a job: its references (as the chain pins them, or as this node
fetched them), its method and its recipe, read and hash-checked once, and the tokens per
sequence that recipe asks of the model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dtrain.errors import ConfigError
from dtrain.recipe import ZERO_HASH, Recipe
from dtrain_node.errors import RecipeInvalid

if TYPE_CHECKING:
    from dtrain.models import Job
    from dtrain_node.train.start import StartModel


@dataclass(frozen=True)
class LocalSources:
    """A job's references with every fetched one replaced by its local path."""

    model_uri: str
    dataset_uri: str
    recipe_uri: str


@dataclass(frozen=True)
class TrainJob:
    """What a backend needs of a job: from the on-chain spec (and the job id, for logs)."""

    job_id: int
    method: str  # "cpt", "sft", "dpo", "grpo"
    model_uri: str
    dataset_uri: str
    dataset_hash: bytes
    batch_size: int = 8
    recipe: Recipe | None = None  # the job's pinned recipe; None: the reference defaults

    @classmethod
    def from_job(cls, job: Job, batch_size: int = 8, local: LocalSources | None = None) -> TrainJob:
        """From the chain's view of a job (`dtrain.models.Job`). A pinned recipe is read and
        hash-checked here (`RecipeInvalid`) and its batch size replaces `batch_size`. `local`:
        the job's model, dataset and recipe as fetched into this node's cache
        (`operator.sources.fetch_job`); None reads the spec's references as they are."""
        spec = job.spec
        recipe_uri = local.recipe_uri if local else spec.recipe_uri
        recipe = load_recipe(spec.recipe_hash, recipe_uri)
        return cls(
            job_id=job.id,
            method=spec.method.name.lower(),
            model_uri=local.model_uri if local else spec.model_uri,
            dataset_uri=local.dataset_uri if local else spec.dataset_uri,
            dataset_hash=spec.dataset_hash,
            batch_size=recipe.batch_size if recipe else batch_size,
            recipe=recipe,
        )

    @property
    def seed_offset(self) -> int:
        """The recipe's seed, added to the batch-order seed (0 without a recipe)."""
        return self.recipe.seed if self.recipe else 0


def load_recipe(recipe_hash: bytes, recipe_uri: str) -> Recipe | None:
    """The recipe a job pins, read from `recipe_uri` (a local path, like the dataset) and checked
    against `recipe_hash`; None for a zero hash (the reference defaults). `RecipeInvalid` when
    it is missing, unreadable, invalid or hashes to something else."""
    if bytes(recipe_hash) == ZERO_HASH:
        return None
    if not recipe_uri:
        raise RecipeInvalid(f"the job pins recipe 0x{bytes(recipe_hash).hex()} but no recipe URI")
    try:
        recipe = Recipe.from_toml(recipe_uri)
    except ConfigError as exc:
        raise RecipeInvalid(str(exc)) from exc
    if recipe.hash() != bytes(recipe_hash):
        raise RecipeInvalid(
            f"recipe {recipe_uri!r} hashes to 0x{recipe.hash().hex()}, "
            f"the job pins 0x{bytes(recipe_hash).hex()}"
        )
    return recipe


def context(job: TrainJob, start: StartModel) -> int:
    """Tokens per training sequence: the recipe's `seq_len` (the reference default without a
    recipe), which must fit the model's positions (`RecipeInvalid` otherwise)."""
    want = getattr(job.recipe, "seq_len", None) or min(start.ctx, DEFAULT_SEQ_LEN)
    if want > start.ctx:
        raise RecipeInvalid(
            f"recipe seq_len {want} exceeds the context of model {job.model_uri!r} ({start.ctx})"
        )
    return want


DEFAULT_SEQ_LEN = 128

"""`dtrain model`, `dtrain data` and `dtrain recipe`: the references and hashes jobs pin."""

from __future__ import annotations

from pathlib import Path

import click

from .. import axolotl, pins
from ..models import Method
from ..recipe import Recipe
from .refs import DEFAULT_CACHE, DEFAULT_MODEL, References, Wanted, pin_job
from .root import Ctx, cli, emit, pass_ctx


@cli.group()
def model() -> None:
    """Model references and the hashes jobs pin."""


@model.command("hash")
@click.argument("uri")
def model_hash_cmd(uri: str) -> None:
    """Print the modelHash a job of model URI URI carries (the hash of its start weights)."""
    click.echo("0x" + pins.model_hash(uri).hex())


@cli.group()
def data() -> None:
    """Datasets and models for jobs."""


@data.command("check", epilog="Example: dtrain data check train.jsonl --method sft")
@click.argument("path")
@click.option(
    "--method",
    type=click.Choice([m.name.lower() for m in Method]),
    required=True,
    help="The job's method: the format its lines must have.",
)
@click.option(
    "--recipe",
    "recipe_path",
    default=None,
    help="The job's recipe (a path, or a p2p: or https: URI with #sha256=).",
)
@click.option(
    "--model-uri",
    "--model",
    "model_uri",
    default=DEFAULT_MODEL,
    show_default=True,
    help="The job's model, as `job submit --model-uri` takes it: the job is built on it as the "
    "nodes will build it.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_CACHE,
    show_default=True,
    help="Where p2p: and https: references are fetched to be checked.",
)
@pass_ctx
def data_check_cmd(
    ctx: Ctx, path: str, method: str, recipe_path: str | None, model_uri: str, cache_dir: Path
) -> None:
    """Validate the dataset PATH for a job of --method with --model-uri and --recipe, with the
    very checks `job submit` runs (its records, then the job built as every node will build it:
    the model loads, the records fit its tokenizer and the recipe's sequence length, the recipe
    fits the method), and print a summary; a bad file prints its bad lines by number, and any
    refusal is the line `job submit` would print, with exit 1. PATH (and --recipe) may be a
    p2p: or https: URI with #sha256=, fetched first. PATH may be an axolotl YAML config
    (.yml/.yaml): its datasets, model and recipe are checked (dtrain.axolotl)."""
    if axolotl.is_config(path):
        recipe = Recipe.from_toml(recipe_path) if recipe_path else None
        summary = axolotl.check_config(path, method, recipe)
    else:
        wanted = Wanted(method, model_uri, path, recipe_path or "")
        with References(cache_dir) as refs:
            summary = pin_job(refs, wanted).summary
    emit(
        ctx, {"dataset": path, "method": method, "summary": summary}, f"dataset  {path}  {summary}"
    )


@cli.group()
def recipe() -> None:
    """Training recipes and the hash jobs pin."""


@recipe.command("hash")
@click.argument("path")
def recipe_hash_cmd(path: str) -> None:
    """Print the recipeHash of the recipe TOML at PATH (sha256 of its canonical JSON)."""
    click.echo("0x" + Recipe.from_toml(path).hash().hex())


@recipe.command("show")
@click.argument("path")
def recipe_show_cmd(path: str) -> None:
    """Print the canonical form of the recipe TOML at PATH (every field, defaults filled in;
    the inner-step schedule fields only when set)."""
    click.echo(Recipe.from_toml(path).canonical())

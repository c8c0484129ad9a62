"""`dtrain model`, `dtrain data` and `dtrain recipe`: the references and hashes jobs pin."""

from __future__ import annotations

import click

from .. import axolotl, pins
from ..models import Method
from ..recipe import Recipe
from .root import (
    Ctx,
    cli,
    emit,
    pass_ctx,
)


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
@click.option("--recipe", "recipe_path", default=None, help="The job's recipe (its GRPO reward).")
@pass_ctx
def data_check_cmd(ctx: Ctx, path: str, method: str, recipe_path: str | None) -> None:
    """Validate the dataset file PATH for a job of --method as `job submit` does, and print a
    summary; a bad file prints its bad lines by number and exits 1. PATH may be an axolotl
    YAML config (.yml/.yaml): its datasets, model and recipe are checked (dtrain.axolotl)."""
    recipe = Recipe.from_toml(recipe_path) if recipe_path else None
    check = axolotl.check_config if axolotl.is_config(path) else pins.check_dataset
    summary = check(path, method, recipe)
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

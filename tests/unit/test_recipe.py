"""The training recipe (`dtrain.recipe`): defaults, canonical form, hash and validation."""

from __future__ import annotations

import hashlib
import json
from dataclasses import fields

import pytest

from dtrain.errors import ConfigError
from dtrain.recipe import RULES, Recipe


def test_defaults_are_the_reference_node_constants() -> None:
    from dtrain_node.operator.node import NodeConfig
    from dtrain_node.optim.optimizer import DeMoConfig
    from dtrain_node.train.finetune import MethodOptions

    r, node, demo, opts = Recipe(), NodeConfig, DeMoConfig(), MethodOptions()
    field_default = {f.name: f.default for f in fields(node)}
    assert r.batch_size == field_default["batch_size"]
    assert r.inner_lr == field_default["inner_lr"]
    assert r.outer_lr == field_default["outer_lr"]
    assert r.outer_momentum == field_default["beta"]
    assert (r.inner_beta1, r.inner_beta2) == demo.inner_betas
    assert r.inner_weight_decay == demo.inner_weight_decay
    assert r.outer_weight_decay == demo.weight_decay
    assert (r.dpo_beta, r.grpo_group, r.grpo_kl) == (opts.dpo_beta, opts.grpo_group, opts.grpo_kl)
    assert (r.grpo_clip, r.grpo_temperature) == (opts.grpo_clip, opts.grpo_temperature)
    assert (r.grpo_iterations, r.heldout_fraction) == (opts.grpo_iterations, opts.heldout_fraction)
    assert set(RULES) == {f.name for f in fields(Recipe)}  # every field is validated


def test_canonical_form_and_hash() -> None:
    r = Recipe()
    text = r.canonical()
    assert " " not in text and json.loads(text)["batch_size"] == 8
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert r.hash() == hashlib.sha256(text.encode()).digest()
    assert Recipe(inner_lr=2e-3).hash() == r.hash()  # a default written out changes nothing
    assert Recipe(outer_lr=1).canonical() == text  # an int for a float is the same float
    assert Recipe(dpo_beta=0.2).hash() != r.hash()


def test_hash_is_stable_under_key_order_whitespace_and_comments(tmp_path) -> None:
    a = tmp_path / "a.toml"
    b = tmp_path / "b.toml"
    a.write_text("batch_size = 4\ndpo_beta = 0.25\nseed = 7\n")
    b.write_text("# a comment\n\n  seed=7\ndpo_beta   =   0.250\n\nbatch_size = 4 # four\n")
    assert Recipe.from_toml(a) == Recipe.from_toml(b) == Recipe(batch_size=4, dpo_beta=0.25, seed=7)
    assert Recipe.from_toml(a).hash() == Recipe.from_toml(f"file://{b}").hash()
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    assert Recipe.from_toml(empty).hash() == Recipe().hash()


BAD = [
    ("batch_size", 0, "'batch_size' must be >= 1, got 0"),
    ("batch_size", 2.5, "'batch_size' must be an integer"),
    ("inner_lr", 0, "'inner_lr' must be > 0"),
    ("inner_lr", "0.1", "'inner_lr' must be a number"),
    ("inner_lr", float("nan"), "'inner_lr' must be > 0, got nan"),
    ("inner_beta1", 1.0, "'inner_beta1' must be in [0, 1)"),
    ("inner_beta2", -0.1, "'inner_beta2' must be in [0, 1)"),
    ("inner_weight_decay", -1, "'inner_weight_decay' must be >= 0"),
    ("outer_lr", -1.0, "'outer_lr' must be > 0"),
    ("outer_momentum", 1.5, "'outer_momentum' must be in [0, 1]"),
    ("outer_weight_decay", -0.5, "'outer_weight_decay' must be >= 0"),
    ("outer_weight_decay", 1.0, "'outer_weight_decay' times 'outer_lr' must be < 1"),
    ("dpo_beta", 0, "'dpo_beta' must be > 0"),
    ("grpo_group", 1, "'grpo_group' must be >= 2"),
    ("grpo_group", True, "'grpo_group' must be a number"),
    ("grpo_kl", -0.01, "'grpo_kl' must be >= 0"),
    ("grpo_clip", 1.0, "'grpo_clip' must be in (0, 1)"),
    ("grpo_temperature", 0.0, "'grpo_temperature' must be > 0"),
    ("grpo_iterations", 0, "'grpo_iterations' must be >= 1"),
    ("heldout_fraction", 1, "'heldout_fraction' must be in (0, 1)"),
    ("seed", -1, "'seed' must be in [0, 2**32)"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD)
def test_each_bad_field_is_named(name, value, message) -> None:
    with pytest.raises(ConfigError) as exc:
        Recipe(**{name: value})
    assert message in str(exc.value) and len(str(exc.value).splitlines()) == 1


def test_bad_files(tmp_path) -> None:
    p = tmp_path / "r.toml"
    p.write_text("batch_size = 4\nlearning_rate = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown recipe field.*'learning_rate'"):
        Recipe.from_toml(p)
    p.write_text("[inner]\nlr = 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown recipe field.*'inner'"):
        Recipe.from_toml(p)
    p.write_text("batch_size = \n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        Recipe.from_toml(p)
    p.write_text('batch_size = "8"\n')
    with pytest.raises(ConfigError, match="'batch_size' must be a number"):
        Recipe.from_toml(p)
    with pytest.raises(ConfigError, match="cannot be read"):
        Recipe.from_toml(tmp_path / "missing.toml")

"""A job's training recipe: every hyper-parameter each node of the job must apply identically.

A `Recipe` is written as a flat TOML file (any subset of the fields below; the rest keep their
defaults, which are the reference node's constants) and pinned on-chain by `recipeHash`, the
sha256 of its canonical form: compact JSON of every field (defaults filled in), keys sorted.
The hash therefore does not depend on key order, whitespace, comments or on whether a default
is written out. A zero `recipeHash` means the reference node's default recipe (docs/methods.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError

ZERO_HASH = b"\x00" * 32


def _check(name: str, value: Any, kind: type, ok: Callable[[Any], bool], rule: str) -> Any:
    """`value` as a `kind` (an int is accepted for a float) when it satisfies `rule`; else a
    ConfigError naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"recipe field {name!r} must be a number ({rule}), got {value!r}")
    if kind is int and not isinstance(value, int):
        raise ConfigError(f"recipe field {name!r} must be an integer ({rule}), got {value!r}")
    value = kind(value)
    if not math.isfinite(value) or not ok(value):
        raise ConfigError(f"recipe field {name!r} must be {rule}, got {value!r}")
    return value


# field -> (type, predicate, rule as printed in errors)
RULES: dict[str, tuple[type, Callable[[Any], bool], str]] = {
    "batch_size": (int, lambda v: v >= 1, ">= 1"),
    "inner_lr": (float, lambda v: v > 0, "> 0"),
    "inner_beta1": (float, lambda v: 0 <= v < 1, "in [0, 1)"),
    "inner_beta2": (float, lambda v: 0 <= v < 1, "in [0, 1)"),
    "inner_weight_decay": (float, lambda v: v >= 0, ">= 0"),
    "outer_lr": (float, lambda v: v > 0, "> 0"),
    "outer_momentum": (float, lambda v: 0 <= v <= 1, "in [0, 1]"),
    "outer_weight_decay": (float, lambda v: v >= 0, ">= 0"),
    "dpo_beta": (float, lambda v: v > 0, "> 0"),
    "grpo_group": (int, lambda v: v >= 2, ">= 2 (advantages are group-relative)"),
    "grpo_kl": (float, lambda v: v >= 0, ">= 0"),
    "grpo_clip": (float, lambda v: 0 < v < 1, "in (0, 1)"),
    "grpo_temperature": (float, lambda v: v > 0, "> 0"),
    "grpo_iterations": (int, lambda v: v >= 1, ">= 1"),
    "heldout_fraction": (float, lambda v: 0 < v < 1, "in (0, 1)"),
    "seed": (int, lambda v: 0 <= v < 2**32, "in [0, 2**32)"),
}


@dataclass(frozen=True)
class Recipe:
    """What every node of a job applies identically. Defaults: the reference node's constants."""

    batch_size: int = 8  # inner-step batch (records, or CPT windows) per node
    inner_lr: float = 2e-3  # local AdamW between syncs
    inner_beta1: float = 0.9
    inner_beta2: float = 0.95
    inner_weight_decay: float = 0.0
    outer_lr: float = 1.0  # DeMo outer step on theta_sync
    outer_momentum: float = 0.9  # DeMo error-feedback decay
    outer_weight_decay: float = 0.0  # decoupled, on theta_sync at each sync
    dpo_beta: float = 0.1
    grpo_group: int = 8  # completions sampled per prompt
    grpo_kl: float = 0.04  # k3 KL coefficient to the frozen reference
    grpo_clip: float = 0.2
    grpo_temperature: float = 1.0
    grpo_iterations: int = 1  # gradient steps per sampled rollout (mu)
    heldout_fraction: float = 0.1  # SFT/DPO/GRPO records held out (CPT: the last 10% of bytes)
    seed: int = 0  # added to the batch-order seed (job id * 1000 + attempt)

    def __post_init__(self) -> None:
        for name, (kind, ok, rule) in RULES.items():
            object.__setattr__(self, name, _check(name, getattr(self, name), kind, ok, rule))
        if self.outer_weight_decay * self.outer_lr >= 1:
            raise ConfigError(
                "recipe field 'outer_weight_decay' times 'outer_lr' must be < 1, got "
                f"{self.outer_weight_decay * self.outer_lr!r}"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "recipe") -> Recipe:
        """From a mapping of field names; an unknown key is a ConfigError."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(
                f"{source}: unknown recipe field(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(known)}"
            )
        return cls(**data)

    @classmethod
    def from_toml(cls, path: str | Path) -> Recipe:
        """Read a flat TOML recipe file (`file://` prefix allowed)."""
        p = Path(str(path).removeprefix("file://"))
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"recipe {str(path)!r} cannot be read: {exc.strerror}") from exc
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"recipe {str(path)!r} is not valid TOML: {exc}") from exc
        return cls.from_dict(data, source=f"recipe {str(path)!r}")

    def canonical(self) -> str:
        """Compact JSON of every field, keys sorted: the bytes `hash()` covers."""
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    def hash(self) -> bytes:
        """The `recipeHash` a job pins: sha256 of `canonical()`."""
        return hashlib.sha256(self.canonical().encode()).digest()

"""A job's training recipe: every hyper-parameter each node of the job must apply identically.

A `Recipe` is written as a flat TOML file (any subset of the fields below; the rest keep their
defaults, which are the reference node's constants, but a field in `ABSENT` takes the value
every recipe meant before it existed) and pinned on-chain by `recipeHash`, the sha256 of its
canonical form: compact JSON of every field (defaults filled in, except the `LATER_FIELDS` at
their defaults or `ABSENT` values, so that recipes written before those fields keep their
meaning and hash), keys sorted. The hash therefore does not depend on key order, whitespace,
comments or on whether a default is written out. A zero `recipeHash` means the reference
node's default recipe (docs/methods.md).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .errors import ConfigError

ZERO_HASH = b"\x00" * 32


REWARDS = ("exact", "numeric", "contains", "regex", "format")  # dtrain_node.train.rewards
GRPO_COMPLETIONS = ("alphabet", "free")
BACKENDS = ("builtin", "trl", "torchtune")  # dtrain_node.train.backend.make_backend
LR_SCHEDULES = ("constant", "linear", "cosine")  # dtrain_node.train.inner.lr_factor
DEMO_MODES = ("local", "paper")  # dtrain_node.optim.optimizer.DeMoConfig.mode
ERROR_FEEDBACK = ("own", "shared")  # DeMoConfig.shared_feedback: False, True
PAPER_MAX_OUTER_LR = 0.1  # paper mode's outer step is lr x sign: every weight moves by lr
MAX_PATTERN = 200  # characters of a reward regex (the recipe's, or a GRPO record's answer)
TOKEN_TOPK, TOKEN_ROWS = 0, 64  # measured in docs/benchmarks.md (token tensors)


def regex_problem(pattern: str) -> str | None:
    """Why `pattern` cannot be a reward regex, or None: longer than MAX_PATTERN, does not
    compile, or repeats a variable-length part without bound (like `(a+)+` or `(a{1,2})*`),
    which Python's `re` can take exponential time on; an atomic group `(?>...)` or a possessive
    quantifier `a++` inside is accepted."""
    if len(pattern) > MAX_PATTERN:
        return f"is {len(pattern)} characters long (at most {MAX_PATTERN})"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"is not a valid regex ({exc})"
    if _nested_unbounded(pattern):
        return (
            "repeats a variable-length part without bound (like (a+)+), which can take "
            "exponential time: make the inner part atomic, (?>a+), or possessive, a++"
        )
    return None


def _nested_unbounded(pattern: str) -> bool:
    from re import _constants as c  # type: ignore[attr-defined]
    from re import _parser  # type: ignore[attr-defined]

    def parts(op: Any, arg: Any) -> list[Any]:
        """The sub-patterns of a node that is not a repeat."""
        if op == c.SUBPATTERN:
            return [arg[-1]]
        if op == c.BRANCH:
            return list(arg[1])
        if op in (c.ASSERT, c.ASSERT_NOT):
            return [arg[1]]
        if op == c.GROUPREF_EXISTS:
            return [p for p in arg[1:] if p is not None]
        return []  # literals, classes, and atomic or possessive parts, which never backtrack

    def walk(items: Any, inside_unbounded: bool) -> bool:
        for op, arg in items:
            if op in (c.MAX_REPEAT, c.MIN_REPEAT):
                lo, hi, body = arg
                if (inside_unbounded and lo != hi) or walk(
                    body, inside_unbounded or hi == c.MAXREPEAT
                ):
                    return True
            elif any(walk(p, inside_unbounded) for p in parts(op, arg)):
                return True
        return False

    try:
        return walk(_parser.parse(pattern), False)
    except Exception:  # the private parser changed: rely on the length limit alone
        return False


def _check(name: str, value: Any, kind: type, ok: Callable[[Any], bool], rule: str) -> Any:
    """`value` as a `kind` (an int is accepted for a float) when it satisfies `rule`; else a
    ConfigError naming the field."""
    if kind is bool or kind is str:
        if not isinstance(value, kind):
            what = "true or false" if kind is bool else "a string"
            raise ConfigError(f"recipe field {name!r} must be {what} ({rule}), got {value!r}")
        if not ok(value):
            raise ConfigError(f"recipe field {name!r} must be {rule}, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"recipe field {name!r} must be a number ({rule}), got {value!r}")
    if kind is int and not isinstance(value, int):
        raise ConfigError(f"recipe field {name!r} must be an integer ({rule}), got {value!r}")
    value = kind(value)
    if not math.isfinite(value) or not ok(value):
        raise ConfigError(f"recipe field {name!r} must be {rule}, got {value!r}")
    return value


def _module_names(text: str) -> str:
    """Comma-separated module names, spaces dropped, sorted and deduplicated (one hash per set)."""
    names = {n.strip() for n in text.split(",")}
    return ",".join(sorted(names)) if text.strip() else ""


MODULE_NAMES = re.compile(r"[A-Za-z_][\w.]*(,[A-Za-z_][\w.]*)*")

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
    "reward": (str, lambda v: v in REWARDS, f"one of {', '.join(REWARDS)}"),
    "reward_pattern": (str, lambda v: True, "a regex (empty: none)"),
    "grpo_max_new_tokens": (int, lambda v: v >= 1, ">= 1"),
    "grpo_completions": (str, lambda v: v in GRPO_COMPLETIONS, "alphabet or free"),
    "seq_len": (int, lambda v: v >= 8, ">= 8"),
    "lora_rank": (int, lambda v: v >= 0, ">= 0 (0: full fine-tuning)"),
    "lora_alpha": (float, lambda v: v > 0, "> 0"),
    "lora_dropout": (float, lambda v: 0 <= v < 1, "in [0, 1)"),
    "lora_targets": (
        str,
        lambda v: v == "" or MODULE_NAMES.fullmatch(v) is not None,
        "comma-separated module names such as 'q_proj,v_proj' (empty: the attention projections)",
    ),
    "bf16": (bool, lambda v: True, "true or false"),
    "backend": (str, lambda v: v in BACKENDS, "builtin, trl or torchtune"),
    "lr_schedule": (str, lambda v: v in LR_SCHEDULES, "constant, linear or cosine"),
    "warmup_steps": (int, lambda v: v >= 0, ">= 0 (inner steps of linear warm-up)"),
    "min_lr_ratio": (float, lambda v: 0 <= v <= 1, "in [0, 1] (of inner_lr, at the job's end)"),
    "max_grad_norm": (float, lambda v: v >= 0, ">= 0 (0: no clipping)"),
    "grad_accum": (int, lambda v: v >= 1, ">= 1 (micro-batches per inner step)"),
    "token_topk": (int, lambda v: 0 <= v <= 4096, "in [0, 4096] (0: auto)"),
    "token_rows": (int, lambda v: v >= 0 and v % 64 == 0, "0 or a multiple of 64"),
    "demo_mode": (str, lambda v: v in DEMO_MODES, "local or paper"),
    "head_mean_topk": (int, lambda v: 0 <= v <= 64, "in [0, 64] (0: no mean row)"),
    "error_feedback": (str, lambda v: v in ERROR_FEEDBACK, "own or shared"),
}

# Fields added after the first pinned canonical form: written into `canonical()` (and
# `to_toml()`) only when set to something else than their default, so that every recipe
# written before them keeps its hash (and a default recipe file stays readable by older nodes).
LATER_FIELDS = (
    "lr_schedule",
    "warmup_steps",
    "min_lr_ratio",
    "max_grad_norm",
    "grad_accum",
    "token_topk",
    "token_rows",
    "demo_mode",
    "head_mean_topk",
    "error_feedback",
)


# Later fields whose default is not what every recipe meant before the field existed: a recipe
# (file or mapping) that leaves one out means that earlier value, and the canonical form leaves
# it out only at that value. So a recipe written before the field keeps its meaning and hash.
ABSENT = {"head_mean_topk": 0}


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):  # JSON's escapes are TOML's, but for DEL, which TOML wants escaped
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007f")
    return repr(v)


# What users of Hugging Face Trainer, TRL and axolotl call our fields.
SPELLINGS = {
    "learning_rate": "inner_lr",
    "lr": "inner_lr",
    "weight_decay": "inner_weight_decay",
    "gradient_accumulation_steps": "grad_accum",
    "per_device_train_batch_size": "batch_size",
    "micro_batch_size": "batch_size",
    "train_batch_size": "batch_size",
    "max_seq_length": "seq_len",
    "sequence_len": "seq_len",
    "max_length": "seq_len",
    "block_size": "seq_len",
    "lr_scheduler_type": "lr_schedule",
    "lr_scheduler": "lr_schedule",
    "lora_r": "lora_rank",
    "lora_target_modules": "lora_targets",
    "beta": "dpo_beta",
    "num_generations": "grpo_group",
    "max_completion_length": "grpo_max_new_tokens",
    "temperature": "grpo_temperature",
    "num_iterations": "grpo_iterations",
}


def _meant(name: str, known: list[str]) -> str | None:
    """The field an unknown recipe key most likely means (None: no good guess)."""
    if name in SPELLINGS:
        return SPELLINGS[name]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
    return close[0] if close else None


@dataclass(frozen=True)
class Recipe:
    """What every node of a job applies identically. Defaults: the reference node's constants."""

    batch_size: int = 8  # inner-step batch (records, or CPT windows) per node
    inner_lr: float = 2e-3  # local AdamW between syncs
    inner_beta1: float = 0.9
    inner_beta2: float = 0.95
    inner_weight_decay: float = 0.0
    outer_lr: float = 1.0  # DeMo outer step on theta_sync
    outer_momentum: float = 0.8  # DeMo error-feedback decay (why 0.8: docs/benchmarks.md)
    outer_weight_decay: float = 0.0  # decoupled, on theta_sync at each sync
    dpo_beta: float = 0.1
    grpo_group: int = 8  # completions sampled per prompt
    grpo_kl: float = 0.04  # k3 KL coefficient to the frozen reference
    grpo_clip: float = 0.2
    grpo_temperature: float = 1.0
    grpo_iterations: int = 1  # gradient steps per sampled rollout (mu)
    heldout_fraction: float = 0.1  # SFT/DPO/GRPO records held out (CPT: the last 10% of bytes)
    seed: int = 0  # added to the batch-order seed (job id * 1000 + attempt)
    reward: str = "exact"  # GRPO reward function (dtrain_node.train.rewards)
    reward_pattern: str = ""  # the `format` reward's regex, e.g. "<answer>(.*)</answer>"
    grpo_max_new_tokens: int = 16  # tokens sampled per free GRPO completion
    # "alphabet": answer-width completions over the answers' characters (cheap, for short
    # fixed-width answers); "free": free text up to grpo_max_new_tokens, ending at EOS
    grpo_completions: str = "alphabet"
    seq_len: int = 128  # tokens per training sequence (must fit the model's context)
    lora_rank: int = 0  # 0: full fine-tuning
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_targets: str = ""  # comma-separated module names; empty: the attention projections
    bf16: bool = False  # bfloat16 autocast on CUDA
    backend: str = "builtin"  # the training library: "builtin", "trl" or "torchtune" (SFT/DPO)
    # The inner step's schedule, over the job's inner steps (epochs x steps per epoch), counted
    # from the job's first step: `warmup_steps` rising linearly to inner_lr, then constant, or a
    # linear or cosine decay to inner_lr x min_lr_ratio at the job's end (dtrain_node.train.inner)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 0.0  # clip the inner step's gradients to this global norm; 0: never
    grad_accum: int = 1  # micro-batches of batch_size each inner step accumulates
    # DeMo on the token tensors (input embedding, output head; docs/demo-optimizer.md):
    # coefficients per 64x64 chunk (0: auto, the most that keeps the packet within 1/1000 of
    # a dense bf16 all-reduce) and rows per scale block (0: one scale per tensor)
    token_topk: int = TOKEN_TOPK
    token_rows: int = TOKEN_ROWS
    # "local": K inner AdamW steps per sync, the outer step on their pseudo-gradient; "paper":
    # the DeMo paper's scheme, a sync every step (the job's sync_interval 1) of the gradient's
    # error feedback and an outer step of outer_lr x sign (docs/demo-optimizer.md)
    demo_mode: str = "local"
    # the output head's mean row, this many coefficients per 64 columns (0: none): the rows
    # beyond the tokenizer's length move together, sent as their mean instead of as blocks
    # (docs/demo-optimizer.md; a recipe that leaves it out means 0, as before it existed)
    head_mean_topk: int = 64
    # what leaves a member's error feedback after a sync: "own", the coefficients it sent;
    # "shared", the shared state's move (local mode; docs/demo-optimizer.md)
    error_feedback: str = "own"

    def __post_init__(self) -> None:
        if isinstance(self.lora_targets, str):
            object.__setattr__(self, "lora_targets", _module_names(self.lora_targets))
        for name, (kind, ok, rule) in RULES.items():
            object.__setattr__(self, name, _check(name, getattr(self, name), kind, ok, rule))
        problem = regex_problem(self.reward_pattern)
        if problem:
            raise ConfigError(f"recipe field 'reward_pattern' {problem}")
        if self.reward == "format" and not self.reward_pattern:
            raise ConfigError(
                "recipe field 'reward_pattern' must be set for reward 'format', e.g. "
                "reward_pattern = '<answer>(.*)</answer>'"
            )
        if self.min_lr_ratio and self.lr_schedule == "constant":
            raise ConfigError(
                "recipe field 'min_lr_ratio' applies to lr_schedule 'linear' or 'cosine' only "
                "(lr_schedule is 'constant'): set the schedule, or leave min_lr_ratio out"
            )
        if self.demo_mode == "paper":
            self._check_paper()
        if self.outer_weight_decay * self.outer_lr >= 1:
            raise ConfigError(
                "recipe field 'outer_weight_decay' times 'outer_lr' must be < 1, got "
                f"{self.outer_weight_decay * self.outer_lr!r}"
            )

    def _check_paper(self) -> None:
        if self.outer_lr > PAPER_MAX_OUTER_LR:
            raise ConfigError(
                f"recipe field 'outer_lr' is {self.outer_lr!r}, over {PAPER_MAX_OUTER_LR} for "
                "demo_mode 'paper', whose outer step moves every weight by outer_lr: set it, "
                "e.g. outer_lr = 0.001 with outer_momentum = 0.99"
            )
        if self.error_feedback != "own":
            raise ConfigError(
                "recipe field 'error_feedback' 'shared' needs demo_mode 'local': paper mode's "
                "error feedback holds gradients, not moves of the shared state"
            )
        if self.lr_schedule != "constant" or self.warmup_steps:
            raise ConfigError(
                "recipe fields 'lr_schedule' and 'warmup_steps' schedule the inner AdamW, which "
                "demo_mode 'paper' does not have: leave them out"
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "recipe") -> Recipe:
        """From a mapping of field names; an unknown key is a ConfigError that names the
        field meant, where it is a Hugging Face, TRL or axolotl name or a near spelling."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            hints = [f"{k!r} is {meant!r}" for k in unknown if (meant := _meant(k, known))]
            raise ConfigError(
                f"{source}: unknown recipe field(s) {', '.join(map(repr, unknown))}"
                + (f" ({'; '.join(hints)})" if hints else "")
                + f"; known: {', '.join(known)}"
            )
        return cls(**{**ABSENT, **data})

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

    def _pinned(self) -> dict[str, Any]:
        """Every field, but the `LATER_FIELDS` left at their defaults (at their `ABSENT` value,
        for those that have one)."""
        later = {
            f.name: ABSENT.get(f.name, f.default) for f in fields(self) if f.name in LATER_FIELDS
        }
        return {k: v for k, v in asdict(self).items() if k not in later or v != later[k]}

    def to_toml(self) -> str:
        """Every field (the `LATER_FIELDS` only when set) as a flat TOML file that `from_toml`
        reads back as this recipe."""
        return "".join(f"{k} = {_toml_value(v)}\n" for k, v in self._pinned().items())

    def canonical(self) -> str:
        """Compact JSON of every field (the `LATER_FIELDS` only when set), keys sorted: the
        bytes `hash()` covers."""
        return json.dumps(self._pinned(), sort_keys=True, separators=(",", ":"))

    def hash(self) -> bytes:
        """The `recipeHash` a job pins: sha256 of `canonical()`."""
        return hashlib.sha256(self.canonical().encode()).digest()

"""Named, verifiable GRPO rewards: `fn(completion, answer) -> float in [0, 1]`, pure functions of
two strings, so every node scores the same completion the same way (the recipe's `reward` picks
one; docs/methods.md "Rewards").

  exact     1 when the completion equals the answer, both stripped of surrounding whitespace.
  numeric   1 when the last number in the completion equals the answer's number within
            NUMERIC_REL_TOL (relative) or NUMERIC_ABS_TOL; numbers may have thousands commas
            ("1,234"), a sign, decimals and an exponent ("-3.5", "1e3").
  contains  1 when the answer appears in the completion (case-sensitive substring).
  regex     1 when the answer, a regex, fullmatches the stripped completion.
  format    the recipe's `reward_pattern` fullmatches the stripped completion (DOTALL). Without a
            group in the pattern: 1 or 0. With one: 0.5 for the match plus 0.5 when its first
            group, stripped, equals the stripped answer (so "<answer>(.*)</answer>" pays 0.5
            for the shape and 1 for the shape with the right answer inside).

Regexes (the recipe's pattern, a record's answer) are checked when the dataset is loaded
(`answer_problem`, dtrain.recipe.regex_problem): at most MAX_PATTERN characters, compiling, no
unbounded repeat of a variable-length part; and a completion longer than MAX_MATCH_CHARS
scores 0 under regex and format, so matching time stays bounded.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable

from dtrain.recipe import MAX_PATTERN, regex_problem
from dtrain.recipe import REWARDS as NAMES
from dtrain_node.errors import DatasetError

RewardFn = Callable[[str, str], float]

NUMERIC_REL_TOL = 1e-6
NUMERIC_ABS_TOL = 1e-9
MAX_MATCH_CHARS = 4096
NUMBER = re.compile(
    r"(?:(?<![\w.])[-+])?"  # a sign, unless it joins two terms ("3-4" holds 3 and 4)
    r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|(?:(?<![\w.])[-+])?\.\d+(?:[eE][-+]?\d+)?"
)


def _to_float(text: str) -> float | None:
    value = float(text.replace(",", ""))
    return value if math.isfinite(value) else None


def last_number(text: str) -> float | None:
    """The last number written in `text`, or None."""
    found = NUMBER.findall(text)
    return _to_float(found[-1]) if found else None


def answer_number(answer: str) -> float | None:
    """The number an answer is (the whole stripped answer), or None."""
    text = answer.strip()
    return _to_float(text) if NUMBER.fullmatch(text) else None


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str, flags: int = 0) -> re.Pattern[str]:
    return re.compile(pattern, flags)


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer.strip())


def numeric(completion: str, answer: str) -> float:
    want, got = answer_number(answer), last_number(completion)
    if want is None or got is None:
        return 0.0
    return float(math.isclose(got, want, rel_tol=NUMERIC_REL_TOL, abs_tol=NUMERIC_ABS_TOL))


def contains(completion: str, answer: str) -> float:
    return float(answer in completion)


def regex(completion: str, answer: str) -> float:
    text = completion.strip()
    if len(text) > MAX_MATCH_CHARS:
        return 0.0
    return float(_compiled(answer).fullmatch(text) is not None)


def format_reward(pattern: str) -> RewardFn:
    """The `format` reward of the recipe's `reward_pattern` (see the module doc)."""
    problem = regex_problem(pattern) if pattern else "is empty"
    if problem:
        raise DatasetError(f"the format reward's pattern {pattern!r} {problem}")
    compiled = _compiled(pattern, re.DOTALL)

    def reward(completion: str, answer: str) -> float:
        text = completion.strip()
        if len(text) > MAX_MATCH_CHARS:
            return 0.0
        m = compiled.fullmatch(text)
        if m is None:
            return 0.0
        if compiled.groups == 0:
            return 1.0
        inside = m.group(1)
        return 0.5 + 0.5 * (inside is not None and inside.strip() == answer.strip())

    return reward


REWARDS: dict[str, RewardFn] = {
    "exact": exact,
    "numeric": numeric,
    "contains": contains,
    "regex": regex,
}


def reward_fn(name: str, pattern: str = "") -> RewardFn:
    """The reward function a recipe names (`reward`, and `reward_pattern` for `format`; the
    others are in REWARDS)."""
    if name == "format":
        return format_reward(pattern)
    if name not in REWARDS:
        raise DatasetError(f"unknown reward {name!r}; known: {', '.join(NAMES)}")
    return REWARDS[name]


def answer_problem(name: str, answer: str) -> str | None:
    """Why a GRPO record's `answer` cannot be scored by reward `name`, or None."""
    if name == "numeric" and answer_number(answer) is None:
        return f"answer {answer!r} is not a number (the numeric reward compares numbers)"
    if name == "regex":
        problem = regex_problem(answer)
        if problem:
            return f"answer {answer[:40]!r} {problem} (the regex reward reads it as a regex)"
    return None


__all__ = ["MAX_PATTERN", "NAMES", "REWARDS", "RewardFn", "answer_problem", "reward_fn"]

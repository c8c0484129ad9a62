"""GRPO reward functions (dtrain_node.train.rewards): each named reward on hand-picked
completions, the format reward's halves, and the registry matching the recipe's names."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.recipe import REWARDS as RECIPE_REWARDS
from dtrain_node.errors import DatasetError
from dtrain_node.train import rewards
from dtrain_node.train.rewards import REWARDS, answer_problem, reward_fn


def test_registry_is_the_recipes_list():
    assert set(RECIPE_REWARDS) == {*REWARDS, "format"}
    for name in REWARDS:
        assert reward_fn(name) is REWARDS[name]
    with pytest.raises(DatasetError, match="unknown reward 'fuzzy'"):
        reward_fn("fuzzy")


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [("42", "42", 1.0), (" 42\n", "42", 1.0), ("42", " 42 ", 1.0), ("4 2", "42", 0.0)],
)
def test_exact(completion, answer, reward):
    assert rewards.exact(completion, answer) == reward


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("The answer is 42.", "42", 1.0),
        ("so 1,234 apples", "1234", 1.0),
        ("total: 1234", "1,234", 1.0),
        ("-3.5", "-3.5", 1.0),
        ("it is 1e3", "1000", 1.0),
        ("0.1 + 0.2 = 0.30000000000000004", "0.3", 1.0),
        ("first 7 then 8", "7", 0.0),  # the last number counts
        ("3-4", "4", 1.0),  # a minus between terms is no sign
        ("x = -4", "-4", 1.0),
        ("no number here", "4", 0.0),
        ("42", "forty-two", 0.0),
        ("1,2,3", "3", 1.0),
        (".5", "0.5", 1.0),
    ],
)
def test_numeric(completion, answer, reward):
    assert rewards.numeric(completion, answer) == reward


def test_numbers_parse():
    assert rewards.last_number("a 1,234.5 b -2e-3") == -0.002
    assert rewards.answer_number(" 1,234 ") == 1234.0
    assert rewards.answer_number("12 apples") is None
    assert rewards.answer_number("1e999") is None  # not finite


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [("Paris, France", "Paris", 1.0), ("paris", "Paris", 0.0), ("", "x", 0.0)],
)
def test_contains(completion, answer, reward):
    assert rewards.contains(completion, answer) == reward


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("  abc12 ", r"[a-z]+\d+", 1.0),
        ("abc12!", r"[a-z]+\d+", 0.0),  # fullmatch, not search
        ("yes", "yes|y", 1.0),
        ("x" * (rewards.MAX_MATCH_CHARS + 1), "x*", 0.0),
    ],
)
def test_regex(completion, answer, reward):
    assert rewards.regex(completion, answer) == reward


def test_format_reward_halves():
    fmt = reward_fn("format", r"<think>.*</think>\s*<answer>(.*)</answer>")
    good = "<think>2 and 2\nmake 4</think> <answer> 4 </answer>"
    assert fmt(good, "4") == 1.0
    assert fmt(good, "5") == 0.5  # the shape without the answer
    assert fmt("4", "4") == 0.0
    assert fmt(good + " trailing", "4") == 0.0  # fullmatch
    shape_only = reward_fn("format", r"<answer>.*</answer>")
    assert shape_only("<answer>anything</answer>", "4") == 1.0
    optional = reward_fn("format", r"<a>(x)?</a>")
    assert optional("<a></a>", "x") == 0.5


def test_format_needs_a_safe_pattern():
    with pytest.raises(DatasetError, match="is empty"):
        reward_fn("format", "")
    with pytest.raises(DatasetError, match="not a valid regex"):
        reward_fn("format", "<a>(")
    with pytest.raises(DatasetError, match="repeats a variable-length part"):
        reward_fn("format", "(a+)+b")


def test_answer_problems():
    assert answer_problem("exact", "anything") is None
    assert "is not a number" in answer_problem("numeric", "four")
    assert answer_problem("numeric", "-1,234.5") is None
    assert "is not a valid regex" in answer_problem("regex", "[0-9")
    assert "is 201 characters long" in answer_problem("regex", "a" * 201)
    assert "repeats a variable-length part" in answer_problem("regex", r"(\d+,)*\d+")
    assert answer_problem("regex", r"(?>\d+,)*\d+") is None  # atomic: no backtracking


def test_accepted_patterns_match_fast():
    """A pattern that passes the checks stays quick on the longest completion it can see."""
    t0 = time.perf_counter()
    for pattern in [r"(?>a+)+b", r"(a++)+b", r"(ab{2})*c", r"\w+\s*=\s*\d+"]:
        assert answer_problem("regex", pattern) is None
        rewards.regex("a" * rewards.MAX_MATCH_CHARS, pattern)
    # catastrophic backtracking on these lengths takes hours; linear matching well under 1 s
    assert time.perf_counter() - t0 < 30


@given(st.text(max_size=30), st.text(max_size=10))
def test_rewards_are_in_unit_interval(completion, answer):
    for fn in (rewards.exact, rewards.numeric, rewards.contains):
        assert 0.0 <= fn(completion, answer) <= 1.0
    fmt = reward_fn("format", "<a>(.*)</a>")
    assert fmt(completion, answer) in (0.0, 0.5, 1.0)

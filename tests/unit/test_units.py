from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import InvalidAmount
from dtrain.units import format_eth, parse_amount, parse_duration


@pytest.mark.parametrize(
    ("text", "wei"),
    [
        ("1.5ether", 1_500_000_000_000_000_000),
        ("1.5 ETH", 1_500_000_000_000_000_000),
        ("200gwei", 200_000_000_000),
        ("42", 42),
        ("42wei", 42),
        (".5ether", 500_000_000_000_000_000),
        (7, 7),
    ],
)
def test_parse_amount(text, wei) -> None:
    assert parse_amount(text) == wei


@pytest.mark.parametrize("text", ["-1ether", "1.5 bananas", "", "ether", "1e18", "0.5wei", -3])
def test_parse_amount_rejects(text) -> None:
    with pytest.raises(InvalidAmount):
        parse_amount(text)


@given(st.integers(min_value=0, max_value=10**30))
def test_amount_round_trip(wei: int) -> None:
    text = format_eth(wei).replace(" ETH", "ether").replace(" wei", "wei")
    assert parse_amount(text) == wei


@given(st.text(max_size=30))
def test_parse_amount_fuzz(text: str) -> None:
    with contextlib.suppress(InvalidAmount):
        assert parse_amount(text) >= 0


def test_durations() -> None:
    assert parse_duration("90") == 90
    assert parse_duration("15m") == 900
    assert parse_duration("2h") == 7200
    assert parse_duration("7d") == 604800
    with pytest.raises(InvalidAmount):
        parse_duration("1y")

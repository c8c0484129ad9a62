from __future__ import annotations

import contextlib
import time

import pytest
from eth_utils import keccak
from hypothesis import given
from hypothesis import strategies as st

import dtrain
from dtrain.errors import ConfigError, InvalidAmount
from dtrain.inputs import parse_amount, parse_duration
from dtrain.units import format_eth, format_relative, format_span, format_time
from dtrain.votes import UNWORKABLE, commitment_hash, new_salt


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


# ---------------------------------------------------------------- commit-reveal votes


def _word(n: int) -> bytes:
    return n.to_bytes(32, "big")


def test_commitment_hash_is_keccak_of_the_abi_encoding() -> None:
    """Built by hand, word by word: abi.encode of (uint256, uint256, address, bytes32,
    uint32[], bytes32, bytes32), the dynamic array's offset in the head and its length and
    items in the tail (not abi.encodePacked)."""
    operator = "0x" + "ab" * 20
    ckpt, evidence, salt = b"\xaa" * 32, b"\x33" * 32, b"\x55" * 32
    head = _word(7) + _word(3) + bytes(12) + bytes.fromhex("ab" * 20) + ckpt + _word(7 * 32)
    tail = _word(2) + _word(5) + _word(2**32 - 1)
    expected = keccak(head + evidence + salt + tail)
    assert commitment_hash(7, 3, operator, ckpt, [5, 2**32 - 1], evidence, salt) == expected
    assert commitment_hash(
        7, 3, operator.upper().replace("0X", "0x"), ckpt, (5, 2**32 - 1), evidence, salt
    ) == (expected)
    assert commitment_hash(7, 3, operator, ckpt, [5, 2**32 - 2], evidence, salt) != expected
    assert commitment_hash(7, 3, operator, ckpt, [5, 2**32 - 1], salt, evidence) != expected


def test_unworkable_is_the_left_aligned_ascii() -> None:
    assert b"UNWORKABLE" + bytes(22) == UNWORKABLE and len(UNWORKABLE) == 32
    assert dtrain.UNWORKABLE is UNWORKABLE and dtrain.commitment_hash is commitment_hash


def test_commitment_inputs_are_checked() -> None:
    with pytest.raises(ConfigError, match="salt must be 32 bytes, got 31"):
        commitment_hash(1, 0, "0x" + "12" * 20, b"\x01" * 32, [], bytes(32), b"\x01" * 31)
    with pytest.raises(ConfigError, match="evidence must be 32 bytes, got 20"):
        commitment_hash(1, 0, "0x" + "12" * 20, b"\x01" * 32, [], bytes(20), b"\x01" * 32)
    with pytest.raises(ConfigError, match="not an address"):
        commitment_hash(1, 0, "0x1234", b"\x01" * 32, [], bytes(32), b"\x01" * 32)
    assert new_salt() != new_salt() and len(new_salt()) == 32


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45, "45 s"),
        (180, "3 min"),
        (185, "3 min 5 s"),
        (3600, "1 h"),
        (3661, "1 h 1 min"),  # two units at most
        (86401, "1 d"),
        (7 * 86400 - 60, "6 d 23 h"),
        (-185, "3 min 5 s"),
    ],
)
def test_format_span(seconds, text) -> None:
    assert format_span(seconds) == text


def test_format_relative_and_time() -> None:
    now = 1_700_000_000
    assert format_relative(now + 7 * 86400 - 60, now) == "in 6 d 23 h"
    assert format_relative(now - 180, now) == "3 min ago"
    assert format_relative(now, now) == "now"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(now + 90))
    assert format_time(now + 90, now=now) == f"{stamp} (in 1 min 30 s)"
    assert format_time(0) == "-"  # no such time (nothing unbonding, no epoch running)
    assert format_time(10**30) == f"unix time {10**30}"


def test_default_topk_grows_with_the_member_count() -> None:
    from dtrain.models import default_topk

    assert [default_topk(n) for n in (1, 2, 4, 5, 8, 32)] == [4, 4, 4, 6, 6, 6]
    with pytest.raises(ValueError, match="max_operators"):
        default_topk(0)


@pytest.mark.parametrize(
    ("members", "syncs", "k"),
    [(4, 100, 41), (4, 150, 28), (8, 150, 28), (4, 1024, 4), (8, 1024, 6), (4, 1, 4096)],
)
def test_default_topk_reaches_coverage_one_in_an_epoch(members: int, syncs: int, k: int) -> None:
    """Short epochs send more of each chunk per sync: every coefficient about once an epoch;
    long ones keep the member floor."""
    from dtrain.models import COVERAGE_TARGET, coverage, default_topk

    assert default_topk(members, syncs) == k
    assert coverage(k, syncs) >= COVERAGE_TARGET or k == default_topk(members)
    assert coverage(k - 1, syncs) < COVERAGE_TARGET or k == default_topk(members)
    with pytest.raises(ValueError, match="syncs_per_epoch"):
        default_topk(members, -1)

"""Round timing of the operator node (dtrain_node.operator.deadlines)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain_node.operator.deadlines import (
    FIRST_ROUND_FACTOR,
    MIN_ROUND_S,
    REPLAY_S,
    SAVE_S,
    TX_S,
    VOTE_MARGIN_S,
    epoch_seconds_needed,
    finish_needs_s,
    reconcile_deadline,
    reveal_window_fits,
    round_deadline,
    round_patience,
)

NOW = 1_000_000.0


def deadline(
    base: float = 20.0,
    first: bool = False,
    left: float = 3600,
    rounds: int = 4,
    settle: float = 5.0,
) -> float:
    return round_deadline(
        base, first=first, now=NOW, epoch_deadline=NOW + left, rounds_left=rounds, settle_s=settle
    )


def test_plenty_of_time_gives_the_configured_deadline() -> None:
    assert deadline() == 20.0
    assert deadline(first=True) == 20.0 * FIRST_ROUND_FACTOR == 80.0


def test_rounds_left_share_the_time_left_less_settle_and_vote_margin() -> None:
    # 100 s left: 80 s after the margin, 4 rounds get 20 s each, less 5 s settle.
    assert deadline(left=100 + VOTE_MARGIN_S - 20, first=True) == 80 / 4 - 5
    assert deadline(base=60.0, left=VOTE_MARGIN_S + 30, rounds=1, settle=0.0) == 30.0


def test_never_below_the_minimum() -> None:
    assert deadline(left=0) == MIN_ROUND_S  # past the deadline: still try to collect
    assert deadline(left=-500, first=True) == MIN_ROUND_S
    with pytest.raises(ValueError, match="rounds_left"):
        deadline(rounds=0)


@given(
    base=st.floats(0.1, 100),
    first=st.booleans(),
    left=st.floats(-1e4, 1e5),
    rounds=st.integers(1, 1000),
    settle=st.floats(0, 30),
)
def test_bounds(base: float, first: bool, left: float, rounds: int, settle: float) -> None:
    got = deadline(base, first, left, rounds, settle)
    assert got >= MIN_ROUND_S
    assert got <= max(MIN_ROUND_S, base * (FIRST_ROUND_FACTOR if first else 1))
    # a round past the minimum fits the rounds left (and their settle) before the margin
    if got > MIN_ROUND_S:
        assert (got + settle) * rounds <= left - VOTE_MARGIN_S + 1e-6 * max(1.0, abs(left))


def test_epoch_seconds_needed_counts_steps_rounds_and_the_vote_margin() -> None:
    # 3000 steps at 0.5 s, 300 rounds of at least MIN_ROUND_S, a longer first round, the margin
    want = 3000 * 0.5 + (300 + FIRST_ROUND_FACTOR) * MIN_ROUND_S + VOTE_MARGIN_S
    assert epoch_seconds_needed(3000, 10, 0.5) == want
    assert epoch_seconds_needed(3000, 10, 0.5) > 5  # the 5 s epoch of a caller's broken job


@given(st.integers(1, 10_000), st.integers(1, 100), st.floats(0, 10))
def test_epoch_seconds_needed_grows_with_steps(steps: int, k: int, step_s: float) -> None:
    assert epoch_seconds_needed(steps + k, k, step_s) >= epoch_seconds_needed(steps, k, step_s)


@pytest.mark.parametrize("args", [(0, 1, 0.5), (10, 0, 0.5), (10, 2, -1.0), (10, 2, float("nan"))])
def test_epoch_seconds_needed_rejects_bad_input(args: tuple) -> None:
    with pytest.raises(ValueError):
        epoch_seconds_needed(*args)


def test_the_vote_margin_holds_the_save_and_both_transactions() -> None:
    assert VOTE_MARGIN_S == SAVE_S + 2 * TX_S  # commit before the deadline, then reveal
    assert not reveal_window_fits(0) and reveal_window_fits(int(TX_S))


def test_patience_is_the_rounds_share_of_the_time_before_the_vote() -> None:
    """A live member not yet in the round is waited for up to the round's fair share of what
    is left before the vote (less the replay allowance), never less than MIN_ROUND_S; the
    transcript agreement gets everything but what replay, save and both votes need."""
    p = round_patience(now=NOW, epoch_deadline=NOW + 400, rounds_left=2, settle_s=5.0)
    assert p == (400 - VOTE_MARGIN_S - REPLAY_S) / 2 - 5.0
    # waiting that long for every round left still ends before the vote's margin
    assert NOW + 2 * (p + 5.0) <= NOW + 400 - VOTE_MARGIN_S - REPLAY_S
    late = round_patience(now=NOW, epoch_deadline=NOW + 10, rounds_left=3, settle_s=5.0)
    assert late == MIN_ROUND_S
    with pytest.raises(ValueError, match="rounds_left must be >= 1"):
        round_patience(now=NOW, epoch_deadline=NOW + 400, rounds_left=0, settle_s=5.0)
    r = reconcile_deadline(now=NOW, epoch_deadline=NOW + 400)
    assert r == 400 - VOTE_MARGIN_S - REPLAY_S
    assert reconcile_deadline(now=NOW, epoch_deadline=NOW) == MIN_ROUND_S


def test_waiting_for_a_slow_member_leaves_us_the_time_to_train_our_own_rounds() -> None:
    """Attack on an honest member: patience that ignored our own training let a slow member
    hold every round to its share and leave us too little time to train the rounds after it.
    Waiting that long, then training each round left at our pace, still ends before the
    vote's margin."""
    left, rounds, settle, ours = 100.0, 4, 2.0, 12.0
    p = round_patience(
        now=NOW, epoch_deadline=NOW + left, rounds_left=rounds, settle_s=settle, compute_s=ours
    )
    t = NOW
    for k in range(rounds):  # this round's wait, then (after it) each later round's training
        t += p + settle + (ours if k < rounds - 1 else 0.0)
    assert t <= NOW + left - VOTE_MARGIN_S - REPLAY_S + 1e-9
    ignored = round_patience(now=NOW, epoch_deadline=NOW + left, rounds_left=rounds, settle_s=2.0)
    assert ignored - p == (rounds - 1) * ours / rounds


def test_what_finishing_an_epoch_needs_counts_every_round_left_and_the_vote() -> None:
    assert finish_needs_s(0, 9.0) == SAVE_S + TX_S  # save the checkpoint, send the commit
    assert finish_needs_s(3, 2.0) == 3 * 2.0 + SAVE_S + TX_S
    assert finish_needs_s(10, 8.0) - finish_needs_s(10, 2.0) == 10 * 6.0  # 4x slower training
    # a lower bound: never more than the epoch's own schedule asks of a node at that pace
    assert finish_needs_s(10, 2.0) < epoch_seconds_needed(10, 1, 2.0)
    for bad in ((-1, 1.0), (1, -0.5), (1, float("nan"))):
        with pytest.raises(ValueError, match="must be >= 0"):
            finish_needs_s(*bad)

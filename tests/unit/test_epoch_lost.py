"""A node that cannot vote its epoch in time gives it up (operator/epoch.py): decided from the
pace of its last two rounds against the commit deadline, once, with its checks abandoned."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from dtrain_node.operator.deadlines import finish_needs_s
from dtrain_node.operator.epoch import EpochTrainer
from dtrain_node.operator.faults import Faults

ME = "0x" + "AB" * 20


def trainer(
    compute_s: list[float], left_s: float, rounds: int = 10, ours: int = 2
) -> SimpleNamespace:
    said: list[tuple[str, Any]] = []
    env = SimpleNamespace(
        me=ME,
        sync_threshold_bps=5000,
        metric=lambda kind, **data: said.append((kind, data)),
        give_up=lambda job, why: said.append(("give_up", why)),
    )
    job = SimpleNamespace(
        id=7, deadline=time.time() + left_s, state=SimpleNamespace(epoch=1, attempt=3)
    )
    checker = SimpleNamespace(abandon=lambda: said.append(("abandon", None)))
    t = SimpleNamespace(
        lost=None,
        compute_s=compute_s,
        participation={ME: ours},
        faults=SimpleNamespace(honest=True),
        rounds=rounds,
        job=job,
        env=env,
        checks=SimpleNamespace(checker=checker),
        said=said,
    )
    t._too_slow = lambda r: EpochTrainer._too_slow(t, r)  # type: ignore[arg-type]
    t._too_absent = lambda r: EpochTrainer._too_absent(t, r)  # type: ignore[arg-type]
    t._lose = lambda r: EpochTrainer._lose(t, r)  # type: ignore[arg-type]
    return t


def test_the_epoch_is_given_up_once_two_rounds_at_our_pace_miss_the_deadline() -> None:
    t = trainer([1.0, 20.0, 20.0], left_s=100.0)
    assert finish_needs_s(8, 20.0) > 100.0
    EpochTrainer._give_up_if_lost(t, 2)  # type: ignore[arg-type]
    assert t.lost is not None and "8 rounds left at 20.0 s" in t.lost
    assert "the commit deadline is in" in t.lost
    assert [k for k, _ in t.said] == ["abandon", "epoch_lost", "give_up"]
    assert t.checks is None  # no more checks: they cost compute too
    lost = t.said[1][1]
    assert (lost["epoch"], lost["attempt"], lost["round"], lost["why"]) == (1, 3, 2, t.lost)
    EpochTrainer._give_up_if_lost(t, 3)  # type: ignore[arg-type]
    assert len(t.said) == 3, "given up once"


def test_one_slow_round_or_a_pace_that_fits_is_no_verdict() -> None:
    for compute_s, left_s in (
        ([5.0], 10.0),  # one round measured
        ([1.0, 20.0, 1.0], 100.0),  # one slow round among fast ones
        ([20.0, 20.0], finish_needs_s(8, 20.0) + 5),  # slow, but in time
    ):
        t = trainer(compute_s, left_s)
        EpochTrainer._give_up_if_lost(t, 2)  # type: ignore[arg-type]
        assert t.lost is None and not t.said, (compute_s, left_s)


def test_a_faulty_member_stays_to_be_judged() -> None:
    """A node running a fault (poisoned packets, running ahead) does not give up: the attacks
    the faults stand for stay and are judged (a slow machine alone is no fault)."""
    assert Faults(slow=4.0).honest and Faults().honest
    assert not Faults(ahead=True).honest and not Faults(garbage_packets=True).honest
    assert not Faults.parse(["attack=scale=100"]).honest
    t = trainer([20.0, 20.0], left_s=10.0, ours=0)
    t.faults = Faults(garbage_packets=True)
    EpochTrainer._give_up_if_lost(t, 2)  # type: ignore[arg-type]
    assert t.lost is None


def test_the_epoch_is_given_up_once_our_packets_can_no_longer_make_the_sync_threshold() -> None:
    """Behind the others, our packets came after they closed the rounds: a vote would show us
    below the chain's share of the rounds (a sync failure), so the epoch is lost as well."""
    t = trainer([1.0, 1.0], left_s=1000.0, rounds=10, ours=1)
    EpochTrainer._give_up_if_lost(t, 6)  # 1 + 4 rounds left = 5 = half of 10: still possible
    assert t.lost is None
    EpochTrainer._give_up_if_lost(t, 7)  # 1 + 3 < 5
    assert (
        t.lost
        == "our packets made 1 of 7 rounds, and the 3 left cannot bring them to the 5 a vote needs"
    )
    assert [k for k, _ in t.said] == ["abandon", "epoch_lost", "give_up"]


def test_an_epoch_the_transcript_shows_below_the_threshold_is_given_up_before_voting() -> None:
    """Our live rounds counted our packets; the agreed transcript has them in fewer rounds than
    a vote needs (they reached the others after the others closed them): voting would be a
    sync failure, so the epoch is given up, and the leave announced, before the vote."""
    t = trainer([1.0, 1.0], left_s=1000.0, rounds=10, ours=5)
    EpochTrainer._give_up_if_the_transcript_lost_it(t)  # type: ignore[arg-type]
    assert t.lost is None and not t.said  # 5 of 10 is the share a vote needs
    t = trainer([1.0, 1.0], left_s=1000.0, rounds=10, ours=4)
    EpochTrainer._give_up_if_the_transcript_lost_it(t)  # type: ignore[arg-type]
    assert t.lost == (
        "our packets made 4 of 10 rounds, and the 0 left cannot bring them to the 5 a vote needs"
    )
    assert [k for k, _ in t.said] == ["abandon", "epoch_lost", "give_up"]
    assert t.said[1][1]["round"] == 10
    t = trainer([1.0, 1.0], left_s=1000.0, rounds=10, ours=0)
    t.faults = Faults(garbage_packets=True)  # a faulty member stays to be judged
    EpochTrainer._give_up_if_the_transcript_lost_it(t)  # type: ignore[arg-type]
    assert t.lost is None

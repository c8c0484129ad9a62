"""The demo's plan, from the parsed options: who starts, joins late, fabricates, goes offline,
poisons its packets."""

from __future__ import annotations

import pytest

from dtrain_node.devnet.__main__ import parse_args
from dtrain_node.devnet.job import JobOptions
from dtrain_node.devnet.plan import Plan


def plan(*argv: str) -> Plan:
    return Plan.from_args(parse_args(list(argv)))


def test_default_story() -> None:
    p = plan()
    assert p.starters == (0, 1, 2, 3)
    assert p.late == 4 and p.operators == (0, 1, 2, 3, 4)
    assert p.fabricator == 1 and p.offline == 2 and p.poisoner == 3
    assert p.faults(1) == ["fabricate", "epoch=1"]
    assert p.faults(2) == ["offline=5", "epoch=2"]  # 12 steps / sync 2: before the last round
    assert p.faults(3) == ["attack=poison", "epoch=3"]  # the last of the 4 epochs
    assert p.faults(0) == [] and p.faults(4) == []  # the late joiner is honest


def test_three_operators_without_late_join_have_no_late_joiner_and_no_poisoner() -> None:
    p = plan("--operators", "3", "--no-late-join")
    assert p.late is None and p.poisoner is None
    assert p.starters == p.operators == (0, 1, 2)
    assert (p.fabricator, p.offline) == (1, 2)


def test_three_operators_with_late_join() -> None:
    p = plan("--operators", "3")
    assert p.starters == (0, 1, 2) and p.late == 3 and p.faults(3) == []


def test_poisoner_only_when_the_job_has_its_epoch() -> None:
    assert plan("--epochs", "3").poisoner is None
    assert plan("--epochs", "3").fabricator == 1
    assert plan("--epochs", "5").faults(3) == ["attack=poison", "epoch=3"]


def test_no_faults_everyone_honest() -> None:
    p = plan("--no-faults", "--no-late-join")
    assert p.fabricator is None and p.offline is None and p.late is None
    assert p.poisoner is None
    assert all(p.faults(i) == [] for i in p.operators)


def test_epoch_duration_follows_the_contract(capsys) -> None:
    assert parse_args(["--epoch-duration", "60"]).epoch_duration == 60
    assert parse_args(["--epoch-duration", "855"]).epoch_duration == 855  # 3600 / 4 - 30 - 15
    for bad in ("59", "856"):
        with pytest.raises(SystemExit):
            parse_args(["--epoch-duration", bad])
        assert "--epoch-duration must be 60..855" in capsys.readouterr().err


def test_faults_only_among_starters() -> None:
    p = plan("--operators", "2", "--steps", "8", "--sync", "2")
    assert p.fabricator == 1 and p.offline is None  # op3 would be the late joiner
    assert p.late == 2 and p.faults(2) == []


def test_every_job_has_at_least_two_operators(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--operators", "1"])
    assert "--operators must be at least 2" in capsys.readouterr().err
    with pytest.raises(ValueError, match="min_operators"):
        JobOptions(4, min_operators=1)
    with pytest.raises(ValueError, match="min_operators"):
        JobOptions(2, min_operators=3)
    assert JobOptions(2).min_operators is None


def test_min_operators_is_the_fewest_members_of_any_epoch() -> None:
    # 4 starters, op5 joins after epoch 0; op2 slashed in epoch 1, op3 in epoch 2: epoch 3 has 3
    assert plan().min_operators(4) == 3
    assert plan("--epochs", "5").min_operators(5) == 2  # the poisoner leaves after epoch 3
    assert plan("--no-faults").min_operators(4) == 4  # nobody leaves: every starter in epoch 0
    assert plan("--no-late-join").min_operators(4) == 2
    assert plan("--operators", "2").min_operators(4) == 2
    assert plan().min_operators(1) == 4

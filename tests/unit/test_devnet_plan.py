"""The demo's plan, from the parsed options: who starts, joins late, fabricates, goes offline."""

from __future__ import annotations

from dtrain_node.devnet.__main__ import parse_args
from dtrain_node.devnet.plan import Plan


def plan(*argv: str) -> Plan:
    return Plan.from_args(parse_args(list(argv)))


def test_default_story() -> None:
    p = plan()
    assert p.starters == (0, 1, 2)
    assert p.late == 3 and p.operators == (0, 1, 2, 3)
    assert p.fabricator == 1 and p.offline == 2
    assert p.faults(1) == ["fabricate", "epoch=1"]
    assert p.faults(2) == ["offline=2", "epoch=2"]  # 12 steps / sync 4: before the last round
    assert p.faults(0) == [] and p.faults(3) == []  # the late joiner is honest


def test_four_operators_without_late_join_have_no_late_joiner() -> None:
    p = plan("--operators", "4", "--no-late-join")
    assert p.late is None
    assert p.starters == p.operators == (0, 1, 2, 3)
    assert (p.fabricator, p.offline) == (1, 2)
    assert p.faults(3) == []


def test_four_operators_with_late_join() -> None:
    p = plan("--operators", "4")
    assert p.starters == (0, 1, 2, 3) and p.late == 4


def test_no_faults_everyone_honest() -> None:
    p = plan("--no-faults", "--no-late-join")
    assert p.fabricator is None and p.offline is None and p.late is None
    assert all(p.faults(i) == [] for i in p.operators)


def test_faults_only_among_starters() -> None:
    p = plan("--operators", "2", "--steps", "8", "--sync", "2")
    assert p.fabricator == 1 and p.offline is None  # op3 would be the late joiner
    assert p.late == 2 and p.faults(2) == []
    assert plan("--operators", "1").fabricator is None

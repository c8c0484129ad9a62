"""bench_robust --shaped: the report pairs each attack with the honest run of its seed and
checks the targets on the numbers (a missed target says MISSED)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import bench_robust  # noqa: E402 (scripts/ is not a package)


def _run(n, f, attack, loss, seed=0, clip=True, false=0):
    return dict(
        n=n, f=f, attack=attack, clip=clip, seed=seed, loss=loss, rounds=10,
        false_exclusions=false, attacker_exclusions=0, clipped_colluders=3, clipped_honest=1,
        screen_s=[0.001], agg_s=[0.001],
    )  # fmt: skip


def test_shaped_rows_pair_each_seed_and_the_verdict_reads_the_targets() -> None:
    runs = [
        _run(7, 1, "honest", 3.0, seed=0),
        _run(7, 1, "honest", 2.0, seed=1),
        _run(7, 1, "honest", 2.97, seed=0, clip=False),  # the bound costs 1.01% here
        _run(7, 1, "honest", 1.98, seed=1, clip=False),
        _run(7, 2, "orth=8", 3.06, seed=0),  # +2% and +4%: +3% on the mean
        _run(7, 2, "orth=8", 2.08, seed=1),
        _run(5, 1, "honest", 3.0),
        _run(5, 1, "honest", 2.9, clip=False),
        _run(5, 2, "push=4", 5.7),  # 1.9x the honest run
    ]
    rows = bench_robust.shaped_rows(runs)
    orth = next(r for r in rows if r["attack"] == "orth=8")
    assert abs(orth["damage_pct"] - 3.0) < 1e-9 and orth["attacker_rounds"] == 40
    verdict = bench_robust.shaped_verdict(rows)
    assert "worst +3.00% (orth=8, n=7; met < 5%), honest exclusions 0 (met)" in verdict
    assert "worst loss 1.90x the honest run's (met <= 2x)" in verdict
    assert "+3.45%, +1.01% (<= 1%: MISSED)" in verdict
    table = bench_robust.shaped_table(rows)
    assert table.count("\n") == len(rows) + 2 and "| 7 | 2 | orth=8 | on |" in table
    runs.append(_run(7, 2, "edge=8", 3.3, false=1))  # +10%, one honest member excluded
    verdict = bench_robust.shaped_verdict(bench_robust.shaped_rows(runs))
    assert "worst +10.00% (edge=8, n=7; MISSED < 5%), honest exclusions 1 (MISSED)" in verdict


def test_an_attack_is_also_measured_against_its_coalition_absent() -> None:
    """What no rule can undo: the colluders' own share of the work. orth=8 at +10% of the
    honest run is +1% of the same seed's run without the colluders' packets."""
    runs = [
        _run(10, 1, "honest", 3.0),
        _run(10, 1, "honest", 3.0, clip=False),
        _run(10, 3, "absent", 3.3),
        _run(10, 3, "orth=8", 3.333),
    ]
    rows = bench_robust.shaped_rows(runs)
    orth = next(r for r in rows if r["attack"] == "orth=8")
    assert abs(orth["vs_absent_pct"] - 1.0) < 1e-9 and abs(orth["damage_pct"] - 11.1) < 1e-9
    verdict = bench_robust.shaped_verdict(rows)
    assert "worst +11.10% (orth=8, n=10; MISSED < 5%)" in verdict  # absent is no attack
    assert "coalition absent (what no rule can undo): worst +1.00% (orth=8, n=10; met" in verdict
    assert "| 10 | 3 | orth=8 | on | 3.3330 | +11.10% | +1.00% |" in bench_robust.shaped_table(rows)


def test_a_report_without_runs_beyond_a_third_says_so() -> None:
    runs = [_run(7, 1, "honest", 3.0), _run(7, 1, "honest", 3.0, clip=False)]
    runs.append(_run(7, 2, "orth=8", 3.03))
    assert "- beyond the bound: not run\n" in bench_robust.shaped_verdict(
        bench_robust.shaped_rows(runs)
    )
    assert bench_robust.shaped_verdict(bench_robust.shaped_rows(runs[:2])) == (
        "- no attack under a third was run\n"
    )


def test_the_support_of_a_round_counts_each_coefficients_senders_and_their_signs() -> None:
    """bench_support: two members sending one coefficient (same sign) and each one alone."""
    import bench_support

    from dtrain_node.optim import codec
    from dtrain_node.optim.compress import CompressConfig, Sparse

    spec = codec.Spec(("w",), ((64, 64),), CompressConfig(k2d=2, k1d=1, bits=1))

    def packet(idx: list[int], lvl: list[int]) -> bytes:
        s = Sparse(torch.tensor([idx]), torch.tensor([lvl], dtype=torch.int8), 0)
        return codec.encode(spec, [s])

    hist, agree, total = bench_support.round_support(
        spec, [packet([3, 7], [1, -1]), packet([3, 9], [1, 1]), packet([3, 7], [-1, -1])]
    )
    assert total == 6 and hist.tolist() == [0, 1, 2, 3]  # index 9 alone, 7 twice, 3 thrice
    assert agree == 5  # index 3: two of three agree; 7: both -1; 9: alone
    row = {"n": 4, "f": 1, "at_least": {1: 1.0, 2: 0.5, 3: 0.25, 4: 0.1}, "majority_sign": 0.9}
    assert "| 4 | 1 | 50.0% | 25.0% | 50.0% | 10.0% | 90.0% |" in bench_support.table([row])

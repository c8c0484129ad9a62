"""The replay spot-check benchmark's quick run, in-process, on the product's model: every cheater
mode is caught whenever it is replayed, honest members are never accused, the simulated catch
probabilities match the closed form, and a checker whose replay always "matches" would catch
nobody (so the assertions are about the replay, not the bookkeeping)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


sys.path.insert(0, str(ROOT / "scripts"))
import bench_verify as bv  # noqa: E402


@pytest.fixture(scope="module")
def quick():
    s = bv.setup(True, "builtin:tiny", None, bv.RATE, None)
    return s, bv.bench(s, log=lambda *a, **k: None)


@pytest.mark.timeout(300)
def test_every_cheater_mode_is_caught_when_replayed(quick) -> None:
    _, res = quick
    assert {r["mode"] for r in res["rows"]} == set(bv.MODES)
    for r in res["rows"]:
        assert r["cheats"] >= 1 and r["caught"] == r["cheats"], r["mode"]
        assert r["detection"] == 1.0


def test_honest_replays_never_mismatch(quick) -> None:
    _, res = quick
    h = res["honest"]
    assert h["checks"] >= 50 and h["mismatches"] == 0 and h["sampled_mismatches"] == 0
    assert h["other_threads_checks"] > 0
    assert h["other_threads_same_selection"] == h["other_threads_checks"]


def test_the_simulation_matches_the_closed_form(quick) -> None:
    s, res = quick
    assert res["rounds_per_epoch"] == 50  # 100 steps per epoch, K = 2 (job defaults)
    for r in res["rows"]:
        for key, p in (("round", s.rate), ("epoch", 1 - (1 - s.rate) ** 50)):
            assert r[f"{key}_closed"] == pytest.approx(p)
            sigma = math.sqrt(p * (1 - p) / r[f"samples_{key}"])
            assert abs(r[f"{key}_sim"] - p) < 5 * sigma + 1e-9, (r["mode"], key)


def test_the_default_rate_meets_the_target_and_makes_cheating_lose(quick) -> None:
    _, res = quick
    e = res["economics"]
    assert e["catch_per_epoch"] >= bv.TARGET and e["rate"] >= e["min_rate_for_target"]
    q = e["catch_per_epoch"]
    price = 0.05e18  # the CLI's example price per operator-epoch
    pay, slash = price * e["operator_bps"] / 1e4, e["min_stake_wei"] * 1e3 / 1e4
    assert q * slash > (1 - q) * pay
    o = res["overhead"]
    assert 0 < o["compute_fraction"] < 0.25 and o["private_state_bytes_per_check"] > 0


def test_the_assignment_is_deterministic_and_never_self_checks() -> None:
    seed = b"\x01" * 32
    a = bv.assign(seed, 8, 0.5)
    assert a == bv.assign(seed, 8, 0.5) and all(c != i and 0 <= c < 8 for i, c in a.items())
    assert len(bv.assign(seed, 8, 1.0)) == 8 and bv.assign(seed, 8, 0.0) == {}
    assert a != bv.assign(b"\x02" * 32, 8, 0.5) or a != bv.assign(b"\x03" * 32, 8, 0.5)


class _AlwaysSame(bytes):
    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = bytes.__hash__


@pytest.mark.timeout(120)
def test_a_checker_that_always_matches_catches_nobody(monkeypatch) -> None:
    s = bv.setup(True, "builtin:tiny", 2, 1.0, None)
    checker = bv.Checker(s.uri)
    monkeypatch.setattr(bv.Checker, "replay", lambda self, *a: _AlwaysSame(b"x"))
    r = bv.run(s, 4, 1, "random", checker, threads_check=False)
    assert r["cheats"] == 1 and r["caught"] == 0  # what the first test would then see

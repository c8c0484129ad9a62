"""Test helpers over dtrain_node.p2p_cluster (which runs nodes as OS processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtrain_node.p2p_cluster import CHAIN_ID, CONTRACT, JOB_ID, Cluster, Proc, account

ROOT = Path(__file__).resolve().parents[2]
__all__ = ["CHAIN_ID", "CONTRACT", "JOB_ID", "ROOT", "Cluster", "Proc", "account"]


def latency_summary(results: list[Any]) -> dict[str, float]:
    lat = sorted(r["latency_s"] for res in results for r in res["rounds"])
    return {
        "median_s": lat[len(lat) // 2],
        "p95_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_s": lat[-1],
    }


def assert_identical_rounds(results: list[Any], rounds: range) -> None:
    """Every node applied the same packets (senders and payload hashes) in every round."""
    for r in rounds:
        views = {
            (tuple(res["rounds"][r]["senders"]), tuple(res["rounds"][r]["digests"]))
            for res in results
        }
        assert len(views) == 1, f"round {r}: nodes disagree: {views}"

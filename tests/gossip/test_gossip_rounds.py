"""Gossip rounds between real OS processes on loopback: delivery, loss recovery, a killed member."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from harness.gossip_cluster import assert_identical_rounds, latency_summary


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_four_nodes_fifty_rounds_identical(cluster: Any, tmp_path: Path) -> None:
    rounds = 50
    c = cluster(4, rounds=rounds, params=4_000_000, gossip={"round_deadline_s": 20.0})
    c.start()
    results = c.wait_done(timeout=180)
    assert_identical_rounds(results, range(rounds))
    for res in results:
        assert res["packet_bytes"] > 5000  # a real codec packet of a ~4M-parameter model
        for r in res["rounds"]:
            assert r["senders"] == sorted(c.members, key=str.lower), f"round {r['round']}"
            assert r["missing"] == [] and r["settled"]
        assert res["participation"] == {m: rounds for m in c.members}
    # each sender's packet is the one it built (same digests seen by everyone)
    summary = latency_summary(results)
    print(f"\n4 nodes x {rounds} rounds, {results[0]['packet_bytes']} B packets: {summary}")
    (tmp_path / "latency.json").write_text(json.dumps(summary))
    assert summary["median_s"] < 5.0


@pytest.mark.slow  # many rounds under loss; the fast tier keeps the attack and kill tests
@pytest.mark.timeout(180)
def test_loss_recovery_through_re_requests(cluster: Any) -> None:
    rounds = 15
    c = cluster(
        3,
        rounds=rounds,
        payload_bytes=20_000,  # the size of a ~10M-parameter model's packet; no codec needed
        gossip={"round_deadline_s": 20.0},
        per_node={0: {"drop_incoming_fraction": 0.5, "fault_seed": 1}},
    )
    c.start()
    results = c.wait_done(timeout=150)
    assert_identical_rounds(results, range(rounds))
    for res in results:
        assert all(r["senders"] == sorted(c.members, key=str.lower) for r in res["rounds"])
    lossy = results[0]["metrics"]
    assert lossy["dropped"].get("fault_injected", 0) > 0, lossy["dropped"]
    assert lossy["recovered"] > 0  # packets that arrived through re-requests


@pytest.mark.timeout(180)
def test_killed_member_is_missing_everywhere(cluster: Any) -> None:
    rounds, victim, kill_after = 7, 3, 2
    deadline, settle = 2.0, 2.0
    c = cluster(
        4,
        rounds=rounds,
        payload_bytes=20_000,
        gossip={"round_deadline_s": deadline, "settle_s": settle, "request_timeout_s": 1.0},
    )
    c.start()
    c.procs[victim].wait_event(lambda e: e.get("round") == kill_after, 60)
    c.kill(victim)
    results = c.wait_done([0, 1, 2], timeout=120)
    assert_identical_rounds(results, range(rounds))
    gone = c.members[victim]
    for res in results:
        rs = res["rounds"]
        for r in rs[: kill_after + 1]:
            assert r["missing"] == [], f"round {r['round']} before the kill"
        for r in rs[kill_after + 2 :]:
            assert r["missing"] == [gone], f"round {r['round']}: {r['missing']}"
            # the survivors do not wait past deadline + settle for a dead member
            assert r["latency_s"] < deadline + settle + 1.5, r
    parts = [res["participation"] for res in results]
    assert parts[0] == parts[1] == parts[2]
    assert parts[0][gone] in (kill_after + 1, kill_after + 2)
    assert all(parts[0][m] == rounds for m in c.members if m != gone)

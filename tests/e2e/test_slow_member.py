"""End to end: a slow honest machine is waited for, not slashed (real anvil, node processes,
libp2p and training)."""

from __future__ import annotations

import statistics

import pytest

from dtrain_node.devnet import ETH, Cluster

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_member_three_times_slower_is_waited_for_and_nobody_is_slashed(tmp_path) -> None:
    """op2's inner steps take 3x as long (`slow=3`): with 100 inner steps per round it starts
    every round ~10 s after the others, longer than their commit deadline (1.5 s) and settle
    (5 s) would wait for its commitment. They keep the commit
    phase open while it is alive and has not begun the round (within the epoch's schedule), so
    every node applies all three packets in every round, votes the same checkpoint, and the
    job completes with everybody paid and nobody slashed."""
    opts = {"epochs": 1, "steps": 200, "sync": 100, "round_deadline": 2.0, "epoch_duration": 400}
    with Cluster(tmp_path, operators=3, **opts) as c:
        c.spawn(0)
        c.spawn(1)
        c.spawn(2, ["slow=3"])
        c.wait(c.ended, 840, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        names = [e.name for e in c.bsm.events(job_id=c.job_id)]
        assert "Slashed" not in names and names.count("OperatorPaid") == 3
        for o in c.ops:
            assert c.bsm.pool(o.address).total_assets == ETH  # nobody lost stake
        rounds = {i: [m for m in c.metrics(i) if m["kind"] == "round"] for i in range(3)}
        assert all(len(rs) == 2 for rs in rounds.values())
        assert all(m["applied"] == 3 for rs in rounds.values() for m in rs), rounds
        fast = statistics.median(m["compute_s"] for i in (0, 1) for m in rounds[i])
        assert statistics.median(m["compute_s"] for m in rounds[2]) > 2 * fast
        votes = {}
        for i in range(3):
            for m in c.metrics(i):
                if m["kind"] == "epoch_trained":
                    votes.setdefault(m["epoch"], set()).add(m["checkpoint"])
        assert sorted(votes) == [0] and all(len(v) == 1 for v in votes.values()), votes

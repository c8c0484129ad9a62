"""End to end: a member that signs two packets for one round is caught by the transcript and
slashed on-chain with its proof (real anvil, node processes, libp2p and training)."""

from __future__ import annotations

import pytest

from dtrain.models import SlashReason
from dtrain_node.devnet import ETH, Cluster

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_equivocator_is_slashed_with_its_proof_and_honest_members_are_paid(tmp_path) -> None:
    """op4 (of 4) publishes a second commitment to another packet right after revealing in
    round 1. Every honest node ends the epoch with the same transcript (without op4 in round
    1), votes the same checkpoint and posts the proof; the chain records the equivocation once,
    slashes op4 at the fabrication rate without paying it, and pays the three others."""
    with Cluster(tmp_path, operators=4, epochs=1, steps=10, sync=2) as c:
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["equivocate=1"])
        c.wait(c.ended, 700, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        events = c.bsm.events(job_id=c.job_id)
        cheat = c.ops[3].address
        proven = [e.args for e in events if e.name == "EquivocationProven"]
        assert [(p["operator"], p["round"]) for p in proven] == [(cheat, 1)]
        slashed = [e.args for e in events if e.name == "Slashed"]
        assert [(s["operator"], SlashReason(s["reason"])) for s in slashed] == [
            (cheat, SlashReason.EQUIVOCATION)
        ]
        p = c.bsm.params()
        assert slashed[0]["amount"] == ETH * p.fabrication_slash_bps // 10_000
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops[:3])
        for o in c.ops[:3]:
            assert c.bsm.pool(o.address).total_assets == ETH  # no honest member lost stake
        votes = set()
        for i in range(4):
            trained = [m for m in c.metrics(i) if m["kind"] == "epoch_trained"]
            votes |= {m["checkpoint"] for m in trained}
            transcript = [m for m in c.metrics(i) if m["kind"] == "transcript"]
            assert transcript and transcript[-1]["settled"], i
        assert len(votes) == 1, votes
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total

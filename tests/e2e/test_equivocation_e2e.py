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


@pytest.mark.timeout(900)
def test_a_withheld_packet_is_out_for_everyone_and_nobody_is_slashed(tmp_path) -> None:
    """op4 (of 4) commits its packet in round 1 and never reveals it, to anyone. The honest
    nodes wait for it until the round's deadline, then every node (op4 included) ends the epoch
    with one transcript without op4 in round 1: one checkpoint and one participation vote, the
    epoch finalizes, and nobody is slashed (op4 missed 1 round of 5, above the sync
    threshold)."""
    with Cluster(tmp_path, operators=4, epochs=1, steps=10, sync=2, round_deadline=3.0) as c:
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["withhold=1"])
        c.wait(c.ended, 700, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        withholder = c.ops[3].address
        votes = set()
        for i in range(4):
            trained = [m for m in c.metrics(i) if m["kind"] == "epoch_trained"]
            votes |= {(m["checkpoint"], tuple(m["participation"])) for m in trained}
            assert len([m for m in c.metrics(i) if m["kind"] == "round"]) == 5, i
            transcript = [m for m in c.metrics(i) if m["kind"] == "transcript"]
            assert transcript and transcript[-1]["settled"], i
        assert len(votes) == 1, votes  # one checkpoint, one participation, everywhere
        ((_, participation),) = votes
        assert sorted(participation) == [4, 5, 5, 5], participation  # op4 out of round 1
        events = c.bsm.events(job_id=c.job_id)
        assert "Slashed" not in [e.name for e in events]
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops)
        assert withholder in paid
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total

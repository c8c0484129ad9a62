"""End to end: a member that runs ahead with a poisoned packet never owns a round (real anvil,
node processes, libp2p and training)."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from dtrain.models import SlashReason
from dtrain_node.devnet import ETH, Cluster

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_a_member_running_ahead_with_poison_owns_no_round_and_no_honest_member_is_slashed(
    tmp_path,
) -> None:
    """op4 (of 4) skips training and closes every round at once (`ahead`), each packet
    poisoned (every scale at its maximum): it commits and reveals round r while the honest
    members are still training round r - 1. No honest node applies a round on its packet
    alone: every honest round holds the three honest packets, the poisoned one is screened
    out, and the transcript puts the runner itself on the same state. The honest members
    vote one bounded checkpoint and are paid; only the runner loses stake."""
    with Cluster(tmp_path, operators=4, epochs=1, steps=8, sync=2, round_deadline=2.0) as c:
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["ahead", "attack=poison"])
        c.wait(c.ended, 700, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        runner = c.ops[3].address
        honest = {o.address for o in c.ops[:3]}

        rounds = {i: [m for m in c.metrics(i) if m["kind"] == "round"] for i in range(4)}
        assert all(len(rounds[i]) == 4 for i in range(4)), rounds
        for i in range(3):
            for m in rounds[i]:
                excluded = [s.lower() for s in m["excluded"]]
                assert m["applied"] == 3 and excluded == [runner.lower()], (i, m)
        # it ran ahead: done with its live rounds before the honest members were, with live
        # rounds that the transcript then corrected
        assert max(m["t"] for m in rounds[3]) < min(
            max(m["t"] for m in rounds[i]) for i in range(3)
        )
        replayed = [m for m in c.metrics(3) if m["kind"] == "transcript"][-1]["replayed"]
        assert replayed > 0

        votes = set()
        for i in range(4):
            votes |= {m["checkpoint"] for m in c.metrics(i) if m["kind"] == "epoch_trained"}
        assert len(votes) == 1, votes  # the runner replayed the transcript: one state
        for i in range(3):
            (ckpt,) = (tmp_path / f"op{i + 1}").rglob("attempt-*.safetensors")
            weights = load_file(str(ckpt))
            biggest = max(float(t.abs().max()) for t in weights.values() if t.is_floating_point())
            assert biggest < 100.0, (i, biggest)  # poison would have pushed it to ~1e5

        events = c.bsm.events(job_id=c.job_id)
        slashed = [
            (e.args["operator"], SlashReason(e.args["reason"]))
            for e in events
            if e.name == "Slashed"
        ]
        assert slashed == [(runner, SlashReason.SYNC_FAILURE)], slashed
        paid = {e.args["operator"] for e in events if e.name == "OperatorPaid"}
        assert paid == honest
        for o in c.ops[:3]:
            assert c.bsm.pool(o.address).total_assets == ETH  # no honest member lost stake
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total

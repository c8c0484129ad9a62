"""End to end: a coalition holding 2/3 of a job's seats certifies a fabricated checkpoint; the
one honest member challenges it, referees outside the job re-execute the epoch from its signed
transcript, and the epoch settles on their verdict (real anvil, node and referee processes,
libp2p and training)."""

from __future__ import annotations

import pytest

from dtrain import vote_key
from dtrain.models import SlashReason
from dtrain_node.devnet import ETH, Cluster

pytestmark = pytest.mark.slow

WINDOW = 30  # seconds: each phase of a challenge (referees apply, commit, reveal)


def _worth(c: Cluster, address: str) -> int:
    """Ether `address` holds in the BSM: credit, self-stake and staking rewards."""
    b = c.bsm
    return b.credit_of(address) + b.stake_of(address, address) + b.pending_rewards(address, address)


@pytest.mark.timeout(1200)
def test_two_sybils_certify_a_fabrication_and_one_honest_member_overturns_it(tmp_path) -> None:
    """Two colluding members of three (1 ETH each, the minimum) vote one fabricated checkpoint,
    a quorum. The honest member's node sees that the certified vote is not its own and
    challenges; three referee nodes apply, fetch its transcript over p2p, re-execute it and
    reveal the honest member's vote; the epoch settles on it: the colluders are slashed for
    fabrication and unpaid, the honest member is paid and gets its bond back, and the
    contract's balance equals its accounting."""
    with Cluster(
        tmp_path,
        operators=3,
        epochs=1,
        steps=8,
        sync=2,
        round_deadline=4.0,
        epoch_duration=240,
        challenge_window=WINDOW,
        referees=3,
    ) as c:
        for r in range(3):
            c.spawn_referee(r)
        start = {o.address: ETH for o in c.ops}  # each node registers with 1 ETH
        c.spawn(0, ["collude"])
        c.spawn(1, ["collude"])
        c.spawn(2)
        c.wait(c.ended, 1000, "the job to end")

        b = c.bsm
        assert b.job(c.job_id).state.status.name == "COMPLETED"
        events = b.events(job_id=c.job_id)
        (honest_vote,) = [m for m in c.metrics(2) if m["kind"] == "epoch_trained"]
        honest_key = vote_key(
            bytes.fromhex(honest_vote["checkpoint"]), honest_vote["participation"]
        )
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        assert challenged["challenger"] == c.ops[2].address
        (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
        assert resolved["overturned"] and bytes(resolved["verdictKey"]) == honest_key
        (finalized,) = [e.args for e in events if e.name == "EpochFinalized"]
        assert bytes(finalized["checkpoint"]).hex() == honest_vote["checkpoint"]

        verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
        assert verdicts and {v["checkpoint"] for v in verdicts} == {honest_vote["checkpoint"]}
        slashed = sorted(
            (e.args["operator"], SlashReason(e.args["reason"]))
            for e in events
            if e.name == "Slashed"
        )
        assert slashed == sorted((o.address, SlashReason.FABRICATION) for o in c.ops[:2])
        paid = [e.args["operator"] for e in events if e.name == "OperatorPaid"]
        assert paid == [c.ops[2].address]

        for o in c.ops[:2]:
            assert _worth(c, o.address) < start[o.address], "a colluder ends with less"
        assert b.pool(c.ops[2].address).total_assets == ETH, "the honest member lost no stake"
        assert b.credit_of(c.ops[2].address) >= b.params().challenge_bond, "its bond came back"
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


def _referee_metrics(c: Cluster, r: int) -> list[dict]:
    from dtrain_node.devnet.cluster import read_metrics

    return read_metrics(c.tmp / f"referee{r + 1}")

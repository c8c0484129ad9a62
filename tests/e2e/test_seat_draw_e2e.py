"""End to end: seats by stake, not by speed. Three operator nodes apply for a job of two seats;
the job waits the seat draw window, an applicant's node draws the seats, the epoch runs with
the two drawn, and the one left out gets its bond back, loses nothing and is paid nothing
(real anvil, node processes, libp2p and training)."""

from __future__ import annotations

import pytest

from dtrain_node.devnet import ETH, Cluster
from dtrain_node.devnet.cluster import read_metrics
from dtrain_node.devnet.plan import node_name

pytestmark = pytest.mark.slow

DRAW_WINDOW = 10  # seconds


@pytest.mark.timeout(900)
def test_three_applicants_two_seats_drawn_by_stake(tmp_path) -> None:
    with Cluster(
        tmp_path,
        operators=2,
        epochs=1,
        steps=4,
        sync=2,
        round_deadline=4.0,
        epoch_duration=240,
        referees=1,  # the account of the third applicant
        seat_draw_window=DRAW_WINDOW,
    ) as c:
        b = c.bsm
        # the third applicant applies first: one of two, it schedules nothing, so however
        # slowly the machine starts the others, all three are in the draw
        c.spawn_applicant(0)
        c.wait(lambda: c.referees[0].address in b.job(c.job_id).members, 300, "an application")
        c.spawn(0)
        c.spawn(1)
        c.wait(c.ended, 800, "the job to end")
        events = b.events(job_id=c.job_id)
        applicants = {o.address for o in [*c.ops, *c.referees]}
        applied = {e.args["operator"] for e in events if e.name == "JoinRequested"}
        assert applied == applicants, "all three applied before the draw"
        (scheduled,) = [e for e in events if e.name == "SeatDrawScheduled"]
        (drawn,) = [e for e in events if e.name == "SeatsDrawn"]
        assert drawn.args["seated"] and len(drawn.args["seated"]) == 2
        assert b.w3.eth.get_block(drawn.block)["timestamp"] >= scheduled.args["drawAt"]
        (out,) = [e.args["operator"] for e in events if e.name == "SeatNotDrawn"]
        assert set(drawn.args["seated"]) | {out} == applicants
        (started,) = [e for e in events if e.name == "EpochStarted"]
        assert started.block == drawn.block, "the draw started the epoch"
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(drawn.args["seated"])
        assert not [e for e in events if e.name == "Slashed"]
        # the one left out: bond released, stake intact, nothing earned, its node said why
        assert b.bonded_of(out) == 0
        assert b.stake_of(out, out) == ETH
        assert b.credit_of(out) == 0
        name = {o.address: node_name(i) for i, o in enumerate(c.ops)}
        name[c.referees[0].address] = "applicant1"
        kinds = [m["kind"] for m in read_metrics(tmp_path / name[out])]
        assert "not_drawn" in kinds and "epoch_trained" not in kinds
        assert b.w3.eth.get_balance(b.address) == b.accounting().total

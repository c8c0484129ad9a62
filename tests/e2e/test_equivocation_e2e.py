"""End to end: a member that signs two packets for one round is caught by the transcript and
slashed on-chain with its proof (real anvil, node processes, libp2p and training)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from dtrain.cli import main as cli_main
from dtrain.models import SlashReason
from dtrain_node.devnet import ETH, Cluster
from dtrain_node.devnet.cluster import node_name
from dtrain_node.verify import evidence

pytestmark = pytest.mark.slow


def _one_evidence(c: Cluster, n: int) -> evidence.EpochTranscript:
    """Every node wrote the epoch's transcript file; each one's packets verify against their
    senders' signed commitments, all are byte-identical and their root is the one each node
    reported. Returns it."""
    files = set()
    for i in range(n):
        (trained,) = [m for m in c.metrics(i) if m["kind"] == "epoch_trained"]
        (t,) = [m for m in c.metrics(i) if m["kind"] == "transcript"]
        record = evidence.load(evidence.path(c.tmp / node_name(i) / "jobs" / "1", t["attempt"]))
        evidence.verify(record, trained["members"])
        assert record.root().hex() == trained["transcript_root"], i
        files.add(record.encode())
    assert len(files) == 1, f"{len(files)} different transcripts"
    return evidence.decode(files.pop())


def _one_vote(c: Cluster, n: int) -> tuple[str, dict[str, int]]:
    """Every node settled its transcript and voted the same checkpoint and participation:
    returns them (participation by member)."""
    votes = set()
    for i in range(n):
        trained = [m for m in c.metrics(i) if m["kind"] == "epoch_trained"]
        votes |= {
            (m["checkpoint"], tuple(zip(m["members"], m["participation"], strict=True)))
            for m in trained
        }
        transcript = [m for m in c.metrics(i) if m["kind"] == "transcript"]
        assert transcript and transcript[-1]["settled"], i
    assert len(votes) == 1, votes  # one checkpoint, one participation, everywhere
    ((checkpoint, participation),) = votes
    return checkpoint, dict(participation)


def _slashed_once_for_equivocating(events: list, cheat: str) -> dict:
    """The chain recorded `cheat`'s equivocation in round 1 once and slashed it once for it;
    returns the slash."""
    proven = [e.args for e in events if e.name == "EquivocationProven"]
    assert [(p["operator"], p["round"]) for p in proven] == [(cheat, 1)]
    slashed = [e.args for e in events if e.name == "Slashed"]
    assert [(s["operator"], SlashReason(s["reason"])) for s in slashed] == [
        (cheat, SlashReason.EQUIVOCATION)
    ]
    return slashed[0]


@pytest.mark.timeout(900)
def test_equivocator_is_slashed_with_its_proof_and_honest_members_are_paid(
    tmp_path, capsys
) -> None:
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
        slash = _slashed_once_for_equivocating(events, cheat)
        assert slash["amount"] == ETH * c.bsm.params().fabrication_slash_bps // 10_000
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops[:3])
        for o in c.ops[:3]:
            assert c.bsm.pool(o.address).total_assets == ETH  # no honest member lost stake
        checkpoint, _ = _one_vote(c, 4)
        record = _one_evidence(c, 4)
        assert [len(r) for r in record.rounds] == [4, 3, 4, 4, 4]  # op4 out of round 1
        assert cheat not in [p.sender for p in record.rounds[1]]
        # a referee outside the job, with no key, recomputes the certified checkpoint from the
        # file alone; the same file without one packet leads elsewhere (exit 1, one line)
        certified = c.bsm.job(c.job_id).state.checkpoint.hex()
        assert checkpoint == certified
        f = tmp_path / "transcript.bin"
        f.write_bytes(record.encode())
        cmd = ["--rpc-url", c.chain.url, "--contract", c.bsm.address, "--json", "node"]
        cmd += ["recompute", "--data-dir", str(tmp_path / "referee"), str(f)]
        capsys.readouterr()
        assert cli_main(cmd) == 0
        assert json.loads(capsys.readouterr().out)["checkpoint"] == certified
        short = dataclasses.replace(record, rounds=(record.rounds[0][1:], *record.rounds[1:]))
        f.write_bytes(short.encode())
        assert cli_main(cmd) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"the chain certified 0x{certified}" in err[0], err
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
        for i in range(4):
            assert len([m for m in c.metrics(i) if m["kind"] == "round"]) == 5, i
        _, participation = _one_vote(c, 4)
        assert participation[withholder] == 4, participation  # out of round 1
        assert sorted(participation.values()) == [4, 5, 5, 5], participation
        record = _one_evidence(c, 4)
        assert withholder not in [p.sender for p in record.rounds[1]]
        events = c.bsm.events(job_id=c.job_id)
        assert "Slashed" not in [e.name for e in events]
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops)
        assert withholder in paid
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total


def _node_log(c: Cluster, i: int) -> str:
    return (c.tmp / node_name(i) / "node.log").read_text()


@pytest.mark.timeout(900)
def test_a_packet_revealed_to_one_member_leaves_one_transcript_and_nobody_is_slashed(
    tmp_path,
) -> None:
    """op4 (of 4) commits its packet in round 1 and reveals it to one member only (through its
    sync server, never by gossip). Whether the others fetch it from that member or the
    transcript leaves it out, every node (op4 included) ends the epoch with one checkpoint and
    one participation vote, the epoch finalizes and nobody is slashed."""
    with Cluster(tmp_path, operators=4, epochs=1, steps=10, sync=2, round_deadline=3.0) as c:
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["late=1"])
        c.wait(c.ended, 700, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        assert _node_log(c, 3).count("fault: round 1 revealed to peer") == 1  # it attacked
        _, participation = _one_vote(c, 4)
        assert [participation[o.address] for o in c.ops[:3]] == [5] * 3, participation
        _one_evidence(c, 4)
        events = c.bsm.events(job_id=c.job_id)
        assert "Slashed" not in [e.name for e in events]
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops)
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total


@pytest.mark.timeout(1200)
def test_seven_members_two_attackers_one_transcript_and_only_the_equivocator_is_slashed(
    tmp_path,
) -> None:
    """A 7-member job with two attackers (under a third of the seats): op6 reveals its round 2
    packet to one member only; op7 equivocates in round 1 and withholds its round 3 packet.
    Every node ends the epoch with one checkpoint and one participation vote, the five honest
    members are in every round, the epoch finalizes, op7 is slashed once with its proof, and
    no honest member loses stake."""
    with Cluster(
        tmp_path, operators=7, epochs=1, steps=10, sync=2, round_deadline=4.0, epoch_duration=300
    ) as c:
        for i in range(5):
            c.spawn(i)
        c.spawn(5, ["late=2"])
        c.spawn(6, ["equivocate=1", "withhold=3"])
        c.wait(c.ended, 1000, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        assert _node_log(c, 5).count("fault: round 2 revealed to peer") == 1
        _, by_member = _one_vote(c, 7)
        assert [by_member[o.address] for o in c.ops[:5]] == [5] * 5, by_member
        assert by_member[c.ops[6].address] == 3, by_member  # out of rounds 1 and 3
        record = _one_evidence(c, 7)
        sizes = [len(r) for r in record.rounds]
        assert sizes[:2] + sizes[3:] == [7, 6, 6, 7] and sizes[2] in (6, 7), sizes
        events = c.bsm.events(job_id=c.job_id)
        cheat = c.ops[6].address
        _slashed_once_for_equivocating(events, cheat)
        paid = {e.args["operator"] for e in events if e.name == "OperatorPaid"}
        assert {o.address for o in c.ops[:5]} <= paid and cheat not in paid
        for o in c.ops[:5]:
            assert c.bsm.pool(o.address).total_assets == ETH
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total

"""Equivocation proofs made by the node's own code (the envelopes its gossip signs, the pairs
reconcile collects) convince the contract on a real anvil, and the member is slashed."""

from __future__ import annotations

import pytest
from harness.chain import ETH, advance, peer_key, spec
from web3 import Web3

from dtrain import errors
from dtrain.client import BSM
from dtrain.models import SlashReason
from dtrain_node.p2p import envelope
from dtrain_node.p2p.reconcile import Equivocation, check_equivocation


def _proof(op: BSM, bsm: BSM, job_id: int, rnd: int, kind: str) -> Equivocation:
    """Two envelopes `op` signed for one round naming two packets (commitments or chunks)."""
    attempt = bsm.job(job_id).state.attempt
    kw = {"chain_id": bsm.chain_id, "contract": bsm.address, "job_id": job_id, "epoch": attempt}
    pair = []
    for payload in (b"one packet" * 50, b"another packet" * 50):
        chunks = envelope.seal(op.account, round=rnd, payload=payload, chunk_size=200, **kw)
        pair.append(envelope.commitment(op.account, chunks) if kind == "commit" else chunks[1])
    proof = Equivocation(rnd, op.sender, pair[0].encode(), pair[1].encode())
    check_equivocation(proof)  # what the nodes check before they post one
    return proof


@pytest.mark.parametrize("kind", ["commit", "chunk"])
def test_a_members_two_signed_packets_get_it_slashed_and_unpaid(
    bsm: BSM, as_account, votes, kind: str
) -> None:
    caller = as_account(4)
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        op.register_operator(ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"], "cpu:2", 0)
    job_id = caller.create_job(spec(total_epochs=1))
    for op in ops:
        op.join_job(job_id)
    cheat = ops[2]
    proof = _proof(cheat, bsm, job_id, 3, kind)
    reporter = as_account(7)
    rc = reporter.report_equivocation(job_id, proof.first, proof.second)
    assert [e.name for e in rc.events] == ["EquivocationProven"]
    assert bsm.equivocators(job_id) == [cheat.sender]
    with pytest.raises(errors.EquivocationKnown):
        reporter.report_equivocation(job_id, proof.second, proof.first)
    honest = _proof(ops[0], bsm, job_id, 3, kind)
    with pytest.raises(errors.NotAnEquivocation):
        reporter.report_equivocation(job_id, honest.first, honest.first)
    with pytest.raises(errors.MalformedEnvelope):
        reporter.report_equivocation(job_id, honest.first, honest.second[:-1])
    members = bsm.members(job_id)
    ckpt = Web3.keccak(text="c")
    for op in ops:  # the cheat even votes with everyone
        votes.commit(op, job_id, 0, ckpt, [4] * len(members))
    for op in ops:
        votes.reveal(op, job_id, 0)
    rc = as_account(8).finalize_epoch(job_id, 0)
    slashed = [e.args for e in rc.events if e.name == "Slashed"]
    assert [(s["operator"], SlashReason(s["reason"])) for s in slashed] == [
        (cheat.sender, SlashReason.EQUIVOCATION)
    ]
    paid = sorted(e.args["operator"] for e in rc.events if e.name == "OperatorPaid")
    assert paid == sorted(op.sender for op in ops[:2])
    advance(bsm.w3, 1)

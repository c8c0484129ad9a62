"""`job cancel` on a running job against a real anvil: the epoch in progress is settled (its
members paid), then the job closes Cancelled and the unearned escrow is refunded to the wei;
operator nodes end cleanly at that boundary."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from harness.chain import ETH, peer_key, spec
from test_operator import CALLER, OPERATORS, Operators, Running, events, submit_tiny_job
from web3 import Web3

from dtrain import errors
from dtrain.client import BSM
from dtrain.models import JobStatus
from dtrain_node.train import corpus


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


def _register(op: BSM, i: int) -> None:
    op.register_operator(ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"], "cpu:2", 0)


def test_cli_cancel_of_a_running_job_refunds_exactly(bsm, as_account, votes, run, accounts):
    """3 epochs, 2 of 3 seats filled: cancelled in epoch 1, epochs 0 and 1 are paid for the
    two members; the caller gets the rest back, exactly."""
    price = ETH // 100
    caller = as_account(CALLER)
    ops = [as_account(i) for i in (1, 2)]
    for i, op in enumerate(ops):
        _register(op, i)
    s = spec(price_per_operator_epoch=price, total_epochs=3, min_operators=2, max_operators=3)
    job_id = caller.create_job(s)
    for op in ops:
        op.join_job(job_id)
    votes.cast(ops, job_id, 0, Web3.keccak(text="e0"), [4, 4])
    bsm.finalize_epoch(job_id, 0)

    with pytest.raises(errors.NotJobCaller):
        ops[0].cancel_job(job_id)
    code, out, err = run("--json", "job", "cancel", str(job_id), key=accounts[CALLER].key)
    assert code == 0, err
    assert json.loads(out)["status"] == "cancel_requested" and json.loads(out)["epoch"] == 1
    assert bsm.cancel_requested(job_id)
    code, out, err = run("job", "status", str(job_id))
    assert code == 0 and "cancel requested: the job ends after epoch 1" in out, err
    with pytest.raises(errors.CancelAlreadyRequested):
        caller.cancel_job(job_id)

    # The epoch in progress is still voted, settled and paid.
    votes.cast(ops, job_id, 1, Web3.keccak(text="e1"), [4, 4])
    rc = bsm.finalize_epoch(job_id, 1)
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.CANCELLED
    assert {e.args["operator"]: e.args["price"] for e in rc.all("OperatorPaid")} == {
        op.sender: price for op in ops
    }
    escrow = price * 3 * 3
    refund = escrow - 2 * 2 * price  # two epochs of two members were earned
    assert rc.first("JobCancelled").args["refund"] == refund
    assert caller.credit_of(caller.sender) == refund
    for op in ops:
        assert bsm.credit_of(op.sender) == 2 * price * 40 // 100
        assert bsm.bonded_of(op.sender) == 0
    assert bsm.accounting().total == bsm.contract_balance()
    with pytest.raises(errors.JobEnded, match="already ended"):
        caller.cancel_job(job_id)
    code, out, err = run("job", "watch", str(job_id), "--no-follow")
    assert code == 0 and f"CancelRequested: jobId {job_id}, epoch 1" in out, err
    assert f"JobCancelled: jobId {job_id}, refund 0.05 ETH" in out, out


@pytest.mark.timeout(240)
def test_nodes_end_cleanly_when_the_caller_cancels(chain, bsm, accounts, dataset, tmp_path):
    """Two operator nodes train; the caller cancels as soon as the job runs: the nodes finish
    that epoch, are paid for it, and stop with the job Cancelled."""
    caller = bsm.with_account(accounts[CALLER].key)
    job_id = submit_tiny_job(caller, dataset, operators=2, epochs=4)
    group = Operators(chain, bsm, accounts, job_id, tmp_path)
    running = [Running(group.node(i)) for i in OPERATORS[:2]]
    deadline = time.time() + 120
    while bsm.job(job_id).state.status != JobStatus.RUNNING:
        assert time.time() < deadline, "the job never started"
        time.sleep(0.2)
    rc = caller.cancel_job(job_id)
    epoch = rc.first("CancelRequested").args["epoch"]
    assert epoch < 3  # the last epoch would complete the job instead
    results = [r.wait(180) for r in running]
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.CANCELLED
    assert [r["status"] for r in results] == ["cancelled", "cancelled"]
    assert job.state.epoch == epoch + 1  # the epoch in progress was finalized, no other
    price = job.spec.price_per_operator_epoch
    paid = events(bsm, job_id, "OperatorPaid")
    assert len(paid) == 2 * (epoch + 1) and all(e.args["price"] == price for e in paid)
    [cancelled] = events(bsm, job_id, "JobCancelled")
    refund = price * 2 * 4 - price * 2 * (epoch + 1)
    assert cancelled.args["refund"] == refund
    assert bsm.credit_of(caller.sender) == refund
    started = [e.args["epoch"] for e in events(bsm, job_id, "EpochStarted")]
    assert max(started) == epoch  # no epoch started after the cancel

"""An --auto node tells the callers of the jobs it passed by why, once its libp2p host runs: a
real anvil, a real gossip host, the caller's real read-only peer."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from harness.chain import ETH
from test_operator import CALLER, Running, submit_tiny_job

from dtrain.progress import refusal_summary, refusals
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.train import corpus


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


@pytest.mark.timeout(180)
def test_auto_node_serves_why_it_passed_each_job_by(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    caller = bsm.with_account(accounts[CALLER].key)
    short = submit_tiny_job(caller, dataset, operators=2, steps=3000, epoch_s=60)
    costly = submit_tiny_job(caller, dataset, operators=2, seat_bond=ETH + 1)  # we stake 1 ETH
    fine = submit_tiny_job(caller, dataset, operators=2, steps=4, epoch_s=600)
    cfg = NodeConfig(
        key=accounts[1].key,
        rpc_url=chain.url,
        contract=bsm.address,
        data_dir=tmp_path / "auto",
        auto=True,
        stake=ETH,
        step_s=0.5,
        poll_s=0.1,
    )
    running = Running(Node(cfg))  # the real gossip host
    try:
        deadline = time.monotonic() + 120
        while accounts[1].address not in bsm.job(fine).members:  # it joined the job it can do
            assert time.monotonic() < deadline and running.thread.is_alive(), running.result
            time.sleep(0.2)
        found = {job: refusals(bsm, job) for job in (short, costly, fine)}
    finally:
        running.node.stop_now.set()
        running.thread.join(30)
    assert [(r.operator, r.reason) for r in found[short]] == [(accounts[1].address, "capacity")]
    assert "an epoch of 60 s, we need" in found[short][0].detail
    assert [(r.reason, r.detail) for r in found[costly]] == [
        ("capacity", "seat bond 1.000000000000000001 ETH above our free stake")
    ]
    assert refusal_summary(found[costly]) == "1 operator refused: not enough capacity"
    assert found[fine] == []  # a member: nothing refused

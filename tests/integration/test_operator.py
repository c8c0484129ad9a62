"""Operator nodes (`Node`, in threads) against the real anvil chain, through the in-process
loopback transport (tests/harness/loopback.py): the runner's fast tier, no libp2p."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from harness.chain import ETH
from harness.loopback import LoopbackHub

from dtrain import JobSpec, Method
from dtrain.client import BSM
from dtrain_node.operator.faults import Faults
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.train import checkpoint, corpus
from dtrain_node.train import models as hf

CALLER = 4
OPERATORS = (1, 2, 3)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


def submit_tiny_job(bsm: BSM, dataset: tuple[Path, bytes], operators: int) -> int:
    """A 1-epoch CPT job of the built-in tiny model: 2 sync rounds of 2 steps."""
    path, digest = dataset
    init = hf.build(hf.PRESETS["tiny"], seed=bsm.next_job_id())
    spec = JobSpec(
        price_per_operator_epoch=ETH // 100,
        total_epochs=1,
        steps_per_epoch=4,
        sync_interval=2,
        min_operators=operators,
        max_operators=operators,
        method=Method.CPT,
        model_hash=checkpoint.canonical_hash(dict(init.state_dict())),
        model_uri="builtin:tiny",
        dataset_hash=digest,
        dataset_uri=str(path),
        epoch_duration=600,
    )
    return bsm.create_job(spec)


def run_nodes(
    chain: Any,
    bsm: BSM,
    accounts: list,
    job_id: int,
    tmp_path: Path,
    n: int,
    faults: dict[int, Faults] | None = None,
) -> list[dict[str, Any]]:
    """The first `n` operator accounts run a `Node` each, in threads, sharing one loopback
    hub, until the job ends; returns their results."""
    faults = faults or {}
    hub = LoopbackHub()
    nodes = [
        Node(
            NodeConfig(
                key=accounts[i].key,
                rpc_url=chain.url,
                contract=bsm.address,
                data_dir=tmp_path / f"op{i}",
                job_id=job_id,
                batch_size=4,
                round_deadline_s=20.0,
                poll_s=0.1,
                faults=faults.get(i, Faults()),
            ),
            transport_factory=hub.factory,
        )
        for i in OPERATORS[:n]
    ]
    results: list[Any] = [None] * len(nodes)

    def main(k: int) -> None:
        try:
            results[k] = nodes[k].run()
        except BaseException as exc:
            results[k] = exc

    threads = [threading.Thread(target=main, args=(k,), daemon=True) for k in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stuck = [n.me for n, t in zip(nodes, threads, strict=True) if t.is_alive()]
    for n in nodes:
        n.stop_now.set()
    assert not stuck, f"nodes still running: {stuck}"
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors
    return results


def metrics(data_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data_dir / "metrics.jsonl").read_text().splitlines()]


def events(bsm: BSM, job_id: int, name: str) -> list[Any]:
    return [e for e in bsm.events(job_id=job_id) if e.name == name]


@pytest.mark.timeout(180)
def test_two_nodes_train_finalize_and_get_paid(chain, bsm, accounts, dataset, tmp_path) -> None:
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=2)
    results = run_nodes(chain, bsm, accounts, job_id, tmp_path, 2)
    ops = {accounts[i].address for i in OPERATORS[:2]}
    job = bsm.job(job_id)
    assert job.state.status.name == "COMPLETED"
    assert [r["status"] for r in results] == ["completed", "completed"]
    submitted = events(bsm, job_id, "CheckpointSubmitted")
    assert {e.args["operator"] for e in submitted} == ops
    hashes = {bytes(e.args["checkpoint"]) for e in submitted}
    assert hashes == {job.state.checkpoint}  # both submitted the same checkpoint
    [fin] = events(bsm, job_id, "EpochFinalized")
    assert fin.args["epoch"] == 0 and fin.args["paidMembers"] == 2
    assert {e.args["operator"] for e in events(bsm, job_id, "OperatorPaid")} == ops
    assert not events(bsm, job_id, "Slashed")
    for i in OPERATORS[:2]:  # every round applied both packets
        rounds = [m for m in metrics(tmp_path / f"op{i}") if m["kind"] == "round"]
        assert [(m["round"], m["applied"], m["missing"]) for m in rounds] == [(0, 2, 0), (1, 2, 0)]
    for r in results:  # both hold and export the final checkpoint
        out = Path(r["export"])
        assert (out / "CHECKPOINT_SHA256").read_text().strip() == job.state.checkpoint.hex()


@pytest.mark.timeout(180)
def test_fabricating_node_is_slashed(chain, bsm, accounts, dataset, tmp_path) -> None:
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=3)
    liar = accounts[OPERATORS[2]].address
    fabricate = Faults.parse(["fabricate"])
    run_nodes(chain, bsm, accounts, job_id, tmp_path, 3, {OPERATORS[2]: fabricate})
    assert bsm.job(job_id).state.status.name == "COMPLETED"
    slashed = events(bsm, job_id, "Slashed")
    assert [e.args["operator"] for e in slashed] == [liar]
    paid = {e.args["operator"] for e in events(bsm, job_id, "OperatorPaid")}
    assert paid == {accounts[i].address for i in OPERATORS[:2]}

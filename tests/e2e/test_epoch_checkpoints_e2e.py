"""Every epoch's checkpoint stays fetchable by its on-chain hash, and the final model is kept
for its caller beyond the operators' --linger until the caller confirms a verified fetch: two
operator nodes (OS processes, libp2p) run a 2-epoch job of the built-in tiny model with a
1-second linger and a long --keep-final; `dtrain job fetch --epoch 0` gets epoch 0's
checkpoint from them, a fetch without the caller's key confirms nothing, and the caller's
fetch of the final model (its receipt) lets both nodes exit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dtrain_node.devnet import Cluster
from dtrain_node.devnet.cluster import read_metrics
from dtrain_node.operator.keep import RECEIPT_FILE

pytestmark = pytest.mark.slow

JOB_S, FETCH_S = 600.0, 180


def fetch(c: Cluster, out: Path, *extra: str, key: str | None = None) -> dict:
    cmd = [sys.executable, "-m", "dtrain.cli", "--rpc-url", c.chain.url, "--contract"]
    cmd += [c.bsm.address, *(["--key", key] if key else []), "--json", "job", "fetch"]
    cmd += [str(c.job_id), "--out", str(out), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=FETCH_S)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def stranger_receipt(c: Cluster, work: Path) -> int:
    """How many holders accept a receipt of the final checkpoint signed by a non-caller."""
    from eth_account import Account

    from dtrain_node.operator.transport import peer_specs
    from dtrain_node.p2p.host import GossipConfig, GossipNode
    from dtrain_node.p2p.receipts import sign_receipt

    job = c.bsm.job(c.job_id)
    data = sign_receipt(
        Account.from_key(c.treasury.key), c.bsm.chain_id, c.bsm.address, c.job_id,
        job.state.checkpoint,
    )  # fmt: skip
    cfg = GossipConfig(data_dir=work, chain_id=c.bsm.chain_id, contract=c.bsm.address,
                       job_id=c.job_id)  # fmt: skip
    g = GossipNode(cfg, Account.create()).start()
    try:
        holders = [h.operator for h in c.bsm.final_holders(c.job_id)]
        return g.send_receipt(data, peer_specs(c.bsm, holders))
    finally:
        g.stop()


def kinds(p) -> list[str]:
    return [m["kind"] for m in read_metrics(p.data_dir)]


@pytest.mark.timeout(900)
def test_each_epoch_fetchable_and_the_final_model_kept_until_the_caller_confirms(
    tmp_path: Path,
) -> None:
    with Cluster(tmp_path, operators=2, epochs=2, steps=4, sync=2) as c:
        procs = [c.spawn(i, linger=1, keep_final=3600) for i in range(2)]
        # Both pass their 1-second linger and keep the final checkpoint for the caller.
        c.wait(lambda: all("keeping_final" in kinds(p) for p in procs), JOB_S, "keeping_final")
        done = c.bsm.events(names=["EpochFinalized"], job_id=c.job_id)
        finalized = {e.args["epoch"]: bytes(e.args["checkpoint"]).hex() for e in done}
        assert sorted(finalized) == [0, 1] and finalized[0] != finalized[1]
        for p in procs:
            [rec] = [m for m in read_metrics(p.data_dir) if m["kind"] == "job_done"]
            assert rec["epochs_served"] == [0, 1]

        got = fetch(c, tmp_path / "epoch0", "--epoch", "0")  # anyone, no key
        assert (got["epoch"], got["checkpoint"]) == (0, finalized[0]) and got["confirmed"] is None
        marker = (tmp_path / "epoch0" / "CHECKPOINT_SHA256").read_text().strip()
        assert marker == finalized[0]

        other = c.treasury.key  # not the job's caller: its fetch confirms nothing
        got = fetch(c, tmp_path / "other", key=other)
        assert (got["epoch"], got["checkpoint"], got["confirmed"]) == (1, finalized[1], None)
        # A receipt signed by someone else, sent to both holders: refused by each.
        assert stranger_receipt(c, tmp_path / "stranger") == 0
        assert all(p.popen.poll() is None for p in procs), "a node stopped keeping the model"

        got = fetch(c, tmp_path / "final", key=c.caller.key)  # the caller's receipt
        assert (got["checkpoint"], got["confirmed"]) == (finalized[1], 2)
        c.wait(lambda: all(p.popen.poll() is not None for p in procs), 120, "nodes to exit")
        for p in procs:
            assert p.popen.returncode == 0
            assert "final_confirmed" in kinds(p)
            assert (p.data_dir / "jobs" / str(c.job_id) / RECEIPT_FILE).is_file()


@pytest.mark.timeout(900)
def test_a_cancelled_jobs_paid_epoch_stays_fetchable_and_is_kept_for_its_caller(
    tmp_path: Path,
) -> None:
    """The caller cancels a 3-epoch job while it runs: the epoch in progress settles and is
    paid, the job closes cancelled, and the two nodes (1-second linger, long --keep-final)
    keep serving its checkpoint as the job's final one: `job status` names them, anyone can
    `job fetch` it by epoch, and the caller's own fetch (without --epoch) hands them the receipt
    that lets both exit."""
    from dtrain.models import JobStatus

    with Cluster(tmp_path, operators=2, epochs=3, steps=4, sync=2) as c:
        procs = [c.spawn(i, linger=1, keep_final=3600) for i in range(2)]
        running = lambda: c.bsm.job(c.job_id).state.status == JobStatus.RUNNING  # noqa: E731
        c.wait(running, JOB_S, "the job to run")
        c.bsm.with_account(c.caller.key).cancel_job(c.job_id)
        c.wait(lambda: all("keeping_final" in kinds(p) for p in procs), JOB_S, "keeping_final")
        job = c.bsm.job(c.job_id)
        assert job.state.status == JobStatus.CANCELLED and 1 <= job.state.epoch < 3
        paid, digest = job.state.epoch - 1, job.state.checkpoint.hex()
        holders = {h.operator for h in c.bsm.final_holders(c.job_id)}
        assert holders == {o.address for o in c.ops[:2]}

        got = fetch(c, tmp_path / "by-epoch", "--epoch", str(paid))  # anyone, no key
        assert (got["epoch"], got["checkpoint"], got["confirmed"]) == (paid, digest, None)
        assert all(p.popen.poll() is None for p in procs), "a node stopped keeping the model"

        got = fetch(c, tmp_path / "final", key=c.caller.key)  # the caller's receipt
        assert (got["epoch"], got["checkpoint"], got["confirmed"]) == (paid, digest, 2)
        assert (tmp_path / "final" / "CHECKPOINT_SHA256").read_text().strip() == digest
        c.wait(lambda: all(p.popen.poll() is not None for p in procs), 120, "nodes to exit")
        for p in procs:
            assert p.popen.returncode == 0 and "final_confirmed" in kinds(p)

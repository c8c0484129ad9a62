"""End to end: real anvil, real node processes, real libp2p gossip, real training."""

from __future__ import annotations

import json

import pytest

from dtrain_node import devnet
from dtrain_node.devnet import ETH, Cluster

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_devnet_story(tmp_path, capsys) -> None:
    """4 operators, a 5th joins at a boundary, one fabricates (epoch 1), one goes offline
    (epoch 2), one poisons its packets (epoch 3); exact money. Every epoch needs the job's
    min_operators = 3 members (epoch 3 has no more), so epoch 0 starts with the first three
    starters to join; the fourth joins at its boundary, the late one at a boundary too."""
    code = devnet.main(["--run-dir", str(tmp_path), "--timeout", "700"])
    out = capsys.readouterr().out.splitlines()
    # the story says where its logs are first, then each epoch as it starts
    assert out[0] == f"demo: logs and results in {tmp_path.resolve()}", out[:3]
    running = [line.split("epoch ")[1].split(" ")[0] for line in out if ": running, epoch " in line]
    assert list(dict.fromkeys(running)) == ["0", "1", "2", "3"], out  # an epoch retried: once
    result = json.loads((tmp_path / "demo-result.json").read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert code == 0 and not failed, failed
    epochs, names = result["epochs"], {}
    for b in result["balances"]:
        names[b["address"]] = b["account"]
    assert len(epochs[0]["members"]) == 3 and len(epochs[0]["paid"]) == 3
    assert len(epochs[1]["members"]) >= 4  # the fourth starter joined at the first boundary
    # The late operator starts once epoch 0 runs (its start-up and pre-flight take a while):
    # it joins at a boundary and stays a member from then on.
    with_late = [e for e, ep in enumerate(epochs) if "op5" in (names[m] for m in ep["members"])]
    assert with_late and with_late[0] >= 1 and with_late == list(range(with_late[0], len(epochs)))
    assert [s["reason"] for s in epochs[1]["slashed"]] == ["fabricated checkpoint"]
    assert [s["reason"] for s in epochs[2]["slashed"]] == ["offline mid-epoch"]
    poisoned = epochs[3]
    assert [(names[s["address"]], s["reason"]) for s in poisoned["slashed"]] == [
        ("op4", "failed to sync")
    ]
    honest = sorted(names[m] for m in poisoned["members"] if names[m] != "op4")
    assert honest == ["op1", "op5"] and sorted(names[m] for m in poisoned["paid"]) == honest
    assert all(b["ok"] for b in result["balances"])
    assert result["heldout_loss_after"] < result["heldout_loss_before"]
    # The caller's copy, through its own tokenizer: training's loss, and greedy continuations of
    # held-out prompts that match the held-out text better than the initial model's.
    tokenizer_loss = result["heldout_loss_via_tokenizer"]
    assert tokenizer_loss == pytest.approx(result["heldout_loss_training_side"], abs=1e-3)
    assert result["continuation_match"] > result["continuation_match_before"]
    assert result["final_checkpoint"] != "0x" + "00" * 32


@pytest.mark.timeout(600)
def test_no_quorum_retries_without_slashing(tmp_path) -> None:
    with Cluster(tmp_path, operators=2) as c:
        c.spawn(0)
        c.spawn(1, ["fabricate", "once"])  # disagrees on the first attempt only
        c.wait(c.ended, 500, "the job to end")
        job = c.bsm.job(c.job_id)
        assert job.state.status.name == "COMPLETED"
        names = [e.name for e in c.bsm.events(job_id=c.job_id)]
        assert names.count("EpochFailed") == 1 and names.count("EpochFinalized") == 1
        assert "Slashed" not in names
        for o in c.ops:
            assert c.bsm.pool(o.address).total_assets == ETH  # nobody lost stake


@pytest.mark.timeout(600)
def test_node_restart_mid_epoch_resumes(tmp_path) -> None:
    with Cluster(tmp_path, operators=2, steps=20, round_deadline=40.0, epoch_duration=300) as c:
        # op1 dies like a crashed machine right after saving round 1 and before publishing
        # anything of round 2 (a kill at a random moment could land after its round-2 packet
        # went out, which the restarted node cannot take back)
        p0 = c.spawn(0, ["offline=2"])
        c.spawn(1)
        assert p0.popen.wait(timeout=300) == 3
        c.procs.remove(p0)
        assert max(m["round"] for m in c.metrics(0) if m["kind"] == "round") == 1
        c.spawn(0)  # same data dir: resumes from its round state
        c.wait(c.ended, 400, "the job to end")
        kinds = [m["kind"] for m in c.metrics(0)]
        assert "resumed" in kinds
        assert kinds.count("committed") == 1  # never commits twice
        assert kinds.count("revealed") == 1
        names = [e.name for e in c.bsm.events(job_id=c.job_id)]
        assert "Slashed" not in names and names.count("OperatorPaid") == 2


@pytest.mark.timeout(600)
def test_two_members_restarting_at_once_resume_and_nobody_is_slashed(tmp_path) -> None:
    """op1 and op2 (of 3) crash in the same round and come back together: each resumes from
    its own round state while the other is still starting, the three finish the epoch on one
    transcript, and nobody votes UNWORKABLE, commits twice or is slashed."""
    with Cluster(tmp_path, operators=3, steps=8, round_deadline=40.0, epoch_duration=300) as c:
        crashing = [c.spawn(0, ["offline=2"]), c.spawn(1, ["offline=2"])]
        c.spawn(2)
        for p in crashing:
            assert p.popen.wait(timeout=300) == 3
            c.procs.remove(p)
        c.spawn(0)
        c.spawn(1)
        c.wait(c.ended, 400, "the job to end")
        assert c.bsm.job(c.job_id).state.status.name == "COMPLETED"
        votes = set()
        for i in range(3):
            kinds = [m["kind"] for m in c.metrics(i)]
            assert ("resumed" in kinds) == (i < 2), i
            assert kinds.count("committed") == 1 and kinds.count("revealed") == 1, i
            trained = [m for m in c.metrics(i) if m["kind"] == "epoch_trained"]
            votes |= {m["checkpoint"] for m in trained}
        assert len(votes) == 1, votes  # one checkpoint, never UNWORKABLE
        names = [e.name for e in c.bsm.events(job_id=c.job_id)]
        assert "Slashed" not in names and names.count("OperatorPaid") == 3
        assert c.bsm.w3.eth.get_balance(c.bsm.address) == c.bsm.accounting().total


@pytest.mark.timeout(600)
def test_sft_job_in_the_devnet(tmp_path) -> None:
    """A fine-tuning method trains over the same node and gossip path as pre-training."""
    with Cluster(tmp_path, operators=2, steps=8, sync=4, method="sft") as c:
        c.spawn(0)
        c.spawn(1)
        c.wait(c.ended, 500, "the job to end")
        job = c.bsm.job(c.job_id)
        assert job.state.status.name == "COMPLETED" and job.spec.method.name == "SFT"
        paid = [e for e in c.bsm.events(job_id=c.job_id) if e.name == "OperatorPaid"]
        assert len(paid) == 2
        for i in range(2):
            m = c.metrics(i)
            start = next(r for r in m if r["kind"] == "epoch_start")
            trained = next(r for r in m if r["kind"] == "epoch_trained")
            assert trained["checkpoint"] == job.state.checkpoint.hex()
            assert trained["heldout_loss"] < start["heldout_loss"]


@pytest.mark.timeout(900)
def test_demo_job_paid_over_x402_and_model_served_for_a_fee(tmp_path) -> None:
    """`make demo ARGS="--x402 --serve"`, small: the caller buys the job from `dtrain gateway`
    in TestUSD, the split is paid in TestUSD to the unit, then an operator serves the final
    model and the caller pays one chat completion over x402."""
    args = ["--x402", "--serve", "--operators", "2", "--epochs", "2", "--no-faults"]
    code = devnet.main([*args, "--no-late-join", "--run-dir", str(tmp_path), "--timeout", "600"])
    result = json.loads((tmp_path / "demo-result.json").read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert code == 0 and not failed, failed
    names = {b["address"]: b["account"] for b in result["token_balances"]}
    assert names[result["purchase"]["owner"]] == "caller"
    escrow = result["purchase"]["escrow"]  # price x seats x epochs, in TestUSD base units
    assert escrow % (10_000 * 2) == 0 and escrow >= 10_000 * 2 * 2
    token = {b["account"]: b for b in result["token_balances"]}
    assert all(b["ok"] for b in result["token_balances"]) and token["op1"]["credited"] > 0
    assert token["developer"]["credited"] == token["treasury"]["credited"] > 0
    assert all(b["credited"] == 0 for b in result["balances"])  # nobody slashed: no ether moved
    inference = result["inference"]
    assert names[inference["payee"]] == "op1" and inference["price"] == 50_000
    assert inference["settlement_tx"].startswith("0x")

"""The SDK client against a real anvil: every method, errors, events, concurrency."""

from __future__ import annotations

import threading

import pytest
from harness.chain import ETH, advance, peer_key, spec
from web3 import Web3

from dtrain import artifacts, errors
from dtrain.client import BSM, load_key
from dtrain.models import JobSpec, JobState, JobStatus, Method, Params, struct_components


def register(bsm: BSM, i: int, stake: int = ETH, min_price: int = 0) -> str:
    bsm.register_operator(
        stake, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"], "cpu:2", min_price
    )
    return bsm.sender


def test_shipped_artifact_matches_sources() -> None:
    assert artifacts.load().source_hash == artifacts.source_hash(), (
        "sdk artifact is stale: run `python scripts/build_artifacts.py`"
    )


def test_deploy_sets_params(bsm: BSM, accounts) -> None:
    p = bsm.params()
    assert (p.operator_bps, p.staker_bps, p.protocol_bps, p.developer_bps) == (
        4000,
        2000,
        2000,
        2000,
    )
    assert p.treasury == accounts[10].address
    assert p.core == accounts[9].address
    assert bsm.next_job_id() == 1


def test_read_models_decode_by_field_name(bsm: BSM, accounts) -> None:
    # Structs are read by component name: the order of the mapping does not matter...
    p = Params(treasury=accounts[10].address, developer=accounts[11].address, min_stake=7)
    by_name = dict(zip(struct_components("Params"), p.as_tuple(), strict=True))
    assert Params.from_struct(dict(reversed(by_name.items()))) == p
    assert by_name["minStake"] == 7 and by_name["treasury"] == accounts[10].address
    # ...and written in the ABI's order whatever the dataclass order.
    s = JobSpec(price_per_operator_epoch=5, method=Method.DPO, tee_required=True)
    spec_by_name = dict(zip(struct_components("JobSpec"), s.as_tuple(), strict=True))
    assert spec_by_name["pricePerOperatorEpoch"] == 5 and spec_by_name["teeRequired"] is True
    assert spec_by_name["method"] == 2 and JobSpec.from_struct(spec_by_name) == s
    # A field the model does not know, or one it misses, raises instead of shifting values.
    with pytest.raises(TypeError, match="unknown \\['extra'\\]"):
        Params.from_struct({**by_name, "extra": 1})
    with pytest.raises(TypeError, match="missing \\['checkpoint'\\]"):
        JobState.from_struct(
            {
                "caller": accounts[0].address,
                "status": 1,
                "epoch": 0,
                "failedEpochs": 0,
                "attempt": 0,
                "epochStart": 0,
                "escrow": 0,
            }
        )
    assert bsm.params().min_stake == ETH


def test_attach_checks_chain_and_contract(chain, bsm: BSM, accounts) -> None:
    again = BSM.attach(chain.url, bsm.address, accounts[1].key, chain_id=31337)
    assert again.params() == bsm.params()
    with pytest.raises(errors.WrongChain, match="serves chain 31337, expected 1"):
        BSM.attach(chain.url, bsm.address, chain_id=1)
    with pytest.raises(errors.NoContract, match="no contract at"):
        BSM.attach(chain.url, accounts[3].address)
    with pytest.raises(errors.RpcUnavailable, match="unreachable"):
        BSM.attach("http://127.0.0.1:9", bsm.address)
    with pytest.raises(errors.ConfigError, match="not an address"):
        BSM.attach(chain.url, "0x1234")


def test_attach_rejects_another_contract(chain, bsm: BSM, accounts) -> None:
    # A contract that returns 32 bytes of 0x2a to every call.
    runtime = "602a60005260206000f3"
    init = "600a600c600039600a6000f3" + runtime
    signer = bsm.with_account(accounts[2].key)
    tx = {
        "from": signer.sender,
        "data": "0x" + init,
        "nonce": bsm.w3.eth.get_transaction_count(signer.sender),
        "gas": 100_000,
        "gasPrice": bsm.w3.eth.gas_price,
        "chainId": bsm.chain_id,
    }
    signed = signer.account.sign_transaction(tx)
    rc = bsm.w3.eth.wait_for_transaction_receipt(
        bsm.w3.eth.send_raw_transaction(signed.raw_transaction)
    )
    with pytest.raises(errors.NoContract, match="not a DistributedTrainingBSM"):
        BSM.attach(chain.url, rc["contractAddress"])


def test_load_key_rejects_bad_keys() -> None:
    with pytest.raises(errors.InvalidKey, match="64 hex digits"):
        load_key("0x1234")
    with pytest.raises(errors.InvalidKey, match="64 hex digits"):
        load_key("zz" * 32)
    with pytest.raises(errors.InvalidKey):
        load_key("00" * 32)


def test_operator_methods(as_account) -> None:
    op = as_account(1)
    register(op, 1, stake=3 * ETH, min_price=ETH // 1000)
    info = op.operator(op.sender)
    assert info.registered and info.self_stake == 3 * ETH
    assert info.peer_key == peer_key(1)
    assert info.peer_id_bytes == bytes.fromhex("002408011220") + peer_key(1)
    assert info.multiaddrs == ("/ip4/127.0.0.1/tcp/4001",)
    assert info.min_price_per_epoch == ETH // 1000
    op.update_operator(peer_key(2), ["/ip4/10.0.0.2/tcp/1", "/ip4/10.0.0.2/udp/1/quic"], "gpu", 7)
    info = op.operator(op.sender)
    assert info.multiaddrs[1].endswith("quic") and info.hardware == "gpu"
    op.set_attestation(Web3.keccak(text="quote"), 3, op.sender)
    assert op.operator(op.sender).tee_type == 3
    op.stake(ETH)
    op.unstake(2 * ETH)
    assert op.stake_of(op.sender, op.sender) == 2 * ETH
    amount, unlock_at = op.unbonding_of(op.sender, op.sender)
    assert amount == 2 * ETH and unlock_at > 0
    with pytest.raises(errors.StakeBelowMinimum, match=r"stake 0\.5 ETH below minimum 1 ETH"):
        op.unstake(int(1.5 * ETH))
    op.deregister()
    assert not op.operator(op.sender).registered
    assert op.unbonding_of(op.sender, op.sender)[0] == 4 * ETH


def test_delegation_and_unbonding(bsm: BSM, as_account) -> None:
    op = as_account(1)
    register(op, 1)
    staker = as_account(5)
    staker.delegate(op.sender, 4 * ETH)
    assert staker.stake_of(op.sender, staker.sender) == 4 * ETH
    staker.undelegate(op.sender, ETH)
    with pytest.raises(errors.StillUnbonding):
        staker.withdraw_unbonded(op.sender)
    advance(bsm.w3, 86400)
    staker.withdraw_unbonded(op.sender)
    assert staker.credit_of(staker.sender) == ETH
    before = bsm.w3.eth.get_balance(staker.sender)
    rc = staker.withdraw()
    assert bsm.w3.eth.get_balance(staker.sender) == before + ETH - rc.fee
    with pytest.raises(errors.NothingToWithdraw):
        staker.withdraw()
    with pytest.raises(errors.InsufficientStake, match="cannot take 4 ETH: only 3 ETH staked"):
        staker.undelegate(op.sender, 4 * ETH)


def test_full_lifecycle_exact_split(bsm: BSM, as_account, accounts) -> None:
    """3 operators, 2 stakers, 2 epochs: every account's balance change is the 40/20/20/20 split."""
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i, stake=ETH)
    s1, s2 = as_account(5), as_account(6)
    s1.delegate(ops[0].sender, 3 * ETH)  # pool of op0: 1 self + 3 delegated
    s2.delegate(ops[1].sender, ETH)  # pool of op1: 1 self + 1 delegated
    caller = as_account(4)
    price = ETH // 100
    job_id = caller.create_job(spec(price_per_operator_epoch=price, method=Method.SFT))
    for op in ops:
        op.join_job(job_id)
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.RUNNING and job.spec.method == Method.SFT
    members = list(job.members)
    for epoch in range(2):
        ckpt = Web3.keccak(text=f"epoch-{epoch}")
        for op in ops:
            op.submit_checkpoint(job_id, epoch, ckpt, [4] * len(members))
        bsm.finalize_epoch(job_id, epoch)
        assert bsm.epoch_checkpoint(job_id, epoch) == ckpt
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.COMPLETED
    assert job.state.checkpoint == Web3.keccak(text="epoch-1")

    paid = 2 * price  # two epochs for each operator
    pool = paid * 20 // 100
    expected = {
        ops[0].sender: paid * 40 // 100 + pool // 4,
        ops[1].sender: paid * 40 // 100 + pool // 2,
        ops[2].sender: paid * 40 // 100 + pool,
        s1.sender: pool * 3 // 4,
        s2.sender: pool // 2,
        accounts[10].address: 3 * paid * 20 // 100,  # treasury
        accounts[11].address: 3 * paid * 20 // 100,  # developer
        caller.sender: 0,  # all 3 slots paid in both epochs: nothing to refund
    }
    for who, amount in expected.items():
        b = bsm.with_account(next(a.key for a in accounts if a.address == who))
        for op in ops:
            if b.pending_rewards(op.sender, who):
                b.claim_rewards(op.sender)
        credit = b.credit_of(who)
        assert credit == amount, who
        if credit:
            before = bsm.w3.eth.get_balance(who)
            rc = b.withdraw()
            assert bsm.w3.eth.get_balance(who) - before == amount - rc.fee
    assert sum(expected.values()) == 3 * paid
    acc = bsm.accounting()
    assert acc.total == bsm.contract_balance() == 3 * ETH + 4 * ETH


def test_job_errors_decode(bsm: BSM, as_account) -> None:
    caller = as_account(4)
    s = spec()
    with pytest.raises(errors.WrongEscrow, match=r"exactly 0.06 ETH, got 1 wei"):
        caller._transact(caller.contract.functions.createJob(s.as_tuple()), 1)
    with pytest.raises(errors.InvalidOperatorRange, match="min 4 / max 3"):
        caller.create_job(spec(min_operators=4))
    with pytest.raises(errors.UnknownJob, match="job 42 does not exist"):
        bsm.job(42)
    job_id = caller.create_job(spec(min_operators=2, max_operators=2))
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i, min_price=ETH if i == 2 else 0)
    with pytest.raises(errors.PriceBelowAsk, match=r"0\.01 ETH below the operator's ask 1 ETH"):
        ops[2].join_job(job_id)
    ops[0].join_job(job_id)
    with pytest.raises(errors.AlreadyMember):
        ops[0].join_job(job_id)
    ops[1].join_job(job_id)
    with pytest.raises(errors.NotMember):
        ops[2].submit_checkpoint(job_id, 0, b"\x01" * 32, [1, 1])
    with pytest.raises(errors.ParticipationLength, match="3 entries, the epoch has 2"):
        ops[0].submit_checkpoint(job_id, 0, b"\x01" * 32, [1, 1, 1])
    with pytest.raises(errors.WrongEpoch, match="in epoch 0, not 5"):
        ops[0].submit_checkpoint(job_id, 5, b"\x01" * 32, [1, 1])
    ops[0].submit_checkpoint(job_id, 0, b"\x01" * 32, [4, 4])
    with pytest.raises(errors.AlreadySubmitted):
        ops[0].submit_checkpoint(job_id, 0, b"\x02" * 32, [4, 4])
    with pytest.raises(errors.EpochNotFinalizable, match="1 of 2 members submitted"):
        bsm.finalize_epoch(job_id, 0)
    with pytest.raises(errors.JobNotOpen, match="is Running, not open"):
        caller.cancel_job(job_id)
    with pytest.raises(errors.NotCore):
        caller._transact(caller.contract.functions.onUnregister(caller.sender))
    advance(bsm.w3, bsm.params().start_grace + 3601)  # the deadline is after the start grace
    with pytest.raises(errors.DeadlinePassed, match=r"deadline \d+ has passed"):
        ops[1].submit_checkpoint(job_id, 0, b"\x01" * 32, [4, 4])
    rc = bsm.finalize_epoch(job_id, 0)
    slashed = rc.all("Slashed")
    assert len(slashed) == 1 and slashed[0].args["reason"] == 1  # dropout
    assert slashed[0].args["operator"] == ops[1].sender
    with pytest.raises(errors.JobNotRunning, match="is Open, not running"):
        ops[0].submit_checkpoint(job_id, 1, b"\x03" * 32, [4])


def test_insufficient_funds(bsm: BSM) -> None:
    poor = bsm.with_account("0x" + "11" * 32)
    with pytest.raises(errors.InsufficientFunds, match="cannot pay value plus gas"):
        poor.register_operator(ETH, peer_key(9), [], "")


def test_events_and_watch(bsm: BSM, as_account) -> None:
    start = bsm.w3.eth.block_number + 1
    ops = [as_account(i) for i in (1, 2, 3)]
    seen: list[str] = []
    done = threading.Event()

    def follow() -> None:
        for e in bsm.watch(start, job_id=1, poll_interval=0.05, stop=done.is_set):
            seen.append(e.name)
            if e.name == "JobCompleted":
                done.set()

    t = threading.Thread(target=follow)
    t.start()
    try:
        for i, op in enumerate(ops):
            register(op, i)
        job_id = as_account(4).create_job(spec(total_epochs=1))
        for op in ops:
            op.join_job(job_id)
        for op in ops:
            op.submit_checkpoint(job_id, 0, b"\x05" * 32, [4, 4, 4])
        bsm.finalize_epoch(job_id, 0)
        assert done.wait(timeout=30)
    finally:
        done.set()
        t.join(timeout=10)
    assert seen[0] == "JobCreated"
    assert seen.count("JoinRequested") == 3 and seen.count("CheckpointSubmitted") == 3
    assert seen.index("EpochStarted") < seen.index("EpochFinalized") < seen.index("JobCompleted")
    names = [e.name for e in bsm.events(start, names=["OperatorPaid"], job_id=job_id)]
    assert names == ["OperatorPaid"] * 3


def test_concurrent_senders(bsm: BSM, as_account) -> None:
    op = as_account(1)
    register(op, 1)
    stakers = [as_account(i) for i in (5, 6, 7, 8)]
    failures: list[BaseException] = []

    def send(s: BSM) -> None:
        try:
            for _ in range(5):
                s.delegate(op.sender, 10**15)
        except BaseException as exc:  # collected and asserted below
            failures.append(exc)

    # Two threads per account: the nonce manager must serialize each sender.
    threads = [threading.Thread(target=send, args=(s,)) for s in stakers for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not failures, failures
    for s in stakers:
        assert s.stake_of(op.sender, s.sender) == 10 * 10**15
    assert bsm.pool(op.sender).total_assets == ETH + 40 * 10**15


def test_join_leave_and_submission_reads(bsm: BSM, as_account) -> None:
    ops = [as_account(i) for i in (1, 2)]
    for i, op in enumerate(ops):
        register(op, i)
    job_id = as_account(4).create_job(spec(min_operators=2, max_operators=2, total_epochs=2))
    for op in ops:
        op.join_job(job_id)
    assert bsm.members(job_id) == [op.sender for op in ops]
    assert not bsm.is_leaving(job_id, ops[1].sender)
    ops[1].leave_job(job_id)
    assert bsm.is_leaving(job_id, ops[1].sender)
    assert bsm.submission_of(job_id, ops[0].sender) == (b"\0" * 32, b"\0" * 32)
    ckpt = Web3.keccak(text="e0")
    for op in ops:
        op.submit_checkpoint(job_id, 0, ckpt, [4, 4])
    got, key = bsm.submission_of(job_id, ops[0].sender)
    assert got == ckpt and key != b"\0" * 32
    assert bsm.job(job_id).submitted == 2
    bsm.finalize_epoch(job_id, 0)
    assert bsm.members(job_id) == [ops[0].sender]  # the leaver is out at the boundary
    assert bsm.operator(ops[1].sender).active_jobs == 0


def test_nonces_are_per_endpoint() -> None:
    """Two local chains share chain id 31337: a nonce cached for one must not leak."""
    from dtrain.chain import LocalChain
    from dtrain.models import Params

    for _ in range(2):
        with LocalChain(accounts=3) as c:
            a = c.accounts
            params = Params(treasury=a[1].address, developer=a[2].address)
            b = BSM.deploy(c.url, a[0].key, params)
            assert b.params().treasury == a[1].address


def test_epoch_bounds_and_slash_to_treasury(bsm: BSM, as_account, accounts) -> None:
    """Epochs are bounded by the deploy parameters; a dropout's slash goes to the treasury, a
    capped bounty to an outside finalizer, nothing to the job's caller."""
    p = bsm.params()
    assert bsm.max_epoch_duration() == p.unbonding_period // 4 - p.start_grace
    assert bsm.reward_period() == p.unbonding_period // 2
    assert bsm.operator_nonce(accounts[1].address) == 0
    caller = as_account(4)
    with pytest.raises(errors.InvalidEpochDuration, match=r"epoch duration 1s outside 60s\.\."):
        caller.create_job(spec(epoch_duration=1))
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i)
    job_id = caller.create_job(spec(total_epochs=1))
    for op in ops:
        op.join_job(job_id)
    members = bsm.members(job_id)
    ckpt = Web3.keccak(text="c")
    for op in ops[:2]:
        op.submit_checkpoint(job_id, 0, ckpt, [4] * len(members))
    advance(bsm.w3, p.start_grace + 3601)
    treasury = accounts[10].address
    before = bsm.credit_of(treasury)
    finalizer = as_account(7)
    rc = finalizer.finalize_epoch(job_id, 0)
    slashed = sum(e.args["amount"] for e in rc.events if e.name == "Slashed")
    assert slashed > 0
    bounty = min(slashed * p.reporter_bounty_bps // 10000, p.max_reporter_bounty)
    assert bsm.credit_of(finalizer.sender) == bounty
    paid = 2 * spec().price_per_operator_epoch
    assert bsm.credit_of(treasury) - before == slashed - bounty + paid * 20 // 100
    assert bsm.credit_of(caller.sender) == spec().price_per_operator_epoch  # only the unearned slot

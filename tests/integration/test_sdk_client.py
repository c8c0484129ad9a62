"""The SDK client against a real anvil: every method, errors, events, concurrency."""

from __future__ import annotations

import re
import threading

import pytest
from harness.chain import ETH, advance, peer_key, spec
from web3 import Web3

import dtrain
from dtrain import artifacts, errors
from dtrain.chain import LocalChain
from dtrain.client import BSM, load_key
from dtrain.models import (
    JobSpec,
    JobState,
    JobStatus,
    Method,
    Params,
    SlashReason,
    Submission,
    struct_components,
)

ZERO = b"\0" * 32


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
    assert (p.unworkable_comp_bps, p.reveal_window, p.open_timeout) == (1000, 600, 86400)
    assert p.min_seat_bond == ETH // 10
    assert bsm.next_job_id() == 1


def test_read_models_decode_by_field_name(bsm: BSM, accounts) -> None:
    # Structs are read by component name: the order of the mapping does not matter...
    p = Params(treasury=accounts[10].address, developer=accounts[11].address, min_stake=7)
    by_name = dict(zip(struct_components("Params"), p.as_tuple(), strict=True))
    assert Params.from_struct(dict(reversed(by_name.items()))) == p
    assert by_name["minStake"] == 7 and by_name["treasury"] == accounts[10].address
    # ...and written in the ABI's order whatever the dataclass order.
    s = JobSpec(price_per_operator_epoch=5, method=Method.DPO, tee_required=True, seat_bond=9)
    spec_by_name = dict(zip(struct_components("JobSpec"), s.as_tuple(), strict=True))
    assert spec_by_name["pricePerOperatorEpoch"] == 5 and spec_by_name["teeRequired"] is True
    assert spec_by_name["seatBond"] == 9 and by_name["minSeatBond"] == p.min_seat_bond
    assert by_name["revealWindow"] == 600 and by_name["openTimeout"] == 86400
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
    none = op.attestation_of(op.sender)  # nothing recorded: no self-set attestation exists
    assert not none.valid and none.expires_at == 0 and not op.is_attestation_verifier(op.sender)
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


def test_full_lifecycle_exact_split(bsm: BSM, as_account, accounts, votes) -> None:
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
        votes.cast(ops, job_id, epoch, ckpt, [4] * len(members))
        bsm.finalize_epoch(job_id, epoch)
        assert bsm.epoch_checkpoint(job_id, epoch) == ckpt
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.COMPLETED
    assert job.state.checkpoint == Web3.keccak(text="epoch-1")
    assert all(bsm.bonded_of(op.sender) == 0 for op in ops)  # the seats are released

    paid = 2 * price  # two epochs for each operator
    pool = paid * 20 // 100
    # the deployer finalized both epochs from outside the job: 10% of the protocol's 20%
    bounty = 3 * paid * 20 // 100 // 10
    expected = {
        accounts[0].address: bounty,
        ops[0].sender: paid * 40 // 100 + pool // 4,
        ops[1].sender: paid * 40 // 100 + pool // 2,
        ops[2].sender: paid * 40 // 100 + pool,
        s1.sender: pool * 3 // 4,
        s2.sender: pool // 2,
        accounts[10].address: 3 * paid * 20 // 100 - bounty,  # treasury
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


def test_job_errors_decode(bsm: BSM, as_account, votes) -> None:
    caller = as_account(4)
    s = spec(seat_bond=bsm.params().min_seat_bond)
    with pytest.raises(errors.WrongEscrow, match=r"exactly 0.06 ETH, got 1 wei"):
        caller._transact(caller.contract.functions.createJob(s.as_tuple()), 1)
    with pytest.raises(errors.InvalidOperatorRange, match="min 4 / max 3: need 2 <= min"):
        caller.create_job(spec(min_operators=4))
    with pytest.raises(errors.InvalidOperatorRange, match="min 1 / max 3: need 2 <= min"):
        caller.create_job(spec(min_operators=1))
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
    ckpt = b"\x01" * 32
    with pytest.raises(errors.NotMember):
        votes.commit(ops[2], job_id, 0, ckpt, [1, 1])
    with pytest.raises(errors.WrongEpoch, match="in epoch 0, not 5"):
        votes.commit(ops[0], job_id, 5, ckpt, [1, 1])
    with pytest.raises(errors.ZeroCheckpoint):
        ops[0].commit_checkpoint(job_id, 0, ZERO)
    with pytest.raises(errors.NotCommitted):
        ops[0].reveal_checkpoint(job_id, 0, ckpt, [4, 4], b"\x07" * 32, b"\x09" * 32)
    votes.commit(ops[0], job_id, 0, ckpt, [4, 4, 4])  # one entry too many: seen at the reveal
    with pytest.raises(errors.AlreadyCommitted):
        votes.commit(ops[0], job_id, 0, b"\x02" * 32, [4, 4])
    with pytest.raises(errors.RevealNotOpen, match=r"reveals open after 20\d\d-.* \(in .* or once"):
        votes.reveal(ops[0], job_id, 0)  # ops[1] has not committed and the deadline is ahead
    assert bsm.vote_counts(job_id) == (1, 0)
    with pytest.raises(errors.EpochNotFinalizable, match="0 of 2 members revealed"):
        bsm.finalize_epoch(job_id, 0)
    with pytest.raises(errors.NotJobCaller, match="is not the caller"):
        ops[2].cancel_job(job_id)  # a running job: only its caller may cancel it
    with pytest.raises(errors.NotCore):
        caller._transact(caller.contract.functions.onUnregister(caller.sender))
    p = bsm.params()
    advance(bsm.w3, p.start_grace + 3601)  # the deadline is after the start grace
    with pytest.raises(errors.DeadlinePassed, match=r"deadline 20\d\d-.*\) has passed \(now "):
        votes.commit(ops[1], job_id, 0, ckpt, [4, 4])
    with pytest.raises(errors.ParticipationLength, match="3 entries, the epoch has 2 members"):
        votes.reveal(ops[0], job_id, 0)
    advance(bsm.w3, p.reveal_window)
    with pytest.raises(errors.RevealClosed, match=r"reveal window closed at 20\d\d-.*\) \(now "):
        votes.reveal(ops[0], job_id, 0)
    rc = bsm.finalize_epoch(job_id, 0)
    slashed = rc.all("Slashed")
    # ops[0] committed a vote it could not reveal: withheld; ops[1] never committed: dropout
    assert {e.args["operator"]: e.args["reason"] for e in slashed} == {
        ops[0].sender: SlashReason.WITHHELD_REVEAL,
        ops[1].sender: SlashReason.DROPOUT,
    }
    with pytest.raises(errors.JobNotRunning, match="is Open, not running"):
        votes.commit(ops[0], job_id, 1, b"\x03" * 32, [4])


def test_insufficient_funds(bsm: BSM) -> None:
    poor = bsm.with_account("0x" + "11" * 32)
    needs = (
        f"register needs 1 ETH of stake (at least 1 ETH) plus gas; account {poor.sender} has "
        "0 ETH: send it ETH or use a funded key"
    )
    with pytest.raises(errors.InsufficientFunds, match=re.escape(needs)):
        poor.register_operator(ETH, peer_key(9), [], "")
    with pytest.raises(errors.InsufficientFunds, match=r"has 0 ETH, cannot pay 2 ETH plus gas"):
        poor.delegate(bsm.sender, 2 * ETH)


def test_events_and_watch(bsm: BSM, as_account, votes) -> None:
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
        votes.cast(ops, job_id, 0, b"\x05" * 32, [4, 4, 4])
        bsm.finalize_epoch(job_id, 0)
        assert done.wait(timeout=30)
    finally:
        done.set()
        t.join(timeout=10)
    assert seen[0] == "JobCreated"
    assert seen.count("JoinRequested") == 3
    assert seen.count("CheckpointCommitted") == 3 and seen.count("CheckpointRevealed") == 3
    # Every commitment is on chain before the first reveal.
    assert max(i for i, n in enumerate(seen) if n == "CheckpointCommitted") < seen.index(
        "CheckpointRevealed"
    )
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


def test_join_leave_and_submission_reads(bsm: BSM, as_account, votes) -> None:
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
    assert bsm.submission_of(job_id, ops[0].sender) == Submission(ZERO, ZERO, ZERO)
    job = bsm.job(job_id)
    p = bsm.params()
    assert job.deadline == job.state.epoch_start + job.spec.epoch_duration
    assert job.reveal_deadline == bsm.reveal_deadline(job_id) == job.deadline + p.reveal_window
    assert (job.committed, job.revealed) == (0, 0)
    ckpt = Web3.keccak(text="e0")
    for op in ops:
        votes.commit(op, job_id, 0, ckpt, [4, 4])
    mine = bsm.submission_of(job_id, ops[0].sender)
    _, _, transcript, salt = votes.vote_of(ops[0], job_id, 0)
    assert mine.commitment == dtrain.commitment_hash(
        job_id, 0, ops[0].sender, ckpt, [4, 4], transcript, salt
    )
    assert mine.is_committed and not mine.is_revealed and mine.checkpoint == ZERO
    assert bsm.job(job_id).committed == 2 and bsm.job(job_id).revealed == 0
    votes.reveal(ops[0], job_id, 0)
    mine = bsm.submission_of(job_id, ops[0].sender)
    assert mine.checkpoint == ckpt and mine.is_revealed and mine.vote_key != ZERO
    assert bsm.vote_counts(job_id) == (2, 1)
    before = bsm.w3.eth.block_number
    votes.reveal(ops[1], job_id, 0)
    assert bsm.vote_counts(job_id, before) == (2, 1) and bsm.vote_counts(job_id) == (2, 2)
    assert bsm.submission_of(job_id, ops[1].sender).vote_key == mine.vote_key  # the same vote
    bsm.finalize_epoch(job_id, 0)
    assert bsm.members(job_id) == [ops[0].sender]  # the leaver is out at the boundary
    assert bsm.operator(ops[1].sender).active_jobs == 0
    assert bsm.bonded_of(ops[1].sender) == 0 and bsm.bonded_of(ops[0].sender) == p.min_seat_bond


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


def test_epoch_bounds_and_slash_to_treasury(bsm: BSM, as_account, accounts, votes) -> None:
    """Epochs are bounded by the deploy parameters; a dropout's slash goes to the treasury, a
    capped bounty to an outside finalizer, nothing to the job's caller."""
    p = bsm.params()
    assert bsm.max_epoch_duration() == p.unbonding_period // 4 - p.start_grace - p.reveal_window
    assert bsm.reward_period() == p.unbonding_period // 2
    assert bsm.operator_nonce(accounts[1].address) == 0
    rc = as_account(1).cancel_signed_calls()
    assert [(e.name, e.args["nonce"]) for e in rc.events] == [("SignedCallsCancelled", 0)]
    assert bsm.operator_nonce(accounts[1].address) == 1
    caller = as_account(4)
    with pytest.raises(errors.InvalidEpochDuration, match=r"epoch duration 1s outside 60s\.\."):
        caller.create_job(spec(epoch_duration=1))
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i)
    job_id = caller.create_job(spec(total_epochs=1))
    for op in ops:
        op.join_job(job_id)
    assert len(bsm.members(job_id)) == 3
    ckpt = Web3.keccak(text="c")
    for op in ops[:2]:
        votes.commit(op, job_id, 0, ckpt, [4, 4, 0])  # the third is silent, in no round
    advance(bsm.w3, p.start_grace + 3601)  # past the commit deadline: reveals open
    for op in ops[:2]:
        votes.reveal(op, job_id, 0)
    with pytest.raises(errors.EpochNotFinalizable, match="2 of 3 members revealed"):
        bsm.finalize_epoch(job_id, 0)  # not all revealed: wait for the reveal deadline
    advance(bsm.w3, p.reveal_window)
    treasury = accounts[10].address
    before = bsm.credit_of(treasury)
    finalizer = as_account(7)
    rc = finalizer.finalize_epoch(job_id, 0)
    slashed = sum(e.args["amount"] for e in rc.events if e.name == "Slashed")
    assert slashed > 0
    paid = 2 * spec().price_per_operator_epoch
    # the finalizer's reward: a share of the protocol's fee for the paid work, not of the slash
    bounty = min(paid * 20 // 100 * p.reporter_bounty_bps // 10000, p.max_reporter_bounty)
    assert bsm.credit_of(finalizer.sender) == bounty
    rewarded = [e.args for e in rc.events if e.name == "FinalizerPaid"]
    assert [(r["finalizer"], r["amount"]) for r in rewarded] == [(finalizer.sender, bounty)]
    assert bsm.credit_of(treasury) - before == slashed + paid * 20 // 100 - bounty
    assert bsm.credit_of(caller.sender) == spec().price_per_operator_epoch  # only the unearned slot


def test_copied_commitment_cannot_be_revealed(bsm: BSM, as_account, votes) -> None:
    """Attack: a member that did no work copies another member's commitment from the mempool
    or the chain, then replays that member's reveal (checkpoint, participation and salt are in
    its calldata). The commitment binds the operator, so the copier's reveal is refused with a
    typed error, and at the reveal deadline the copier is slashed for withholding its reveal
    (at the fabrication rate)."""
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i)
    job_id = as_account(4).create_job(spec(total_epochs=1))
    for op in ops:
        op.join_job(job_id)
    honest, copier, other = ops
    ckpt = Web3.keccak(text="honest work")
    votes.commit(honest, job_id, 0, ckpt, [4, 4, 4])
    stolen = bsm.submission_of(job_id, honest.sender).commitment
    with pytest.raises(errors.RevealNotOpen):  # no reveal while anyone can still commit
        votes.reveal(honest, job_id, 0)
    copier.commit_checkpoint(job_id, 0, stolen)
    votes.commit(other, job_id, 0, ckpt, [4, 4, 4])
    votes.reveal(honest, job_id, 0)  # every member committed: reveals are open
    replay = votes.vote_of(honest, job_id, 0)
    with pytest.raises(errors.CommitmentMismatch) as caught:
        copier.reveal_checkpoint(job_id, 0, *replay)
    assert caught.value.args_by_name == {"jobId": job_id, "operator": copier.sender}
    assert str(caught.value) == (
        f"the revealed vote of {copier.sender} does not match its commitment in job {job_id}"
    )
    assert isinstance(caught.value, errors.ContractError)
    votes.reveal(other, job_id, 0)
    assert bsm.vote_counts(job_id) == (3, 2)
    p = bsm.params()
    advance(bsm.w3, p.start_grace + 3600 + p.reveal_window + 1)
    rc = bsm.finalize_epoch(job_id, 0)
    assert [(e.args["operator"], e.args["reason"]) for e in rc.all("Slashed")] == [
        (copier.sender, SlashReason.WITHHELD_REVEAL)
    ]
    assert {e.args["operator"] for e in rc.all("OperatorPaid")} == {honest.sender, other.sender}
    assert rc.first("EpochFinalized").args["checkpoint"] == ckpt


@pytest.mark.parametrize(
    ("job_id", "epoch", "participation"),
    [(1, 0, []), (7, 3, [0, 5, 2**32 - 1]), (2**256 - 1, 2**64, [1] * 32)],
)
def test_commitment_hash_matches_the_contract(bsm: BSM, accounts, job_id, epoch, participation):
    operator = accounts[3].address
    ckpt, salt = Web3.keccak(text=f"ckpt-{job_id}"), Web3.keccak(text=f"salt-{epoch}")
    view = bsm.contract.functions.commitmentHash
    transcript = Web3.keccak(text=f"transcript-{job_id}")
    args = (job_id, epoch, operator, ckpt, participation, transcript, salt)
    assert dtrain.commitment_hash(*args) == bytes(view(*args).call())
    # Each input is bound: the operator, the transcript and the participation change the hash.
    assert dtrain.commitment_hash(
        job_id, epoch, accounts[4].address, ckpt, participation, transcript, salt
    ) != (dtrain.commitment_hash(*args))
    assert dtrain.commitment_hash(
        job_id, epoch, operator, ckpt, participation, bytes(32), salt
    ) != (dtrain.commitment_hash(*args))
    longer = (job_id, epoch, operator, ckpt, [*participation, 0], transcript, salt)
    assert bytes(view(*longer).call()) == dtrain.commitment_hash(*longer)
    assert bytes(bsm.contract.functions.UNWORKABLE().call()) == dtrain.UNWORKABLE


def test_unworkable_quorum_aborts_the_job(bsm: BSM, as_account, accounts, votes) -> None:
    """Two of three members vote UNWORKABLE (2/3): the job is aborted, nobody is slashed, the
    two are compensated unworkable_comp_bps of the price, the caller gets the rest back."""
    ops = [as_account(i) for i in (1, 2, 3)]
    for i, op in enumerate(ops):
        register(op, i)
    caller = as_account(4)
    job_id = caller.create_job(spec(total_epochs=2))
    for op in ops:
        op.join_job(job_id)
    for op in ops[:2]:
        votes.commit(op, job_id, 0, dtrain.UNWORKABLE, [0, 0, 0])
    votes.commit(ops[2], job_id, 0, Web3.keccak(text="c"), [4, 4, 4])
    for op in ops:  # all committed: reveals open before the deadline
        votes.reveal(op, job_id, 0)
    assert bsm.submission_of(job_id, ops[0].sender).checkpoint == dtrain.UNWORKABLE
    rc = bsm.finalize_epoch(job_id, 0)
    p = bsm.params()
    price = spec().price_per_operator_epoch
    compensation = price * p.unworkable_comp_bps // 10_000
    aborted = rc.first("JobAborted").args
    assert (aborted["epoch"], aborted["compensated"], aborted["compensation"]) == (
        0,
        2,
        compensation,
    )
    assert aborted["refund"] == spec().escrow - 2 * compensation
    assert not rc.all("Slashed") and not rc.all("EpochFinalized")
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.FAILED and job.state.status.is_ended
    assert [bsm.credit_of(op.sender) for op in ops] == [compensation, compensation, 0]
    assert bsm.credit_of(caller.sender) == aborted["refund"]
    assert all(bsm.bonded_of(op.sender) == 0 for op in ops)
    assert bsm.accounting().total == bsm.contract_balance()


def test_seat_bonds(bsm: BSM, as_account) -> None:
    """Each seat bonds the job's seat bond of self-stake: it backs no other seat and cannot be
    unstaked until the member leaves. A zero seat bond asks for the deployment's minimum."""
    p = bsm.params()
    caller = as_account(4)
    with pytest.raises(errors.SeatBondTooLow, match=r"seat bond 0\.01 ETH below the minimum"):
        caller.create_job(spec(seat_bond=ETH // 100))
    default = caller.create_job(spec())
    assert bsm.job(default).spec.seat_bond == p.min_seat_bond
    bond = 6 * ETH // 10
    a, b = caller.create_job(spec(seat_bond=bond)), caller.create_job(spec(seat_bond=bond))
    op = as_account(1)
    register(op, 1, stake=ETH)
    op.join_job(a)
    assert bsm.bonded_of(op.sender) == bond == bsm.operator(op.sender).bonded
    with pytest.raises(
        errors.InsufficientFreeStake,
        match=r"self-stake 1 ETH cannot bond this seat: 1\.2 ETH needed",
    ):
        op.join_job(b)
    op.stake(ETH)
    op.join_job(b)  # 2 ETH of self-stake bond both seats
    assert bsm.bonded_of(op.sender) == 2 * bond
    with pytest.raises(
        errors.StakeBonded, match=r"1 ETH of self-stake would be left, below the 1\.2 ETH"
    ):
        op.unstake(ETH)
    op.leave_job(b)  # the job is Open: the seat is released at once
    assert bsm.bonded_of(op.sender) == bond
    op.unstake(ETH)
    assert bsm.stake_of(op.sender, op.sender) == ETH


def test_open_timeout_lets_anyone_fail_a_deserted_job(bsm: BSM, as_account, accounts) -> None:
    """A job that started and lost its members waits open_timeout, then anyone may fail it
    and its escrow goes back to its caller; before, only the caller may end it."""
    ops = [as_account(i) for i in (1, 2)]
    for i, op in enumerate(ops):
        register(op, i)
    caller, stranger = as_account(4), as_account(7)
    never_started = caller.create_job(spec(min_operators=2, max_operators=2))
    with pytest.raises(errors.NotJobCaller):
        stranger.cancel_job(never_started)
    job_id = caller.create_job(spec(min_operators=2, max_operators=2))
    for op in ops:
        op.join_job(job_id)
    p = bsm.params()
    advance(bsm.w3, p.start_grace + 3600 + p.reveal_window + 1)
    rc = bsm.finalize_epoch(job_id, 0)  # nobody voted: both slashed and out
    assert len(rc.all("Slashed")) == 2
    job = bsm.job(job_id)
    assert job.state.status == JobStatus.OPEN and job.members == ()
    assert (job.deadline, job.reveal_deadline) == (0, 0)
    with pytest.raises(errors.OpenTimeoutPending, match=f"job {job_id} may be failed by anyone"):
        stranger.cancel_job(job_id)
    advance(bsm.w3, p.open_timeout + 1)
    rc = stranger.cancel_job(job_id)
    refund = rc.first("JobFailed").args["refund"]
    assert refund == spec(min_operators=2, max_operators=2).escrow
    assert bsm.job(job_id).state.status == JobStatus.FAILED
    assert bsm.credit_of(caller.sender) == refund and bsm.credit_of(stranger.sender) == 0


def test_local_chain_stops_anvil_when_ctrl_c_lands_while_it_stops(monkeypatch) -> None:
    """A second Ctrl-C while the chain waits for anvil to exit still kills anvil."""
    c = LocalChain(accounts=1).start()
    proc = c._proc
    assert proc is not None and c.running
    real_wait = proc.wait

    def interrupted_wait(timeout: float | None = None) -> int:
        if timeout is not None:  # the polite wait after SIGTERM: Ctrl-C lands here
            raise KeyboardInterrupt
        return real_wait()

    monkeypatch.setattr(proc, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        c.stop()
    assert proc.poll() is not None  # anvil is gone, not left running

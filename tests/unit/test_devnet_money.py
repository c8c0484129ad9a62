"""The money check, from hand-made event records and hand-computed credits (the contract's
rules: slashed stake to the treasury, a capped share of the fee only to a finalizer outside
the job)."""

from __future__ import annotations

from dtrain.models import Event
from dtrain_node.devnet import money
from dtrain_node.devnet.money import ETH, Roster, Slash

P = ETH // 100
A, B, C = "0xA", "0xB", "0xC"  # operators
S, T, D, K = "0x5", "0x7", "0xD", "0xCA"  # staker, treasury, developer, caller
ROSTER = Roster([A, B, C], [S], T, D, K, delegations={S: (A, 2 * ETH)})


def ev(name: str, block: int = 0, tx: str = "0x", **args: object) -> Event:
    return Event(name, dict(args), block, tx, 0)


EVENTS = [
    ev("EpochFinalized", epoch=0, checkpoint=b"\x11" * 32),
    *(ev("OperatorPaid", epoch=0, operator=o) for o in (A, B, C)),
    ev("Slashed", epoch=1, operator=C, reason=0, amount=ETH // 10, reporter=A),
    ev("EpochFinalized", epoch=1, checkpoint=b"\x22" * 32),
    *(ev("OperatorPaid", epoch=1, operator=o) for o in (A, B)),
    ev("EpochFailed", epoch=2),
]
# Pool of A: 1 ETH self-stake + 2 ETH from S; 20% of P per paid epoch, per share rounded down.
RPS_A = 2 * (2 * 10**15 * ETH // (3 * ETH))
EXPECTED = {
    A: 2 * 4 * 10**15 + RPS_A,  # 40% twice, its pool share; no bounty: it is a member
    B: 2 * 4 * 10**15 + 2 * 2 * 10**15,  # alone in its pool
    C: 4 * 10**15 + 2 * 10**15,
    S: 2 * RPS_A,
    T: 5 * 2 * 10**15 + ETH // 10,  # 20% of each paid epoch and all of C's slash
    D: 5 * 2 * 10**15,
    K: (12 - 5) * P,  # the unearned escrow back
}


def test_epoch_records() -> None:
    eps = money.epoch_records(EVENTS, 3, {0: [A, B, C], 1: [A, B, C]})
    assert [e.paid for e in eps] == [[A, B, C], [A, B], []]
    assert eps[0].quorum_hash == "0x" + "11" * 32 and eps[2].quorum_hash is None
    assert eps[1].slashed == [Slash(C, "fabricated checkpoint", ETH // 10, A, "0x")]
    assert eps[2].members == [] and eps[0].members == [A, B, C]


def test_expected_credits_match_the_split() -> None:
    eps = money.epoch_records(EVENTS, 3, {})
    assert RPS_A == 1333333333333332
    assert money.expected_credits(eps, ROSTER, P, refund_escrow=12 * P) == EXPECTED
    running = money.expected_credits(eps, ROSTER, P)  # not ended: nothing refunded yet
    assert running[K] == 0 and running[T] == EXPECTED[T]


def test_a_token_job_pays_the_escrow_part_in_the_token_and_the_slashes_in_ether() -> None:
    eps = money.epoch_records(EVENTS, 3, {})
    pay = money.expected_credits(eps, ROSTER, P, refund_escrow=12 * P, part="pay")
    slash = money.expected_credits(eps, ROSTER, P, refund_escrow=12 * P, part="slash")
    assert slash == {**dict.fromkeys(EXPECTED, 0), T: ETH // 10}  # only C's slash, in ether
    assert pay[T] == EXPECTED[T] - ETH // 10 and pay[K] == EXPECTED[K]
    assert {a: pay[a] + slash[a] for a in EXPECTED} == EXPECTED


def finalize_call(
    finalizer: str, paid: tuple[str, ...], slash: int = 0, tx: str = "0xf1"
) -> list[Event]:
    """One finalize call of epoch 0 that paid `paid`, slashed C `slash` and rewarded `finalizer`
    (the contract emits `FinalizerPaid` only to an outsider; the check judges it anyway)."""
    out = [ev("OperatorPaid", tx=tx, epoch=0, operator=o) for o in paid]
    if slash:
        out.append(
            ev("Slashed", tx=tx, epoch=0, operator=C, reason=0, amount=slash, reporter=finalizer)
        )
    return [*out, ev("FinalizerPaid", tx=tx, epoch=0, finalizer=finalizer, amount=0)]


def credits(
    events: list[Event], members: list[str] | None = None, rules: money.Rules | None = None
) -> dict[str, int]:
    eps = money.epoch_records(events, 1, {0: members if members is not None else [A, B, C]})
    return money.expected_credits(eps, ROSTER, P, rules=rules)


FEE = 2 * 10**15  # the treasury's 20% of one paid operator-epoch


def test_outside_finalizer_is_rewarded_from_the_fee_never_from_a_slash() -> None:
    X = "0xE"  # neither the caller nor in the job
    small = credits(finalize_call(X, (A, B), slash=100))
    big = credits(finalize_call(X, (A, B), slash=ETH))
    assert small[X] == big[X] == 2 * FEE // 10  # 10% of the treasury's cut of 2 paid seats
    assert small[T] == 2 * FEE - 2 * FEE // 10 + 100 and big[T] == small[T] - 100 + ETH
    cap = money.Rules(max_reporter_bounty=5 * 10**14)
    batches = [*finalize_call(X, (A, B)), *finalize_call(X, (C,), tx="0xf2")]  # one epoch, 2 calls
    got = credits(batches, rules=cap)
    assert got[X] == 4 * 10**14 + 10**14  # the second call only up to the epoch's cap
    assert got[T] == 3 * FEE - 5 * 10**14


def test_no_bounty_to_the_caller_a_member_the_treasury_or_a_pending_joiner() -> None:
    for finalizer in (K, A, B, T):  # B is slashed in that very finalize
        got = credits(finalize_call(finalizer, (A,), slash=50))
        assert got[T] == FEE + 50 and got[K] == 0, finalizer  # the treasury's cut, whole
    assert credits(finalize_call(C, (A,), slash=50), members=[])[T] == FEE + 50  # slashed: in it
    joining = ev("JoinRequested", operator="0xE", effectiveEpoch=1)
    got = credits([joining, *finalize_call("0xE", (A,), slash=50)])
    assert got.get("0xE", 0) == 0 and got[T] == FEE + 50


def test_pool_share_of_an_epoch_finalized_too_late_goes_to_the_treasury() -> None:
    events = [
        ev("EpochStarted", block=5, epoch=0),
        ev("OperatorPaid", block=9, epoch=0, operator=B),
        ev("EpochFinalized", block=9, epoch=0, checkpoint=b"\x11" * 32),
    ]
    for finalized_at, late in ((1000 + 1800, False), (1000 + 1801, True)):
        eps = money.epoch_records(events, 1, {}, {5: 1000, 9: finalized_at}, 1800)
        assert eps[0].stakers_late is late
        got = money.expected_credits(eps, ROSTER, P)
        assert got[B] == 4 * 10**15 + (0 if late else 2 * 10**15)
        assert got[T] == 2 * 10**15 + (2 * 10**15 if late else 0)


def test_rules_from_deploy_params() -> None:
    from dtrain import Params

    rules = money.Rules.from_params(Params(treasury=T, developer=D, unbonding_period=3600))
    assert rules == money.Rules(reward_period=1800)
    assert (
        money.Rules.from_params(
            Params(treasury=T, developer=D, unworkable_comp_bps=300)
        ).unworkable_comp_bps
        == 300
    )
    assert rules.cuts(P) == (4 * 10**15, 2 * 10**15, 2 * 10**15, 2 * 10**15)
    assert money.Rules().cuts(7) == (2, 1, 1, 3)  # rounding remainders to the treasury


def test_a_credit_off_by_one_wei_is_flagged() -> None:
    credited = dict(EXPECTED)
    assert all(b.ok for b in money.balances(ROSTER, EXPECTED, credited))
    credited[S] += 1
    rows = money.balances(ROSTER, EXPECTED, credited, {S: 7})
    assert [b.account for b in rows if not b.ok] == ["staker1"]
    bad = next(b for b in rows if not b.ok)
    assert (bad.expected, bad.credited, bad.wallet_before) == (EXPECTED[S], EXPECTED[S] + 1, 7)
    credited[S] -= 2
    assert [b.account for b in money.balances(ROSTER, EXPECTED, credited) if not b.ok] == [
        "staker1"
    ]


def test_an_unworkable_quorum_compensates_its_voters_and_refunds_the_rest() -> None:
    """Epoch 0 paid; epoch 1's first attempt had no quorum, its retry was voted UNWORKABLE by
    A and B (C revealed a checkpoint): A and B get 10% of P each, whole; nobody is slashed; the
    caller gets the escrow less the paid epoch-0 seats and the compensations."""
    unworkable = b"UNWORKABLE".ljust(32, b"\0")
    events = [
        ev("EpochStarted", epoch=0, attempt=1),
        *(ev("OperatorPaid", epoch=0, operator=o) for o in (A, B, C)),
        ev("EpochFinalized", epoch=0, checkpoint=b"\x11" * 32),
        ev("EpochStarted", epoch=1, attempt=2),
        ev("CheckpointRevealed", epoch=1, operator=A, checkpoint=unworkable),
        ev("EpochFailed", epoch=1),
        ev("EpochStarted", epoch=1, attempt=3),
        *(ev("CheckpointRevealed", epoch=1, operator=o, checkpoint=unworkable) for o in (A, B)),
        ev("CheckpointRevealed", epoch=1, operator=C, checkpoint=b"\x22" * 32),
        ev("JobAborted", epoch=1, compensated=2, compensation=P // 10, refund=0),
    ]
    eps = money.epoch_records(events, 3, {})
    assert [e.compensated for e in eps] == [[], [A, B], []]
    assert eps[1].paid == [] and eps[1].slashed == [] and eps[1].quorum_hash is None
    got = money.expected_credits(eps, ROSTER, P, refund_escrow=9 * P)
    base = money.expected_credits(eps[:1], ROSTER, P)
    assert got[A] == base[A] + P // 10 and got[B] == base[B] + P // 10 and got[C] == base[C]
    assert got[K] == 9 * P - 3 * P - 2 * (P // 10)
    assert money.Rules(unworkable_comp_bps=500).compensation(P) == P // 20


def test_token_pool_rewards_round_at_the_contracts_token_scale() -> None:
    """A pool of 1 + 2 shares earning 2,000 units: 1e18 per share rounds the rate to 666 (666
    and 1,332), the contract's token scale 1e36 keeps it (666 and 1,333)."""
    roster = Roster([A], [S], T, D, K, delegations={S: (A, 2 * ETH)})
    paid = [
        ev("EpochFinalized", epoch=0, checkpoint=b"\x11" * 32),
        ev("OperatorPaid", epoch=0, operator=A),
    ]
    eps = money.epoch_records(paid, 1, {0: [A]})
    price = 10_000  # the pool's 20%: 2,000 units
    ether = money.expected_credits(eps, roster, price, part="pay")
    token = money.expected_credits(eps, roster, price, part="pay", token=True)
    assert (ether[A] - 4_000, ether[S]) == (666, 1_332)
    assert (token[A] - 4_000, token[S]) == (666, 1_333)

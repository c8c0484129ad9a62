"""The money check, from hand-made event records and hand-computed credits."""

from __future__ import annotations

from dtrain.models import Event
from dtrain_node.devnet import money
from dtrain_node.devnet.money import ETH, Roster, Slash

P = ETH // 100
A, B, C = "0xA", "0xB", "0xC"  # operators
S, T, D, K = "0x5", "0x7", "0xD", "0xCA"  # staker, treasury, developer, caller
ROSTER = Roster([A, B, C], [S], T, D, K, delegations={S: (A, 2 * ETH)})


def ev(name: str, **args: object) -> Event:
    return Event(name, dict(args), 0, "0x", 0)


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
    A: 2 * 4 * 10**15 + RPS_A + 10**16,  # 40% twice, its pool share, 10% bounty on C's slash
    B: 2 * 4 * 10**15 + 2 * 2 * 10**15,  # alone in its pool
    C: 4 * 10**15 + 2 * 10**15,
    S: 2 * RPS_A,
    T: 5 * 2 * 10**15,
    D: 5 * 2 * 10**15,
    K: 9 * 10**16 + (12 - 5) * P,  # 90% of the slash, the unearned escrow back
}


def test_epoch_records() -> None:
    eps = money.epoch_records(EVENTS, 3, {0: [A, B, C], 1: [A, B, C]})
    assert [e.paid for e in eps] == [[A, B, C], [A, B], []]
    assert eps[0].quorum_hash == "0x" + "11" * 32 and eps[2].quorum_hash is None
    assert eps[1].slashed == [Slash(C, "fabricated checkpoint", ETH // 10, A)]
    assert eps[2].members == [] and eps[0].members == [A, B, C]


def test_expected_credits_match_the_split() -> None:
    eps = money.epoch_records(EVENTS, 3, {})
    assert RPS_A == 1333333333333332
    assert money.expected_credits(eps, ROSTER, P, refund_escrow=12 * P) == EXPECTED
    running = money.expected_credits(eps, ROSTER, P)  # not ended: nothing refunded yet
    assert running[K] == 9 * 10**16


def test_reporter_gets_no_bounty_on_its_own_slash() -> None:
    eps = money.epoch_records(
        [
            ev("Slashed", epoch=0, operator=B, reason=1, amount=100, reporter=B),
            ev("Slashed", epoch=0, operator=C, reason=1, amount=50, reporter=B),
        ],
        1,
        {},
    )
    got = money.expected_credits(eps, ROSTER, P)
    assert got[B] == 5 and got[K] == 145


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

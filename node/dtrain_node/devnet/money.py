"""The money check: every account's credit recomputed from the job's events alone.

Per paid operator-epoch at price P: 40% to the operator, 20% to its stake pool (split by
shares through a reward per share, rounded down as the contract does), 20% to the treasury,
20% to the developer. One finalize settles an epoch's slashes: 10% of what it slashed from
others goes to its sender (the reporter), the rest to the caller. When the job has ended,
the escrow it did not earn goes back to the caller. Pure functions over event data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtrain.models import Event

ETH = 10**18
REASONS = ["fabricated checkpoint", "offline mid-epoch", "failed to sync", "external"]
OPERATOR_PCT, POOL_PCT, TREASURY_PCT, DEVELOPER_PCT = 40, 20, 20, 20
BOUNTY_PCT = 10


@dataclass(frozen=True)
class Slash:
    address: str
    reason: str
    amount: int
    reporter: str


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    members: list[str]
    quorum_hash: str | None
    paid: list[str]
    slashed: list[Slash]


@dataclass(frozen=True)
class Roster:
    """The accounts the story names; each operator registers with `self_stake`."""

    operators: list[str]
    stakers: list[str]
    treasury: str
    developer: str
    caller: str
    delegations: dict[str, tuple[str, int]] = field(default_factory=dict)  # staker: (op, wei)
    self_stake: int = ETH

    def names(self) -> dict[str, str]:
        names = {a: f"op{i + 1}" for i, a in enumerate(self.operators)}
        names.update({a: f"staker{i + 1}" for i, a in enumerate(self.stakers)})
        names.update(
            {self.treasury: "treasury", self.developer: "developer", self.caller: "caller"}
        )
        return names


@dataclass(frozen=True)
class Balance:
    account: str
    address: str
    expected: int
    credited: int
    ok: bool
    wallet_before: int | None


def epoch_records(
    events: Sequence[Event], total_epochs: int, members_by_epoch: dict[int, list[str]]
) -> list[EpochRecord]:
    """Per epoch: its members (as seen while it ran), quorum hash, who was paid, who slashed."""
    out = []
    for e in range(total_epochs):
        mine = [x for x in events if x.args.get("epoch") == e]
        fin = [x for x in mine if x.name == "EpochFinalized"]
        slashed = [
            Slash(
                x.args["operator"], REASONS[x.args["reason"]], x.args["amount"], x.args["reporter"]
            )
            for x in mine
            if x.name == "Slashed"
        ]
        out.append(
            EpochRecord(
                epoch=e,
                members=members_by_epoch.get(e, []),
                quorum_hash="0x" + fin[0].args["checkpoint"].hex() if fin else None,
                paid=[x.args["operator"] for x in mine if x.name == "OperatorPaid"],
                slashed=slashed,
            )
        )
    return out


def expected_credits(
    epochs: Sequence[EpochRecord], roster: Roster, price: int, refund_escrow: int = 0
) -> dict[str, int]:
    """What every account should have been credited. `refund_escrow` is the job's escrow once
    it has ended (what was not paid out goes back to the caller), 0 while it runs."""
    expected = dict.fromkeys(roster.names(), 0)
    shares = {o: {o: roster.self_stake} for o in roster.operators}
    for staker, (op, amount) in roster.delegations.items():
        shares[op][staker] = amount
    reward_per_share = dict.fromkeys(shares, 0)
    n_paid = 0
    for ep in epochs:
        for op in ep.paid:
            n_paid += 1
            expected[op] += price * OPERATOR_PCT // 100
            reward_per_share[op] += (price * POOL_PCT // 100) * ETH // sum(shares[op].values())
            expected[roster.treasury] += price * TREASURY_PCT // 100
            expected[roster.developer] += price * DEVELOPER_PCT // 100
        if ep.slashed:
            reporter = ep.slashed[0].reporter
            total = sum(s.amount for s in ep.slashed)
            others = sum(s.amount for s in ep.slashed if s.address != reporter)
            bounty = others * BOUNTY_PCT // 100
            expected[reporter] = expected.get(reporter, 0) + bounty
            expected[roster.caller] += total - bounty
    for op, holders in shares.items():
        for who, sh in holders.items():
            expected[who] += sh * reward_per_share[op] // ETH
    if refund_escrow:
        expected[roster.caller] += refund_escrow - n_paid * price
    return expected


def balances(
    roster: Roster,
    expected: dict[str, int],
    credited: dict[str, int],
    wallets_before: dict[str, int] | None = None,
) -> list[Balance]:
    """One row per named account: expected against credited, to the wei."""
    rows = []
    for addr, name in roster.names().items():
        want, got = expected.get(addr, 0), credited.get(addr, 0)
        before = (wallets_before or {}).get(addr)
        rows.append(Balance(name, addr, want, got, got == want, before))
    return rows

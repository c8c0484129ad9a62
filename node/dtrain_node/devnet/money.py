"""The money check: every account's credit recomputed from the job's events alone, by the
contract's rules (`DistributedTrainingBSM._finalize`, `_pay`, `_payShared`).

Per paid operator-epoch at price P: `operatorBps` of P to the operator, `stakerBps` to its
stake pool (split by shares through a reward per share, rounded down as the contract does; to
the treasury instead when the epoch was finalized more than a reward period after it began),
`developerBps` to the developer and the rest to the treasury, less a finalizer's reward:
`reporterBountyBps` of the treasury's cut of the operator-epochs its call paid, the epoch's
calls together at most `maxReporterBounty` (a hook finalize settles the members in batches,
one call each), and nothing to the job's caller, the treasury or anyone in the job (a member
of the epoch or a pending joiner). Slashed stake goes to the treasury, all of it. When a
quorum votes an epoch UNWORKABLE (`JobAborted`), nobody is slashed and each member that
revealed UNWORKABLE in that attempt is credited
`unworkableCompBps` of P, whole, from the escrow. When the job has ended, the escrow it did not
earn or pay out goes back to the caller. Every stake of the roster was deposited while its
operator was in no job, so all shares earn from the start. Pure functions over event data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from dtrain import UNWORKABLE
from dtrain.models import SlashReason

if TYPE_CHECKING:
    from dtrain.models import Event

ETH = 10**18
BPS = 10_000
TOKEN_SCALE = 10**36  # the contract's reward rate scale for token jobs (ether's: 1e18)
REASONS = [r.meaning for r in SlashReason]


@dataclass(frozen=True)
class Rules:
    """The deployed parameters the check needs (defaults: the SDK's `Params` defaults)."""

    split_bps: tuple[int, int, int] = (4000, 2000, 2000)  # operator, stake pool, developer
    reporter_bounty_bps: int = 1000
    max_reporter_bounty: int = 10**16
    reward_period: int = 7 * 86400 // 2  # unbondingPeriod / 2
    unworkable_comp_bps: int = 1000

    @classmethod
    def from_params(cls, p: Any) -> Rules:
        """From a `dtrain.Params`."""
        return cls(
            split_bps=(p.operator_bps, p.staker_bps, p.developer_bps),
            reporter_bounty_bps=p.reporter_bounty_bps,
            max_reporter_bounty=p.max_reporter_bounty,
            reward_period=p.unbonding_period // 2,
            unworkable_comp_bps=p.unworkable_comp_bps,
        )

    def cuts(self, price: int) -> tuple[int, int, int, int]:
        """(operator, stake pool, developer, treasury) of one paid operator-epoch."""
        op, pool, dev = (price * bps // BPS for bps in self.split_bps)
        return op, pool, dev, price - op - pool - dev

    def compensation(self, price: int) -> int:
        """What each UNWORKABLE voter gets when its vote aborts the job."""
        return price * self.unworkable_comp_bps // BPS

    def bounty(self, price: int, paid: int, before: int = 0) -> int:
        """An outside finalizer's reward for a call that paid `paid` operator-epochs at `price`
        (`before`: what the epoch's earlier calls earned)."""
        cap = self.max_reporter_bounty - min(self.max_reporter_bounty, before)
        return min(self.cuts(price)[3] * paid * self.reporter_bounty_bps // BPS, cap)


@dataclass(frozen=True)
class Slash:
    address: str
    reason: str
    amount: int
    reporter: str
    tx: str = ""  # the finalize call that slashed it
    attempt: int = 0  # the epoch attempt it was slashed in (0: not observed)


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    members: list[str]
    quorum_hash: str | None
    paid: list[str]
    slashed: list[Slash]
    joining: list[str] = field(default_factory=list)  # pending joiners while it ran
    stakers_late: bool = False  # finalized over a reward period after it began
    compensated: list[str] = field(default_factory=list)  # UNWORKABLE voters of an abort
    # (finalizer, operator-epochs its call paid) of each finalize call that rewarded one
    finalizers: list[tuple[str, int]] = field(default_factory=list)


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


def _late(mine: Sequence[Event], block_time: Mapping[int, int], reward_period: int) -> bool:
    """Was the epoch's quorum finalize more than a reward period after its attempt began?"""
    fin = [x for x in mine if x.name == "EpochFinalized"]
    if not fin or not block_time:
        return False
    starts = [x for x in mine if x.name == "EpochStarted" and x.block <= fin[0].block]
    if not starts:
        return False
    return block_time[fin[0].block] > block_time[starts[-1].block] + reward_period


def _unworkable_voters(mine: Sequence[Event]) -> list[str]:
    """When the epoch was voted unworkable (`JobAborted`): the members that revealed
    UNWORKABLE in its last attempt (the one the abort settled), else none."""
    if not any(x.name == "JobAborted" for x in mine):
        return []
    starts = [i for i, x in enumerate(mine) if x.name == "EpochStarted"]
    last = mine[starts[-1] :] if starts else mine
    return [
        x.args["operator"]
        for x in last
        if x.name == "CheckpointRevealed" and bytes(x.args["checkpoint"]) == UNWORKABLE
    ]


def _finalizers(mine: Sequence[Event]) -> list[tuple[str, int]]:
    """The finalize calls of the epoch that rewarded their sender (`FinalizerPaid`), each with
    the operator-epochs it paid."""
    return [
        (
            x.args["finalizer"],
            sum(1 for y in mine if y.name == "OperatorPaid" and y.tx_hash == x.tx_hash),
        )
        for x in mine
        if x.name == "FinalizerPaid"
    ]


def _slashed(mine: Sequence[Event]) -> list[Slash]:
    """The epoch's slashes, each with its finalize call and attempt (events in block order)."""
    out, attempt = [], 0
    for x in mine:
        if x.name == "EpochStarted":
            attempt = x.args.get("attempt", 0)
        elif x.name == "Slashed":
            a = x.args
            reason = REASONS[a["reason"]]
            out.append(Slash(a["operator"], reason, a["amount"], a["reporter"], x.tx_hash, attempt))
    return out


def epoch_records(
    events: Sequence[Event],
    total_epochs: int,
    members_by_epoch: dict[int, list[str]],
    block_time: Mapping[int, int] | None = None,
    reward_period: int = 0,
) -> list[EpochRecord]:
    """Per epoch: its members (as seen while it ran), quorum hash, who was paid, who slashed.
    `block_time` (block number: timestamp of the EpochStarted and EpochFinalized blocks) tells
    whether the stake pools' share went to the treasury (finalized too late)."""
    out = []
    for e in range(total_epochs):
        mine = [x for x in events if x.args.get("epoch") == e]
        fin = [x for x in mine if x.name == "EpochFinalized"]
        joining = [
            x.args["operator"]
            for x in events
            if x.name == "JoinRequested" and x.args.get("effectiveEpoch") == e + 1
        ]
        out.append(
            EpochRecord(
                epoch=e,
                members=members_by_epoch.get(e, []),
                quorum_hash="0x" + fin[0].args["checkpoint"].hex() if fin else None,
                paid=[x.args["operator"] for x in mine if x.name == "OperatorPaid"],
                slashed=_slashed(mine),
                joining=joining,
                stakers_late=_late(mine, block_time or {}, reward_period),
                compensated=_unworkable_voters(mine),
                finalizers=_finalizers(mine),
            )
        )
    return out


def _slashes(ep: EpochRecord, roster: Roster, expected: dict[str, int]) -> None:
    """Slashed stake: to the treasury, all of it."""
    expected[roster.treasury] += sum(s.amount for s in ep.slashed)


def _finalizer_rewards(
    ep: EpochRecord, roster: Roster, rules: Rules, price: int, expected: dict[str, int]
) -> None:
    """Each rewarded finalize call: its share of the treasury's cut, capped per epoch, moves
    from the treasury to its sender, unless the sender is the caller or in the job."""
    # Everyone paid or slashed in the epoch was a member of it, whatever was observed.
    in_job = {roster.caller, roster.treasury, *ep.members, *ep.joining, *ep.paid}
    in_job |= {s.address for s in ep.slashed}
    so_far = 0
    for who, paid in ep.finalizers:
        if who in in_job:
            continue
        reward = rules.bounty(price, paid, so_far)
        so_far += reward
        expected[who] = expected.get(who, 0) + reward
        expected[roster.treasury] -= reward


def expected_credits(
    epochs: Sequence[EpochRecord],
    roster: Roster,
    price: int,
    refund_escrow: int = 0,
    rules: Rules | None = None,
    part: Literal["all", "pay", "slash"] = "all",
    token: bool = False,
) -> dict[str, int]:
    """What every account should have been credited. `token`: the job pays in a token, whose
    pool reward rates the contract keeps at 1e36 per share (ether's at 1e18), so the stakers'
    shares round differently. `refund_escrow` is the job's escrow once
    it has ended (what was not paid out goes back to the caller), 0 while it runs. `part`
    "pay" counts only what the escrow pays (the 40/20/20/20 cuts, the finalizers' rewards,
    compensation, the refund), "slash" only what slashed stake pays (the treasury's): a job
    escrowed in a token pays the first in the token and the second in ether, as stake is
    ether."""
    rules = rules or Rules()
    expected = dict.fromkeys(roster.names(), 0)
    if part == "slash":
        for ep in epochs:
            _slashes(ep, roster, expected)
        return expected
    shares = {o: {o: roster.self_stake} for o in roster.operators}
    for staker, (op, amount) in roster.delegations.items():
        shares[op][staker] = amount
    reward_per_share = dict.fromkeys(shares, 0)
    scale = TOKEN_SCALE if token else ETH
    op_cut, pool_cut, dev_cut, treasury_cut = rules.cuts(price)
    n_paid, compensated = 0, 0
    for ep in epochs:
        for op in ep.compensated:
            compensated += rules.compensation(price)
            expected[op] += rules.compensation(price)
        for op in ep.paid:
            n_paid += 1
            expected[op] += op_cut
            if ep.stakers_late:
                expected[roster.treasury] += pool_cut
            else:
                reward_per_share[op] += pool_cut * scale // sum(shares[op].values())
            expected[roster.treasury] += treasury_cut
            expected[roster.developer] += dev_cut
        _finalizer_rewards(ep, roster, rules, price, expected)
        if part == "all":
            _slashes(ep, roster, expected)
    for op, holders in shares.items():
        for who, sh in holders.items():
            expected[who] += sh * reward_per_share[op] // scale
    if refund_escrow:
        expected[roster.caller] += refund_escrow - n_paid * price - compensated
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

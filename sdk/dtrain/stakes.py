"""A staker's positions and what slashes took from them; who serves a job's final checkpoint.

What a slash took from a position is computed from the chain, not estimated: a `Slashed`
event says how much wei left the operator's pool (the same fraction of its active and of its
unbonding assets), and the position's value just before it (active stake plus unbonding, read
at the block before the slash's block) times that fraction is the position's loss, to the wei
up to integer rounding. Several slashes of one pool in one block are applied in log order, each
on what the previous one left. A change of the position earlier in the slash's own block (a
delegation mined before the finalize in the same block) is not seen; on a local chain every
transaction has its own block. Reading the past needs a node that keeps the state of old
blocks (anvil does; on a pruned node the read fails with the RPC's error).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from web3 import Web3

from . import models as m


class BSM(Protocol):
    """The reads of `dtrain.client.BSM` these views make (the client passes itself)."""

    w3: Web3

    def events(
        self,
        from_block: int = 0,
        to_block: int | str = "latest",
        names: Iterable[str] | None = None,
        job_id: int | None = None,
    ) -> list[m.Event]: ...

    def job(self, job_id: int, block: int | None = None) -> m.Job: ...

    def job_token(self, job_id: int) -> str | None: ...

    def params(self) -> m.Params: ...

    def operator(self, address: str) -> m.Operator: ...

    def pool(self, operator: str, block: int | str = "latest") -> m.Pool: ...

    def stake_of(self, operator: str, account: str, block: int | str = "latest") -> int: ...

    def unbonding_of(
        self, operator: str, account: str, block: int | str = "latest"
    ) -> tuple[int, int]: ...

    def pending_rewards(self, operator: str, account: str) -> int: ...


_B58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"


def base58(raw: bytes) -> str:
    """Bitcoin-alphabet base58, as libp2p prints peer ids."""
    n, out = int.from_bytes(raw, "big"), ""
    while n:
        n, r = divmod(n, 58)
        out = _B58[r] + out
    return "1" * (len(raw) - len(raw.lstrip(b"\0"))) + out


def peer_id(peer_key: bytes) -> str:
    """The libp2p peer id ("12D3KooW...") of an Ed25519 public key (identity multihash)."""
    return base58(bytes.fromhex("002408011220") + bytes(peer_key))


def staked_with(bsm: BSM, account: str) -> dict[str, int]:
    """Operators `account` ever staked with (self-stake included), each with the block of its
    first deposit."""
    first: dict[str, int] = {}
    for e in bsm.events(names=["Staked"]):
        if e.args["account"] == account:
            first.setdefault(e.args["operator"], e.block)
    return first


def operator_slashes(bsm: BSM, operator: str) -> tuple[m.Slash, ...]:
    """Every `Slashed` event of `operator`, oldest first."""
    out: list[m.Slash] = []
    times: dict[int, int] = {}
    for e in bsm.events(names=["Slashed"]):
        if e.args["operator"] != operator:
            continue
        if e.block not in times:
            times[e.block] = int(bsm.w3.eth.get_block(e.block)["timestamp"])
        out.append(
            m.Slash(
                operator=operator,
                job_id=int(e.args["jobId"]),
                epoch=int(e.args["epoch"]),
                reason=m.SlashReason(e.args["reason"]),
                amount=int(e.args["amount"]),
                reporter=str(e.args["reporter"]),
                block=e.block,
                time=times[e.block],
                tx_hash="0x" + e.tx_hash.removeprefix("0x"),
            )
        )
    return tuple(out)


def earnings(bsm: BSM, operator: str) -> m.Earnings:
    """`operator`'s earnings, slashes and withdrawals in ether over every job (`m.Earnings`)."""
    names = ["OperatorPaid", "RewardsClaimed", "FinalizerPaid", "Withdrawn"]
    events = bsm.events(names=names)
    paid = [e for e in events if e.name == "OperatorPaid" and e.args["operator"] == operator]
    tokens = {j: bsm.job_token(j) for j in {int(e.args["jobId"]) for e in paid}}
    in_ether = [e for e in paid if tokens[int(e.args["jobId"])] is None]
    share = bsm.params().operator_bps
    claimed = sum(
        int(e.args["amount"])
        for e in events
        if e.name == "RewardsClaimed" and e.args["operator"] == e.args["account"] == operator
    )
    return m.Earnings(
        paid_epochs=len(in_ether),
        paid=sum(int(e.args["price"]) * share // 10_000 for e in in_ether),
        rewards=claimed + bsm.pending_rewards(operator, operator),
        bounties=sum(
            int(e.args["amount"])
            for e in events
            if e.name == "FinalizerPaid" and e.args["finalizer"] == operator
        ),
        slashed=sum(x.lost for x in slash_losses(bsm, operator, operator, 0)),
        withdrawn=sum(
            int(e.args["amount"])
            for e in events
            if e.name == "Withdrawn" and e.args["account"] == operator
        ),
        token_epochs=len(paid) - len(in_ether),
    )


def slash_losses(bsm: BSM, operator: str, account: str, since: int) -> tuple[m.SlashLoss, ...]:
    """What each `Slashed` event of `operator`'s pool from block `since` took from `account`'s
    position (see the module's docstring for how)."""
    out: list[m.SlashLoss] = []
    block, held, pool_total = -1, 0, 0
    for e in bsm.events(from_block=since, names=["Slashed"]):
        if e.args["operator"] != operator:
            continue
        if e.block != block:  # the state before this block
            block, before = e.block, e.block - 1
            held = bsm.stake_of(operator, account, before)
            held += bsm.unbonding_of(operator, account, before)[0]
            pool = bsm.pool(operator, before)
            pool_total = pool.total_assets + pool.unbonding_assets
        amount = int(e.args["amount"])
        lost = held * amount // pool_total if pool_total else 0
        held, pool_total = held - lost, pool_total - amount
        stamp = int(bsm.w3.eth.get_block(e.block)["timestamp"])
        reason = m.SlashReason(e.args["reason"])
        args = (int(e.args["jobId"]), int(e.args["epoch"]), reason, e.block, stamp, amount, lost)
        out.append(m.SlashLoss(*args))
    return tuple(out)


def positions(bsm: BSM, account: str) -> list[m.Position]:
    """`account`'s position with every operator it staked with, in the order it first did."""
    out = []
    for operator, since in staked_with(bsm, account).items():
        unbonding, unlock_at = bsm.unbonding_of(operator, account)
        out.append(
            m.Position(
                operator=operator,
                account=account,
                stake=bsm.stake_of(operator, account),
                unbonding=unbonding,
                unlock_at=unlock_at,
                pending_rewards=bsm.pending_rewards(operator, account),
                slashes=slash_losses(bsm, operator, account, since),
            )
        )
    return out


def final_holders(bsm: BSM, job_id: int) -> list[m.Holder]:
    """A completed job's final checkpoint holders: the members paid for its last epoch (a
    cancelled or failed job's: for its last finalized one; an empty list while the job runs)."""
    last = bsm.job(job_id).final_epoch
    if last is None:
        return []
    paid = bsm.events(names=["OperatorPaid"], job_id=job_id)
    holders = sorted({e.args["operator"] for e in paid if e.args["epoch"] == last})
    out = []
    for address in holders:
        op = bsm.operator(address)
        out.append(m.Holder(address, peer_id(op.peer_key), tuple(op.multiaddrs)))
    return out

"""`dtrain stake`: delegate stake to operators."""

from __future__ import annotations

import time

import click

from ..units import format_eth, format_time
from .root import Ctx, _key_address, cli, emit, pass_ctx
from .tx import TxCommand


@cli.group("stake")
def stake_group() -> None:
    """Delegate stake to operators."""


@stake_group.command("show")
@click.option("--account", help="Staker to show [default: the --key account].")
@pass_ctx
def stake_show(ctx: Ctx, account: str | None) -> None:
    """Show a staker's positions with each operator: stake, what is unbonding and when it
    unlocks, pending rewards, and what each slash took.

    A slash takes the same fraction of an operator's whole pool (active and unbonding stake):
    the `Slashed` event's amount over the pool's assets just before it. What it took from this
    position is that fraction of the position's value just before it (stake plus unbonding, read
    at the block before the slash), exact up to integer rounding. Reading old blocks needs a
    node that keeps their state (anvil does).

    Example: dtrain stake show --account 0xabc...
    """
    bsm = ctx.bsm(signing=False)
    who = account or _key_address(ctx)
    positions = bsm.positions(who)
    lines = [f"staker {who}" if positions else f"staker {who} has never staked"]
    now = time.time()
    for p in positions:
        kind = "self-stake" if p.operator == who else "delegation"
        lines += [f"{kind} with {p.operator}", f"  stake       {format_eth(p.stake)}"]
        if p.unbonding:
            hint = (
                f"withdraw with `dtrain stake withdraw {p.operator}`"
                if p.unlock_at <= now
                else "slashable until withdrawn"
            )
            lines.append(
                f"  unbonding   {format_eth(p.unbonding)}, unlocks {format_time(p.unlock_at)}; "
                + hint
            )
        lines.append(f"  rewards     {format_eth(p.pending_rewards)} pending")
        lines.append(f"  slashed     {format_eth(p.lost)} lost in {len(p.slashes)} slash(es)")
        for x in p.slashes:
            lines.append(
                f"    job {x.job_id} epoch {x.epoch}: {x.reason.label}, "
                f"{format_time(x.time)}: the pool lost {format_eth(x.pool_amount)}, "
                f"this position {format_eth(x.lost)}"
            )
    emit(ctx, {"account": who, "positions": positions}, "\n".join(lines))


for _tx in (
    TxCommand(stake_group, "delegate", "op amount", "delegated {amount} to {op}"),
    TxCommand(stake_group, "undelegate", "op amount", "unbonding {amount} from {op}"),
    TxCommand(stake_group, "withdraw", "op", "unbonded stake credited", "withdraw_unbonded"),
):
    _tx.register()

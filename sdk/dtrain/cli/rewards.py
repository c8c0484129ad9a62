"""`dtrain rewards`: credits, staking rewards and withdrawals."""

from __future__ import annotations

from collections.abc import Sequence

import click

from .. import erc20
from ..client import BSM
from ..units import format_eth
from .root import Ctx, _key_address, _TokenUnit, cli, emit, pass_ctx


@cli.group()
def rewards() -> None:
    """Credits, staking rewards and withdrawals."""


@rewards.command("show")
@click.argument("address", required=False)
@click.option(
    "--operator",
    "operators",
    multiple=True,
    metavar="ADDRESS",
    help="Only these pools (repeatable) [default: every pool ADDRESS staked in].",
)
@click.option(
    "--token",
    default=None,
    metavar="ADDRESS",
    help="Show credit and pending rewards in this payment token instead of ether.",
)
@pass_ctx
def rewards_show(
    ctx: Ctx, address: str | None, operators: tuple[str, ...], token: str | None
) -> None:
    """Show wallet balance, claimable credit and pending rewards of ADDRESS (default: the --key
    account) in every pool it staked in (an operator's own pool included).

    Example: dtrain rewards show 0xabc...
    """
    bsm = ctx.bsm(signing=False)
    account = address or _key_address(ctx)
    pools = operators or tuple(bsm.staked_with(account))
    if token:
        _rewards_show_token(ctx, bsm, _TokenUnit.of(bsm, token), account, pools)
        return
    b = bsm.balances(account, pools)
    lines = [
        f"account  {b.address}",
        f"wallet   {format_eth(b.wallet)}",
        f"credit   {format_eth(b.credit)} (withdraw with `dtrain rewards withdraw`)",
    ]
    lines += [
        f"pending  {format_eth(v)} from the pool of {k} (`dtrain rewards withdraw --claim {k}`)"
        for k, v in b.pending_rewards.items()
    ]
    emit(ctx, b, "\n".join(lines))


def _rewards_show_token(
    ctx: Ctx, bsm: BSM, unit: _TokenUnit, account: str, pools: Sequence[str]
) -> None:
    wallet = int(erc20.contract(bsm.w3, unit.address).functions.balanceOf(account).call())
    credit = bsm.token_credit_of(unit.address, account)
    pending = {op: bsm.pending_token_rewards(unit.address, op, account) for op in pools}
    pending = {op: v for op, v in pending.items() if v}
    lines = [
        f"account  {account}",
        f"wallet   {unit.format(wallet)}",
        f"credit   {unit.format(credit)} (withdraw with "
        f"`dtrain rewards withdraw --token {unit.address}`)",
    ]
    lines += [f"pending  {unit.format(v)} from the pool of {k}" for k, v in pending.items()]
    data = {"account": account, "token": unit.address, "wallet": wallet, "credit": credit}
    emit(ctx, {**data, "pending_rewards": pending}, "\n".join(lines))


@rewards.command("withdraw")
@click.option("--claim", "claim_from", multiple=True, help="Claim pool rewards first (repeatable).")
@click.option(
    "--token",
    default=None,
    metavar="ADDRESS",
    help="Withdraw the credit in this payment token instead of ether.",
)
@pass_ctx
def rewards_withdraw(ctx: Ctx, claim_from: tuple[str, ...], token: str | None) -> None:
    """Claim pool rewards (optional) and withdraw all credit. Example: dtrain rewards withdraw"""
    bsm = ctx.bsm()
    for op in claim_from:
        bsm.claim_rewards(op)
    if token:
        unit = _TokenUnit.of(bsm, token)
        amount = bsm.token_credit_of(unit.address, bsm.sender)
        rc = bsm.withdraw_token(unit.address)
        emit(
            ctx,
            {"tx": rc.tx_hash, "amount": amount, "token": unit.address},
            f"withdrew {unit.format(amount)}",
        )
        return
    amount = bsm.credit_of(bsm.sender)
    rc = bsm.withdraw()
    emit(ctx, {"tx": rc.tx_hash, "amount": amount}, f"withdrew {format_eth(amount)}")

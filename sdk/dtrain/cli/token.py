"""`dtrain token`: payment tokens (the devnet TestUSD)."""

from __future__ import annotations

from typing import Any

import click
from web3 import Web3

from .. import erc20
from ..client import connect
from ..errors import ConfigError, InvalidAmount
from .root import Ctx, _address, _key_address, _TokenUnit, cli, emit, pass_ctx


@cli.group()
def token() -> None:
    """Payment tokens: deploy the devnet TestUSD, allow a token for jobs, mint it, balances.

    Amounts are whole tokens read with the token's own decimals (2.5 = 2,500,000 base units of
    a 6-decimal token).
    """


TOKEN_ARG = click.argument("token_address", metavar="TOKEN")


def _w3(ctx: Ctx, signing: bool = False) -> Web3:
    if not ctx.rpc_url:
        raise ConfigError(
            "no RPC URL: pass --rpc-url or set DTRAIN_RPC_URL (or start a local chain with "
            "`dtrain chain up`)"
        )
    if signing and not ctx.key:
        raise ConfigError("no key: pass --key or set DTRAIN_KEY")
    return connect(ctx.rpc_url)


def _token_amount(text: str, unit: _TokenUnit) -> int:
    """AMOUNT in whole tokens, above zero, in `unit`'s base units."""
    amount = erc20.parse_units(text, unit.decimals)
    if amount <= 0:
        raise InvalidAmount(f"AMOUNT {text} is not above zero")
    return amount


@token.command("deploy", epilog="Example: dtrain token deploy")
@pass_ctx
def token_deploy(ctx: Ctx) -> None:
    """Deploy the devnet TestUSD (6 decimals, anyone may mint) from the --key account and print
    its address; then `dtrain token allow ADDRESS` (blueprint developer) lets jobs use it."""
    from ..devtoken import TestUSD

    usd = TestUSD.deploy(_w3(ctx, signing=True), ctx.key or "")
    unit = _TokenUnit.read(usd.w3, usd.address)
    emit(
        ctx,
        {"address": usd.address, "symbol": unit.symbol, "decimals": unit.decimals},
        usd.address,
    )
    if not ctx.as_json:  # stdout stays the address alone, for $(dtrain token deploy)
        click.echo(
            f"{unit.symbol} deployed ({unit.decimals} decimals): mint with `dtrain token mint "
            f"{usd.address} AMOUNT`, allow it for jobs with `dtrain token allow {usd.address}`",
            err=True,
        )


@token.command("allow", epilog="Example: dtrain token allow 0xabc...")
@TOKEN_ARG
@click.option("--disallow", is_flag=True, help="Stop allowing the token for new jobs instead.")
@pass_ctx
def token_allow(ctx: Ctx, token_address: str, disallow: bool) -> None:
    """Allow the ERC-20 TOKEN as a payment token of new jobs on the BSM (blueprint developer
    only; the --key account must be the deployment's developer)."""
    bsm = ctx.bsm()
    unit = _TokenUnit.read(bsm.w3, token_address)
    rc = bsm.set_payment_token(unit.address, not disallow)
    allowed = bsm.is_payment_token(unit.address)
    what = "allowed for new jobs" if allowed else "no longer allowed for new jobs"
    emit(
        ctx,
        {"token": unit.address, "symbol": unit.symbol, "allowed": allowed, "tx": rc.tx_hash},
        f"{unit.symbol} {unit.address} {what} on BSM {bsm.address} (tx {rc.tx_hash})",
    )


@token.command("mint", epilog="Example: dtrain token mint 0xabc... 100 --to 0xdef...")
@TOKEN_ARG
@click.argument("amount", metavar="AMOUNT")
@click.option("--to", "to", default=None, help="Recipient [default: the --key account].")
@pass_ctx
def token_mint(ctx: Ctx, token_address: str, amount: str, to: str | None) -> None:
    """Mint AMOUNT whole tokens of the devnet TestUSD at TOKEN (no other token can be minted
    here), sent from the --key account."""
    from ..devtoken import TestUSD

    w3 = _w3(ctx, signing=True)
    unit = _TokenUnit.read(w3, token_address)
    usd = TestUSD.attach(w3, unit.address, ctx.key)
    recipient = _address(to, "--to") if to else usd.sender
    value = _token_amount(amount, unit)
    rc = usd.mint(recipient, value)
    balance = usd.balance_of(recipient)
    emit(
        ctx,
        {"token": unit.address, "to": recipient, "amount": value, "balance": balance},
        f"minted {unit.format(value)} to {recipient} (now holds {unit.format(balance)}; "
        f"tx {rc.tx_hash})",
    )


@token.command("balance", epilog="Example: dtrain token balance 0xabc... --account 0xdef...")
@TOKEN_ARG
@click.option("--account", default=None, help="Holder to show [default: the --key account].")
@pass_ctx
def token_balance(ctx: Ctx, token_address: str, account: str | None) -> None:
    """Show an account's balance of TOKEN; with a contract configured also its credit in the
    BSM (earned or refunded in the token, `dtrain rewards withdraw --token TOKEN`) and whether
    the BSM allows the token for new jobs."""
    w3 = _w3(ctx)
    unit = _TokenUnit.read(w3, token_address)
    if not account and not ctx.key:
        raise ConfigError("give --account or --key (the holder to show)")
    who = _address(account, "--account") if account else _key_address(ctx)
    balance = int(erc20.contract(w3, unit.address).functions.balanceOf(who).call())
    data: dict[str, Any] = {"token": unit.address, "account": who, "balance": balance}
    lines = [f"{who} holds {unit.format(balance)} ({unit.address})"]
    if ctx.contract:
        bsm = ctx.bsm(signing=False)
        data["credit"] = credit = bsm.token_credit_of(unit.address, who)
        data["allowed"] = allowed = bsm.is_payment_token(unit.address)
        lines.append(f"credit in BSM {bsm.address}: {unit.format(credit)}")
        lines.append(f"allowed for new jobs: {'yes' if allowed else 'no'}")
    emit(ctx, {**data, "symbol": unit.symbol, "decimals": unit.decimals}, "\n".join(lines))

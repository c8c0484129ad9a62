"""`dtrain operator`: register, stake and inspect operators."""

from __future__ import annotations

from typing import Any

import click

from .. import erc20
from ..inputs import parse_amount
from ..units import format_eth, format_time
from .root import (
    AMOUNT,
    EXAMPLES,
    Ctx,
    _address,
    _hex32,
    _jsonable,
    _key_address,
    _TokenUnit,
    cli,
    emit,
    pass_ctx,
)
from .tx import TxCommand


@cli.group()
def operator() -> None:
    """Register, stake and inspect operators."""


@operator.command("register", epilog=f"Example: {EXAMPLES['register']}")
@click.option("--stake", "amount", type=AMOUNT, required=True, help="Self-stake, e.g. 2ether.")
@click.option(
    "--peer-key",
    default="0x" + "00" * 32,
    show_default="none yet",
    help="Ed25519 public key of the node's libp2p identity; `dtrain node run` sets its own "
    "when it starts, so it may be left out.",
)
@click.option("--addr", "addrs", multiple=True, help="libp2p multiaddr (repeatable).")
@click.option("--hardware", default="", help='e.g. "cpu:2" or "gpu:a100x8".')
@click.option(
    "--min-price",
    type=AMOUNT,
    default="0",
    help="Ask in ether per operator-epoch (in a token: `dtrain operator update --token`).",
)
@pass_ctx
def operator_register(
    ctx: Ctx, amount: int, peer_key: str, addrs: tuple[str, ...], hardware: str, min_price: int
) -> None:
    """Register the --key account as an operator with a self-stake."""
    key = _hex32(peer_key, "--peer-key")
    rc = ctx.bsm().register_operator(amount, key, list(addrs), hardware, min_price)
    emit(ctx, {"tx": rc.tx_hash}, f"registered with {format_eth(amount)} stake (tx {rc.tx_hash})")


@operator.command("update", epilog="Example: dtrain operator update --ask 2.5 --token 0xabc...")
@click.option(
    "--ask",
    required=True,
    help="Least price per operator-epoch of a job to join: an ether amount (0.01ether, 0), "
    "or with --token whole tokens (2.5).",
)
@click.option("--token", default=None, help="Set the ask in this payment token, not in ether.")
@pass_ctx
def operator_update(ctx: Ctx, ask: str, token: str | None) -> None:
    """Set the --key operator's ask in ether or in one payment token; asks in other units stay.

    Without an ask in a token, an operator asking nothing in ether joins jobs in that token at
    any price and one asking something joins none.
    """
    bsm = ctx.bsm()
    unit = _TokenUnit.read(bsm.w3, _address(token, "--token")) if token else None
    units = erc20.parse_units(ask, unit.decimals) if unit else parse_amount(ask)
    rc = bsm.update_ask(units, unit.address if unit else None)
    shown = unit.format(units) if unit else format_eth(units)
    emit(ctx, {"tx": rc.tx_hash, "token": token, "ask": units}, f"ask {shown} (tx {rc.tx_hash})")


@operator.command("info")
@click.argument("address", required=False)
@pass_ctx
def operator_info(ctx: Ctx, address: str | None) -> None:
    """Show an operator (default: the --key account) and every slash of its pool: job, epoch,
    what the pool lost and why (from the chain's `Slashed` events).

    Example: dtrain operator info 0xabc...
    """
    bsm = ctx.bsm(signing=False)
    addr = address or _key_address(ctx)
    o = bsm.operator(addr)
    slashes = bsm.slashes(o.address)
    asks = bsm.asks(o.address)
    units = {t: _TokenUnit.read(bsm.w3, t) for t in asks if t is not None}
    lines = [
        f"operator    {o.address}",
        f"registered  {o.registered}",
        f"self-stake  {format_eth(o.self_stake)} ({format_eth(o.bonded)} bonded to seats)",
        f"pool        {format_eth(o.pool.total_assets if o.pool else 0)}",
        f"active jobs {o.active_jobs}",
        *_ask_lines(asks, units),
        f"peer key    0x{o.peer_key.hex()}",
        f"addresses   {', '.join(o.multiaddrs) or '-'}",
        f"hardware    {o.hardware or '-'}",
        f"slashed     {format_eth(sum(x.amount for x in slashes))} in {len(slashes)} slash(es)",
    ]
    for x in slashes:
        lines.append(
            f"  job {x.job_id} epoch {x.epoch}: {format_eth(x.amount)}, "
            f"{x.reason.explanation} ({x.reason.label}), {format_time(x.time)}"
        )
    pnl = bsm.earnings(o.address)
    lines += _pnl_lines(pnl)
    data = {
        **_jsonable(o),
        "asks": [{"token": t, "ask": a} for t, a in asks.items()],
        "slashes": [_slash_json(x) for x in slashes],
        "earnings": {**_jsonable(pnl), "earned": pnl.earned, "net": pnl.net},
    }
    emit(ctx, data, "\n".join(lines))


def _pnl_lines(p: Any) -> list[str]:
    """Earned, lost to slashes, withdrawn and net, in ether (token-paid epochs counted apart)."""
    tokens = f"; {p.token_epochs} more paid in tokens" if p.token_epochs else ""
    return [
        f"earned      {format_eth(p.earned)}: {format_eth(p.paid)} for {p.paid_epochs} paid "
        f"operator-epoch(s){tokens}, {format_eth(p.rewards)} pool rewards on its own stake, "
        f"{format_eth(p.bounties)} finalizer bounties",
        f"lost        {format_eth(p.slashed)} of its own stake to slashes",
        f"withdrawn   {format_eth(p.withdrawn)}",
        f"net         {'-' if p.net < 0 else ''}{format_eth(abs(p.net))} "
        "(earned less what slashes took from its own stake)",
    ]


def _ask_lines(asks: dict[str | None, int | None], units: dict[str, _TokenUnit]) -> list[str]:
    """One line per payment unit: ether first, then each allowed token."""
    lines = []
    for t, a in asks.items():
        if t is None:
            lines.append(f"ask         {format_eth(a or 0)}")
        elif a is None:
            lines.append(f"ask in {units[t].symbol:<5}none: takes no job in {t}")
        else:
            lines.append(f"ask in {units[t].symbol:<5}{units[t].format(a)} ({t})")
    return lines


def _slash_json(x: Any) -> dict[str, Any]:
    """A `Slash` for --json: the reason as its name, meaning and explanation, the epoch
    counted from 0 as the contract (and the text) count it."""
    return {
        **_jsonable(x),
        "meaning": x.reason.meaning,
        "explanation": x.reason.explanation,
    }


for _tx in (
    TxCommand(operator, "stake", "amount", "staked {amount}"),
    TxCommand(operator, "unstake", "amount", "unbonding {amount}"),
    TxCommand(operator, "deregister", "", "deregistered; stake is unbonding"),
    TxCommand(operator, "join", "job", "joined job {job}", "join_job"),
    TxCommand(operator, "leave", "job", "leaving job {job}", "leave_job"),
):
    _tx.register()

"""`dtrain deploy`: a new DistributedTrainingBSM."""

from __future__ import annotations

import click

from ..client import BSM, load_key
from ..envfile import update_env
from ..errors import ConfigError
from ..models import Params
from .root import AMOUNT, DURATION, EXAMPLES, Ctx, cli, emit, pass_ctx


@cli.command(epilog=f"Example: {EXAMPLES['deploy']}")
@click.option("--treasury", help="Protocol treasury (default: the deployer).")
@click.option("--developer", help="Blueprint developer (default: the deployer).")
@click.option("--core", default="0x" + "00" * 20, help="Tangle core allowed to call the hooks.")
@click.option("--min-stake", type=AMOUNT, default="1ether", show_default=True)
@click.option(
    "--unbonding",
    type=DURATION,
    default="7d",
    show_default=True,
    help="Unbonding period; an epoch spans at most a quarter of it (grace + duration + "
    "reveal window).",
)
@click.option(
    "--min-epoch",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Shortest epoch duration a job may ask for.",
)
@click.option(
    "--start-grace",
    type=DURATION,
    default="30s",
    show_default=True,
    help="Time between an epoch's start condition and the start of its duration.",
)
@click.option(
    "--reveal-window",
    type=DURATION,
    default="10m",
    show_default=True,
    help="Time after an epoch's commit deadline in which members reveal their votes.",
)
@click.option(
    "--open-timeout",
    type=DURATION,
    default="1d",
    show_default=True,
    help="How long a started job may wait for members before anyone may fail it (refund).",
)
@click.option(
    "--min-seat-bond",
    type=AMOUNT,
    default="0.1ether",
    show_default=True,
    help="Least self-stake a job may ask each member to bond for its seat.",
)
@click.option(
    "--max-bounty",
    type=AMOUNT,
    default="0.01ether",
    show_default=True,
    help="Cap on an outside finalizer's reward for one epoch (a share of the protocol's fee).",
)
@click.option(
    "--unworkable-comp-bps",
    type=click.IntRange(0, 10_000),
    default=1000,
    show_default=True,
    help="Paid (bps of the price) to each member whose UNWORKABLE vote reached quorum; "
    "below the operator share.",
)
@click.option("--max-operators", default=32, show_default=True)
@click.option(
    "--challenge-window",
    type=DURATION,
    default="10m",
    show_default=True,
    help="Seconds after an epoch's last reveal in which its certified vote may be challenged "
    "(each referee phase lasts as long); 0: no challenges.",
)
@click.option(
    "--challenge-bond",
    type=AMOUNT,
    default="0.1ether",
    show_default=True,
    help="Bond of a challenger (ether) and of each referee (self-stake).",
)
@click.option(
    "--referees",
    type=click.IntRange(1, 31),
    default=3,
    show_default=True,
    help="Referees drawn per challenge (odd).",
)
@click.option(
    "--seat-draw-window",
    type=DURATION,
    default="60s",
    show_default=True,
    help="Seconds a job's seats stay open to applications once its minimum applied, before "
    "they are drawn by stake; 0: seats go to the first joiners.",
)
@click.option(
    "--split",
    default="4000/2000/2000/2000",
    show_default=True,
    help="operator/stakers/protocol/developer basis points.",
)
@click.option(
    "--slash",
    default="1000/500/200",
    show_default=True,
    help="fabrication/dropout/sync-failure basis points.",
)
@pass_ctx
def deploy(
    ctx: Ctx,
    treasury: str | None,
    developer: str | None,
    core: str,
    min_stake: int,
    unbonding: int,
    min_epoch: int,
    start_grace: int,
    reveal_window: int,
    open_timeout: int,
    min_seat_bond: int,
    max_bounty: int,
    unworkable_comp_bps: int,
    max_operators: int,
    challenge_window: int,
    challenge_bond: int,
    referees: int,
    seat_draw_window: int,
    split: str,
    slash: str,
) -> None:
    """Deploy a new DistributedTrainingBSM and print its address."""
    if not ctx.rpc_url or not ctx.key:
        raise ConfigError("deploy needs --rpc-url and --key")
    account = load_key(ctx.key)
    op_bps, st_bps, pr_bps, dev_bps = _bps(split, 4, "--split")
    fab, drop, sync = _bps(slash, 3, "--slash")
    params = Params(
        treasury=treasury or account.address,
        developer=developer or account.address,
        core=core,
        operator_bps=op_bps,
        staker_bps=st_bps,
        protocol_bps=pr_bps,
        developer_bps=dev_bps,
        fabrication_slash_bps=fab,
        dropout_slash_bps=drop,
        sync_fail_slash_bps=sync,
        min_stake=min_stake,
        min_seat_bond=min_seat_bond,
        unbonding_period=unbonding,
        min_epoch_duration=min_epoch,
        start_grace=start_grace,
        reveal_window=reveal_window,
        open_timeout=open_timeout,
        max_reporter_bounty=max_bounty,
        unworkable_comp_bps=unworkable_comp_bps,
        max_operators=max_operators,
        challenge_window=challenge_window,
        challenge_bond=challenge_bond,
        referee_count=referees,
        seat_draw_window=seat_draw_window,
    )
    bsm = BSM.deploy(ctx.rpc_url, account, params)
    saved = update_env(ctx.rpc_url, DTRAIN_CONTRACT=bsm.address)
    data = {"address": bsm.address, "chain_id": bsm.chain_id, "env_file": saved and str(saved)}
    emit(ctx, data, bsm.address)
    if saved and not ctx.as_json:  # stdout stays the address alone, for $(dtrain deploy)
        click.echo(f"contract written to {saved}: other dtrain commands use it", err=True)


def _bps(text: str, n: int, flag: str) -> list[int]:
    parts = text.split("/")
    if len(parts) != n or not all(p.strip().isdigit() for p in parts):
        raise click.BadParameter(f"expected {n} integers separated by '/'", param_hint=flag)
    return [int(p) for p in parts]

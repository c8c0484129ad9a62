"""`dtrain`: the command line over the SDK.

Global options (or env vars DTRAIN_RPC_URL, DTRAIN_CONTRACT, DTRAIN_KEY, or a TOML file given
by --config / DTRAIN_CONFIG with keys rpc_url, contract, key, or last the env file that `dtrain
chain up` and `dtrain deploy` write, see `dtrain.envfile`) pick the chain, the contract and
the signing key. `--json` prints machine-readable output. Errors print one line and exit 1;
`--debug` shows the traceback. Installed packages add commands through the `dtrain.cli` entry
point group: each entry is a function called with the root group (the node adds `dtrain node
...` and `dtrain job fetch`).
"""

from __future__ import annotations

import json
import re
import signal
import sys
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import requests
from web3 import Web3

from . import axolotl, erc20, estimate, pins
from .chain import LocalChain
from .client import BSM, FINALIZE_GAS, JOB_EVENTS, connect, load_key
from .envfile import env_path, read_env, remove_env, update_env, write_env
from .errors import ConfigError, DtrainError, InvalidAmount
from .models import JobSpec, JobStatus, Method, Params, SlashReason, default_topk
from .recipe import ZERO_HASH, Recipe
from .units import format_eth, format_time, parse_amount, parse_duration

EXAMPLES = {
    "chain_up": "dtrain chain up --accounts 5",
    "deploy": "dtrain --rpc-url http://127.0.0.1:8545 --key 0x... deploy --min-stake 1ether",
    "register": (
        "dtrain operator register --stake 2ether --peer-key 0x<32 bytes> "
        "--addr /ip4/127.0.0.1/tcp/4001 --hardware cpu:2 --min-price 0.01ether"
    ),
    "submit": (
        "dtrain job submit --method sft --epochs 4 --steps 200 --sync 20 "
        "--operators 3:4 --price 0.05ether --epoch-duration 1h"
    ),
}


@dataclass
class Ctx:
    rpc_url: str | None
    contract: str | None
    key: str | None
    as_json: bool
    debug: bool

    def bsm(self, signing: bool = True) -> BSM:
        if not self.rpc_url:
            raise ConfigError(
                "no RPC URL: pass --rpc-url or set DTRAIN_RPC_URL (or start a local chain "
                "with `dtrain chain up`, which writes it to " + str(env_path()) + ")"
            )
        if not self.contract:
            raise ConfigError(
                "no contract: pass --contract or set DTRAIN_CONTRACT (`dtrain deploy` to a "
                "chain started by `dtrain chain up` writes it to " + str(env_path()) + ")"
            )
        if signing and not self.key:
            raise ConfigError("no key: pass --key or set DTRAIN_KEY")
        return BSM.attach(self.rpc_url, self.contract, self.key if self.key else None)


class Parsed(click.ParamType):
    """A value read by one of `dtrain.units`' parsers; a bad value is a one-line usage error."""

    def __init__(self, name: str, parse: Callable[[Any], int]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return self._parse(value)
        except DtrainError as exc:
            self.fail(str(exc), param, ctx)


AMOUNT = Parsed("amount", parse_amount)
DURATION = Parsed("duration", parse_duration)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.name.lower()
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


def emit(ctx: Ctx, data: Any, human: str) -> None:
    if ctx.as_json:
        click.echo(json.dumps(_jsonable(data)))
    else:
        click.echo(human)


def _load_config(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        return {k: str(v) for k, v in tomllib.loads(path.read_text()).items()}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rpc-url", envvar="DTRAIN_RPC_URL", help="JSON-RPC endpoint of the chain.")
@click.option("--contract", envvar="DTRAIN_CONTRACT", help="Address of the BSM.")
@click.option("--key", envvar="DTRAIN_KEY", help="Private key that signs transactions.")
@click.option(
    "--config",
    envvar="DTRAIN_CONFIG",
    type=click.Path(path_type=Path, dir_okay=False),
    help="TOML file with rpc_url, contract and key.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(
    click_ctx: click.Context,
    rpc_url: str | None,
    contract: str | None,
    key: str | None,
    config: Path | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Permissionless, paid, verifiable distributed training: operators, stakers and jobs.

    \b
    Examples:
      dtrain chain up
      dtrain --rpc-url URL --key KEY deploy
      dtrain job submit --method cpt --epochs 2 --price 0.01ether --operators 3:3
      dtrain --json job status 1
    """
    conf = _load_config(config)
    env = read_env()
    rpc = rpc_url or conf.get("rpc_url")
    if rpc is None or rpc == env.get("DTRAIN_RPC_URL"):
        # The env file's contract only on the env file's chain.
        rpc = rpc or env.get("DTRAIN_RPC_URL")
        contract = contract or conf.get("contract") or env.get("DTRAIN_CONTRACT")
    click_ctx.obj = Ctx(
        rpc_url=rpc,
        contract=contract or conf.get("contract"),
        key=key or conf.get("key"),
        as_json=as_json,
        debug=debug,
    )


pass_ctx = click.make_pass_decorator(Ctx)


# ---------------------------------------------------------------------- chain


@cli.group()
def chain() -> None:
    """Local development chain."""


@chain.command("up", epilog=f"Example: {EXAMPLES['chain_up']}")
@click.option("--accounts", default=10, show_default=True, help="Funded dev accounts.")
@click.option("--balance", default=10_000, show_default=True, help="Ether per account.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8545,
    show_default=True,
    help="Loopback port to listen on; 0 for a free one.",
)
@pass_ctx
def chain_up(ctx: Ctx, accounts: int, balance: int, port: int) -> None:
    """Start anvil on 127.0.0.1:PORT; print its URL and funded keys; run until Ctrl-C.

    Writes the env file (~/.dtrain/env, or $DTRAIN_ENV_FILE) with DTRAIN_RPC_URL and
    DTRAIN_CHAIN_ID, which every other command reads (`dtrain deploy` adds DTRAIN_CONTRACT), so
    other terminals need no --rpc-url or --contract; options and environment variables override
    it. The file is removed when the chain stops.
    """
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    with LocalChain(accounts=accounts, balance_ether=balance, port=port) as c:
        env = {"DTRAIN_RPC_URL": c.url, "DTRAIN_CHAIN_ID": str(c.chain_id)}
        try:
            path = write_env(env)
            data = {"url": c.url, "env_file": str(path)}
            data["accounts"] = [asdict(a) for a in c.accounts]
            lines = [
                f"anvil listening on {c.url}",
                f"wrote {path}: other dtrain commands use this chain (and the contract "
                "`dtrain deploy` adds there); Ctrl-C stops the chain and removes the file",
                "funded dev accounts:",
            ] + [f"  {a.address}  key {a.key}" for a in c.accounts]
            emit(ctx, data, "\n".join(lines))
            sys.stdout.flush()
            while not stop["now"] and c.running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            remove_env(c.url)


# ---------------------------------------------------------------------- deploy


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


# ---------------------------------------------------------------------- operator


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
@click.option("--min-price", type=AMOUNT, default="0", help="Lowest price per epoch accepted.")
@pass_ctx
def operator_register(
    ctx: Ctx, amount: int, peer_key: str, addrs: tuple[str, ...], hardware: str, min_price: int
) -> None:
    """Register the --key account as an operator with a self-stake."""
    key = _hex32(peer_key, "--peer-key")
    rc = ctx.bsm().register_operator(amount, key, list(addrs), hardware, min_price)
    emit(ctx, {"tx": rc.tx_hash}, f"registered with {format_eth(amount)} stake (tx {rc.tx_hash})")


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
    lines = [
        f"operator    {o.address}",
        f"registered  {o.registered}",
        f"self-stake  {format_eth(o.self_stake)} ({format_eth(o.bonded)} bonded to seats)",
        f"pool        {format_eth(o.pool.total_assets if o.pool else 0)}",
        f"active jobs {o.active_jobs}",
        f"min price   {format_eth(o.min_price_per_epoch)}",
        f"peer key    0x{o.peer_key.hex()}",
        f"addresses   {', '.join(o.multiaddrs) or '-'}",
        f"hardware    {o.hardware or '-'}",
        f"slashed     {format_eth(sum(x.amount for x in slashes))} in {len(slashes)} slash(es)",
    ]
    for x in slashes:
        lines.append(
            f"  job {x.job_id} epoch {x.epoch + 1}: {format_eth(x.amount)}, "
            f"{x.reason.explanation} ({x.reason.label}), {format_time(x.time)}"
        )
    data = {**_jsonable(o), "slashes": [_slash_json(x) for x in slashes]}
    emit(ctx, data, "\n".join(lines))


def _slash_json(x: Any) -> dict[str, Any]:
    """A `Slash` for --json: the reason as its name, meaning and explanation, the epoch 0-based
    as the contract counts (the text shows it 1-based, as `job status` does)."""
    return {
        **_jsonable(x),
        "meaning": x.reason.meaning,
        "explanation": x.reason.explanation,
    }


# ---------------------------------------------------------------------- stake


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
                f"    job {x.job_id} epoch {x.epoch + 1}: {x.reason.label}, "
                f"{format_time(x.time)}: the pool lost {format_eth(x.pool_amount)}, "
                f"this position {format_eth(x.lost)}"
            )
    emit(ctx, {"account": who, "positions": positions}, "\n".join(lines))


@dataclass(frozen=True)
class TxCommand:
    """`dtrain GROUP NAME ARGS...`: one transaction, `BSM.<method>(*args)`, then one line."""

    group: click.Group
    name: str
    args: str  # argument names in order, from TX_ARGS
    done: str  # printed, formatted with the arguments (amounts in ETH)
    method: str = ""  # the BSM method; default: the command's name

    def register(self) -> None:
        def send(ctx: Ctx, **kw: Any) -> None:
            values = [kw[a] for a in self.args.split()]
            rc = getattr(ctx.bsm(), self.method or self.name)(*values)
            shown = {k: format_eth(v) if k == "amount" else v for k, v in kw.items()}
            human, data = self.done.format(**shown), {"tx": rc.tx_hash}
            for e in rc.all("UnbondingQueued"):
                data["unlock_at"] = e.args["unlockAt"]
                human += (
                    f"; withdrawable from {format_time(e.args['unlockAt'])} with "
                    f"`dtrain stake withdraw {e.args['operator']}` (slashable until then)"
                )
            for e in rc.all("Staked"):
                earns = _earns_from(ctx.bsm(), e.args["operator"])
                data["earns_from"] = earns
                if earns:
                    human += (
                        f"; the operator is in a job, so this stake earns rewards from "
                        f"{format_time(earns)} (stake earns only for epochs it was present for "
                        "from their start; it is slashable at once)"
                    )
            emit(ctx, data, human)

        command = pass_ctx(send)
        for a in reversed(self.args.split()):
            command = TX_ARGS[a](command)
        self.group.command(self.name, help=TX_HELP[self.name])(command)


def _earns_from(bsm: BSM, operator: str) -> int:
    """When stake added to `operator`'s pool now starts earning: 0 (at once) when the operator is
    in no job, else the start of the second reward period after this one (the contract's rule)."""
    if bsm.operator(operator).active_jobs == 0:
        return 0
    period = bsm.reward_period()
    return (bsm.latest_block_timestamp() // period + 2) * period


TX_ARGS = {
    "amount": click.argument("amount", type=AMOUNT),
    "job": click.argument("job", type=int, metavar="JOB_ID"),
    "op": click.argument("op", metavar="OPERATOR_ADDRESS"),
}
TX_HELP = {
    "stake": "Add AMOUNT to the operator's self-stake. Example: dtrain operator stake 1ether",
    "unstake": "Queue AMOUNT of self-stake for unbonding. "
    "Example: dtrain operator unstake 0.5ether",
    "deregister": "Deregister (no active jobs) and queue all self-stake for unbonding.",
    "join": "Join JOB_ID at the next epoch boundary. Example: dtrain operator join 1",
    "leave": "Leave JOB_ID at the next epoch boundary. Example: dtrain operator leave 1",
    "delegate": "Delegate AMOUNT to OPERATOR. Example: dtrain stake delegate 0xabc... 5ether",
    "undelegate": "Queue AMOUNT of a delegation for unbonding.\n\n"
    "Example: dtrain stake undelegate 0xabc... 1ether",
    "withdraw": "Credit unbonded stake with OPERATOR once unlocked (then `dtrain rewards "
    "withdraw`). Example: dtrain stake withdraw 0xabc...",
}


# ---------------------------------------------------------------------- job


@cli.group()
def job() -> None:
    """Submit, inspect, watch and cancel training jobs."""


MIN_OPERATORS = 2  # an epoch needs two members: a 2/3 quorum of one would check nothing


def _operators(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        raise click.BadParameter("use MIN:MAX, e.g. 3:4", param_hint="--operators")
    low, high = int(lo), int(hi or lo)
    if high < low:
        raise click.BadParameter(
            f"MIN {low} is greater than MAX {high}: write the smaller number first, e.g. "
            f"{high}:{low}",
            param_hint="--operators",
        )
    if low < MIN_OPERATORS:
        raise click.BadParameter(
            f"a job needs at least {MIN_OPERATORS} operators (votes are checked by a 2/3 "
            f"quorum of its members), got {low}",
            param_hint="--operators",
        )
    return low, high


@job.command("submit", epilog=f"Example: {EXAMPLES['submit']}")
@click.option(
    "--method",
    type=click.Choice([m.name.lower() for m in Method]),
    default="cpt",
    show_default=True,
)
@click.option("--epochs", default=1, show_default=True, help="Total epochs.")
@click.option("--steps", default=100, show_default=True, help="Training steps per epoch.")
@click.option(
    "--sync", "sync_interval", default=2, show_default=True, help="DeMo sync every K steps."
)
@click.option(
    "--operators",
    "operators_range",
    default="2:3",
    show_default=True,
    help="MIN:MAX operators (MIN at least 2).",
)
@click.option(
    "--price",
    required=True,
    help="Price per operator-epoch: an ether amount (1gwei, 0.01ether), or with --token or "
    "--x402 whole tokens (2.5).",
)
@click.option(
    "--token",
    default=None,
    metavar="ADDRESS",
    help="Price and escrow the job in this ERC-20 payment token (one the blueprint developer "
    "allowed) instead of ether; the escrow is approved and paid from the --key account.",
)
@click.option(
    "--seat-bond",
    type=AMOUNT,
    default=None,
    help="Self-stake each member bonds for its seat while in the job "
    "[default: the deployment's minimum seat bond].",
)
@click.option("--epoch-duration", type=DURATION, default="1h", show_default=True)
@click.option(
    "--model-uri",
    "--model",
    "model_uri",
    default="builtin:tiny",
    show_default=True,
    help="The model the job starts from: builtin:tiny or builtin:small (?seed=N picks its "
    "initialisation), a from_pretrained folder (an absolute path or file:///abs/folder), "
    "hf://org/name@revision, a folder served as a pack (p2p:...#sha256=..., "
    "https://...#sha256=...; see --serve) or a model config JSON.",
)
@click.option(
    "--model-hash",
    default=None,
    help="Pin this hash instead of computing it from --model-uri (`dtrain model hash URI`).",
)
@click.option(
    "--dataset-uri",
    "--dataset",
    "dataset_uri",
    required=True,
    help="The dataset file (a text corpus, or JSONL for SFT/DPO/GRPO) at the path the "
    "operators read.",
)
@click.option(
    "--dataset-hash",
    default=None,
    help="Pin this sha256 instead of hashing --dataset-uri here (a file only operators have).",
)
@click.option(
    "--topk",
    type=int,
    default=None,
    help="Top-k values per DCT chunk [default: 4 up to 4 operators, 6 above (measured)].",
)
@click.option("--quant-bits", type=click.Choice(["1", "2"]), default="1", show_default=True)
@click.option("--tee", is_flag=True, help="Require TEE-attested operators.")
@click.option(
    "--recipe",
    "recipe_path",
    default=None,
    help="A recipe TOML (batch size, learning rates, outer step, DPO/GRPO settings, seed) "
    "at the path the operators read; its hash is pinned [default: the reference recipe].",
)
@click.option(
    "--serve",
    is_flag=True,
    help="Serve the local --model-uri folder, --dataset-uri file and --recipe file from this "
    "machine over libp2p (as `dtrain data serve` does), pin their p2p URIs in the job, and keep "
    "serving until the job ends or Ctrl-C.",
)
@click.option(
    "--serve-port",
    type=click.IntRange(0, 65535),
    default=4100,
    show_default=True,
    help="With --serve: the TCP port to serve on.",
)
@click.option(
    "--x402",
    "x402_url",
    default=None,
    metavar="URL",
    help="Buy the job from the `dtrain gateway` at URL instead: pay its escrow in the "
    "gateway's token over x402 (--price is then in whole tokens of it, e.g. 0.01); the job is "
    "yours.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Run every check and print what the job would pin and escrow; send nothing.",
)
@pass_ctx
def job_submit(
    ctx: Ctx,
    method: str,
    epochs: int,
    steps: int,
    sync_interval: int,
    operators_range: str,
    price: str,
    token: str | None,
    seat_bond: int | None,
    epoch_duration: int,
    model_hash: str,
    model_uri: str,
    dataset_hash: str,
    dataset_uri: str,
    topk: int | None,
    quant_bits: str,
    tee: bool,
    recipe_path: str | None,
    serve: bool,
    serve_port: int,
    x402_url: str | None,
    dry_run: bool,
) -> None:
    """Create a job, escrowing price x max operators x epochs.

    The model and dataset hashes are computed from --model-uri and --dataset-uri (and
    printed), unless given; so is the recipe's, from --recipe. Each member bonds --seat-bond of
    its self-stake while in the job. With --token the job is priced, escrowed, paid and
    refunded in that token (stake and seat bonds stay in ether). With --x402 URL the job is
    bought from a gateway, its escrow paid in the gateway's token over x402 (--price is then in
    whole tokens of it).

    With --dry-run every check above runs (arguments, paths, dataset and model, the token, and
    the contract's own checks by estimating the creation from the --key account, which must hold
    the escrow), then the pins and the escrow are printed and nothing is sent: no transaction,
    no payment, no serving.
    """
    _check_cheap_arguments(price, token or x402_url, seat_bond, epochs, steps, sync_interval, topk)
    if x402_url is not None and (serve or token):
        raise click.UsageError("--x402 goes with neither --serve nor --token")
    for flag, uri, pinned in (
        ("--model-uri", model_uri, bool(model_hash)),
        ("--dataset-uri", dataset_uri, bool(dataset_hash)),
        ("--recipe", recipe_path or "", False),
    ):
        _refuse_relative_path(flag, uri, serve, pinned)
    price_units = 0 if token or x402_url else _price(price, None)
    recipe = Recipe.from_toml(recipe_path) if recipe_path else None
    recipe_pin = recipe.hash() if recipe else ZERO_HASH
    lo, hi = _operators(operators_range)
    data_pin = (
        _hex32(dataset_hash, "--dataset-hash") if dataset_hash else pins.dataset_hash(dataset_uri)
    )
    validated = not dataset_hash and pins.is_local(dataset_uri)  # what we hash, we validate
    data_summary = pins.check_dataset(dataset_uri, method, recipe) if validated else ""
    if model_hash:
        model_pin = _hex32(model_hash, "--model-hash")
    elif validated:  # a dry run of the job as the nodes will build it; its pin on the way
        model_pin = pins.check_job(model_uri, dataset_uri, method, recipe)
    else:
        model_pin = pins.model_hash(model_uri)
    server = None
    if serve and not dry_run:  # hashes above come from the local files; the job names p2p URIs
        server, model_uri, dataset_uri, recipe_path = _start_serving(
            model_uri, dataset_uri, recipe_path or "", serve_port
        )
    bsm = ctx.bsm() if x402_url is None else None
    terms = _gateway_terms(x402_url) if x402_url is not None else None
    if bsm is not None and token:
        unit: _TokenUnit | None = _TokenUnit.of(bsm, token)
    elif terms is not None:
        unit = _TokenUnit(terms["token"], int(terms["decimals"]), terms["tokenName"])
    else:
        unit = None
    if unit:
        price_units = _price(price, unit)
    spec = JobSpec(
        price_per_operator_epoch=price_units,
        total_epochs=epochs,
        steps_per_epoch=steps,
        sync_interval=sync_interval,
        min_operators=lo,
        max_operators=hi,
        method=Method[method.upper()],
        model_hash=model_pin,
        model_uri=model_uri,
        dataset_hash=data_pin,
        dataset_uri=dataset_uri,
        topk_per_chunk=default_topk(hi) if topk is None else topk,
        quant_bits=int(quant_bits),
        epoch_duration=epoch_duration,
        tee_required=tee,
        seat_bond=seat_bond or (bsm.params().min_seat_bond if bsm else 0),
        recipe_hash=recipe_pin,
        recipe_uri=recipe_path or "",
    )
    fmt = unit.format if unit else format_eth
    forecast = _forecast(bsm, spec, recipe, fmt)
    if dry_run:
        gas = bsm.check_create_job(spec, unit.address if unit else None) if bsm else 0
        _show_dry_run(ctx, spec, unit, data_summary, gas, serve, x402_url, forecast)
        return
    if bsm is None:
        _buy_job(ctx, x402_url or "", spec, unit)
        return
    job_id = bsm.create_job_with_token(spec, unit.address) if unit else bsm.create_job(spec)
    emit(
        ctx,
        {
            "job_id": job_id,
            "token": unit.address if unit else None,
            "escrow": spec.escrow,
            "seat_bond": spec.seat_bond,
            "model_hash": "0x" + model_pin.hex(),
            "dataset_hash": "0x" + data_pin.hex(),
            "dataset_summary": data_summary,
            "recipe_hash": "0x" + recipe_pin.hex(),
            "recipe_uri": spec.recipe_uri,
            "estimate": forecast[1],
        },
        f"job {job_id} created, {fmt(spec.escrow)} escrowed, "
        f"{format_eth(spec.seat_bond)} seat bond\n"
        f"  model    {model_uri}  0x{model_pin.hex()}\n"
        f"  dataset  {dataset_uri}  0x{data_pin.hex()} (sha256)"
        + (f", {data_summary}" if data_summary else "")
        + (f"\n  recipe   {recipe_path}  0x{recipe_pin.hex()}" if recipe_path else "")
        + f"\n{forecast[0]}",
    )
    if server is not None:
        _serve_until_ended(ctx, server, bsm, job_id)


def _forecast(
    bsm: BSM | None, spec: JobSpec, recipe: Recipe | None, fmt: Callable[[int], str]
) -> tuple[str, dict[str, Any]]:
    """`job submit`'s estimate of the job's time and cost (dtrain.estimate), and the recipe's
    schedule over the job's inner steps: summary lines and their JSON."""
    params = bsm.params() if bsm is not None else None
    est = estimate.estimate(spec, params)
    text = estimate.describe(est, spec, params, fmt)
    note = estimate.schedule_note(recipe, spec)
    return (f"{note}\n{text}" if note else text), est.as_dict()


def _show_dry_run(
    ctx: Ctx,
    spec: JobSpec,
    unit: _TokenUnit | None,
    data_summary: str,
    gas: int,
    serve: bool,
    x402_url: str | None,
    forecast: tuple[str, dict[str, Any]],
) -> None:
    """`job submit --dry-run`'s report: what the job would pin and escrow, and the estimate of
    its time and cost (nothing was sent)."""
    fmt = unit.format if unit else format_eth
    payer = f"the gateway {x402_url} for " if x402_url else ""
    payer += load_key(ctx.key).address if ctx.key else "the --key account"
    recipe_uri = spec.recipe_uri or "the reference recipe"
    served = "; --serve would serve these local files and pin their p2p: URIs" if serve else ""
    if x402_url:
        checked = "the gateway checks it when paid"
    elif gas:
        checked = f"the contract accepts it, {gas:,} gas"
    else:  # a token job whose allowance is short: the approval would come first
        checked = "the escrow's approval comes first, then the contract's checks"
    bond = format_eth(spec.seat_bond) if spec.seat_bond else "the deployment's minimum"
    human = (
        f"dry run: nothing sent; the job would be created as follows ({checked}){served}\n"
        f"  model    {spec.model_uri}  0x{spec.model_hash.hex()}\n"
        f"  dataset  {spec.dataset_uri}  0x{spec.dataset_hash.hex()} (sha256)"
        + (f", {data_summary}" if data_summary else "")
        + f"\n  recipe   {recipe_uri}  0x{spec.recipe_hash.hex()}\n"
        f"  escrow   {fmt(spec.escrow)} = {fmt(spec.price_per_operator_epoch)} x "
        f"{spec.max_operators} operators x {spec.total_epochs} epoch(s), paid by {payer}\n"
        f"  seat bond {bond} of each member's self-stake\n{forecast[0]}"
    )
    data = {
        "dry_run": True,
        "token": unit.address if unit else None,
        "escrow": spec.escrow,
        "price_per_operator_epoch": spec.price_per_operator_epoch,
        "max_operators": spec.max_operators,
        "total_epochs": spec.total_epochs,
        "seat_bond": spec.seat_bond,
        "model_uri": spec.model_uri,
        "model_hash": "0x" + spec.model_hash.hex(),
        "dataset_uri": spec.dataset_uri,
        "dataset_hash": "0x" + spec.dataset_hash.hex(),
        "dataset_summary": data_summary,
        "recipe_uri": spec.recipe_uri,
        "recipe_hash": "0x" + spec.recipe_hash.hex(),
        "gas": gas,
        "serve": serve,
        "x402": x402_url,
        "estimate": forecast[1],
    }
    emit(ctx, data, human)


def _check_cheap_arguments(
    price: str,
    in_tokens: str | None,
    seat_bond: int | None,
    epochs: int,
    steps: int,
    sync_interval: int,
    topk: int | None,
) -> None:
    """`job submit`'s checks that need neither the chain, the dataset nor the model: run first,
    so a zero price is refused at once (not after a model check of many seconds), in one line
    naming the option."""
    if in_tokens:  # whole tokens: the token's decimals are read later, the sign is known now
        try:
            positive = Decimal(price.strip()) > 0
        except InvalidOperation:
            positive = True  # not a number: `_price` says so once the token is known
    else:
        positive = _price(price, None) > 0
    if not positive:
        raise ConfigError(
            f"--price {price} is not above zero: each member is paid it per epoch (e.g. "
            "--price 0.01ether, or with --token/--x402 whole tokens such as --price 2.5)"
        )
    if seat_bond is not None and seat_bond <= 0:
        raise ConfigError(
            "--seat-bond must be above zero (leave it out for the deployment's minimum)"
        )
    for flag, value in (("--epochs", epochs), ("--steps", steps), ("--sync", sync_interval)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    if sync_interval > steps:
        raise ConfigError(
            f"--sync {sync_interval} is above --steps {steps}: an epoch must hold at least one "
            "sync (--sync at most --steps)"
        )
    if topk is not None and topk < 1:
        raise ConfigError(f"--topk must be at least 1, got {topk}")


def _relative_path(uri: str) -> str | None:
    """The filesystem path `uri` names when it is a relative one (no scheme, or file:// with a
    relative path); None for an absolute path and for builtin:, hf://, p2p: and https: URIs."""
    if not uri or not pins.is_local(uri):
        return None
    path = uri.removeprefix("file://")
    return None if Path(path).is_absolute() else path


def _refuse_relative_path(flag: str, uri: str, serve: bool, pinned: bool) -> None:
    """A relative path would go into the job as it is, and each operator would look for it in
    its own working directory: refused before any transaction, with what to use instead. With
    --serve a file or folder that exists here is served and named by its p2p: URI instead; with
    its hash pinned by hand (--model-hash/--dataset-hash) the caller vouches for the path."""
    path = _relative_path(uri)
    if path is None or pinned or (serve and Path(path).expanduser().exists()):
        return
    absolute = Path(path).expanduser().resolve()
    raise ConfigError(
        f"{flag} {uri!r} is a relative path, which no operator can read (each would look in its "
        f"own working directory): add --serve to serve it from this machine (the job then names "
        f"its p2p: URI), or give an absolute path every operator reads ({absolute}), or a "
        "p2p:, https:// or hf:// URI"
    )


def _gateway_terms(url: str) -> dict[str, Any]:
    from .paidjobs import gateway_terms

    return gateway_terms(url)


def _buy_job(ctx: Ctx, url: str, spec: JobSpec, unit: _TokenUnit | None) -> None:
    """`job submit --x402`: pay the gateway exactly the escrow, in its token, for the job."""
    from .paidjobs import buy_job

    if not ctx.key:
        raise ConfigError("no key: pass --key or set DTRAIN_KEY (the account that pays)")
    assert unit is not None  # the gateway's token, read from its terms
    bought = buy_job(url, spec, load_key(ctx.key), spec.escrow, unit.address)
    amount = unit.format(bought.escrow)
    emit(
        ctx,
        {
            "job_id": bought.job_id,
            "escrow": bought.escrow,
            "token": bought.token,
            "owner": bought.payer,
            "settlement_tx": bought.settlement_tx,
            "create_tx": bought.create_tx,
        },
        f"job {bought.job_id} created by the gateway for {bought.payer}, {amount} escrowed "
        f"(paid in {bought.settlement_tx}, created in {bought.create_tx})",
    )


def _job_unit(bsm: BSM, job_id: int) -> _TokenUnit | None:
    """The payment token job `job_id` is priced in (None: ether)."""
    token = bsm.job_token(job_id)
    return _TokenUnit.of(bsm, token) if token else None


def _fmt_in(unit: _TokenUnit | None, amount: int) -> str:
    return unit.format(amount) if unit else format_eth(amount)


def _price(text: str, unit: _TokenUnit | None) -> int:
    """--price in wei (an ether amount) or, for a token job, in the token's base units."""
    try:
        return erc20.parse_units(text, unit.decimals) if unit else parse_amount(text)
    except DtrainError as exc:
        raise click.BadParameter(str(exc), param_hint="--price") from None


@dataclass(frozen=True)
class _TokenUnit:
    """A payment token as the CLI reads and prints its amounts (its own decimals)."""

    address: str
    decimals: int
    symbol: str

    @classmethod
    def of(cls, bsm: BSM, token: str) -> _TokenUnit:
        try:
            Web3.to_checksum_address(token)
        except ValueError:
            raise click.BadParameter(f"not an address: {token!r}", param_hint="--token") from None
        return cls.read(bsm.w3, token)

    @classmethod
    def read(cls, w3: Web3, token: str) -> _TokenUnit:
        """The ERC-20 at `token` (`erc20.NotAnERC20`, one line, when there is none)."""
        return cls(*erc20.read_token(w3, token))

    def format(self, amount: int) -> str:
        return erc20.format_units(amount, self.decimals, self.symbol)


def _start_serving(
    model_uri: str, dataset_uri: str, recipe_uri: str, port: int
) -> tuple[Any, str, str, str | None]:
    """`job submit --serve`: the node package's data server, serving the job's local
    references; (server, model URI, dataset URI, recipe URI) to put in the job."""
    try:
        from dtrain_node.p2p.dataserve import DataServer, serve_job_files
    except ImportError as exc:
        raise ConfigError(
            f"--serve needs the node package (libp2p): pip install 'dtrain[node]' ({exc})"
        ) from None
    server = DataServer(port=port).start()  # its thread is a daemon: an error below ends it
    model_uri, dataset_uri, recipe_uri = serve_job_files(server, model_uri, dataset_uri, recipe_uri)
    return server, model_uri, dataset_uri, recipe_uri or None


def _serve_until_ended(ctx: Ctx, server: Any, bsm: BSM, job_id: int) -> None:
    from dtrain_node.p2p.dataserve import serve_until

    def ended() -> str | None:
        status = bsm.job(job_id).state.status
        return status.name.lower() if status.is_ended else None

    click.echo(f"serving job {job_id}'s files until it ends (Ctrl-C stops)", err=True)
    why = serve_until(ended, poll_s=5.0)
    sent = server.bytes_sent()
    server.stop()
    emit(
        ctx,
        {"job_id": job_id, "stopped_serving": why, "bytes_sent": sent},
        f"stopped serving: job {job_id} {why} ({sent / 1e6:.1f} MB sent)",
    )


@cli.group()
def model() -> None:
    """Model references and the hashes jobs pin."""


@model.command("hash")
@click.argument("uri")
def model_hash_cmd(uri: str) -> None:
    """Print the modelHash a job of model URI URI carries (the hash of its start weights)."""
    click.echo("0x" + pins.model_hash(uri).hex())


@cli.group()
def data() -> None:
    """Datasets and models for jobs."""


@data.command("check", epilog="Example: dtrain data check train.jsonl --method sft")
@click.argument("path")
@click.option(
    "--method",
    type=click.Choice([m.name.lower() for m in Method]),
    required=True,
    help="The job's method: the format its lines must have.",
)
@click.option("--recipe", "recipe_path", default=None, help="The job's recipe (its GRPO reward).")
@pass_ctx
def data_check_cmd(ctx: Ctx, path: str, method: str, recipe_path: str | None) -> None:
    """Validate the dataset file PATH for a job of --method as `job submit` does, and print a
    summary; a bad file prints its bad lines by number and exits 1. PATH may be an axolotl
    YAML config (.yml/.yaml): its datasets, model and recipe are checked (dtrain.axolotl)."""
    recipe = Recipe.from_toml(recipe_path) if recipe_path else None
    check = axolotl.check_config if axolotl.is_config(path) else pins.check_dataset
    summary = check(path, method, recipe)
    emit(
        ctx, {"dataset": path, "method": method, "summary": summary}, f"dataset  {path}  {summary}"
    )


@cli.group()
def recipe() -> None:
    """Training recipes and the hash jobs pin."""


@recipe.command("hash")
@click.argument("path")
def recipe_hash_cmd(path: str) -> None:
    """Print the recipeHash of the recipe TOML at PATH (sha256 of its canonical JSON)."""
    click.echo("0x" + Recipe.from_toml(path).hash().hex())


@recipe.command("show")
@click.argument("path")
def recipe_show_cmd(path: str) -> None:
    """Print the canonical form of the recipe TOML at PATH (every field, defaults filled in;
    the inner-step schedule fields only when set)."""
    click.echo(Recipe.from_toml(path).canonical())


def _epoch_of(j: Any) -> str:
    """ "e/E": the epoch in progress (1-based) while running, else the epochs finished."""
    done, total = j.state.epoch, j.spec.total_epochs
    shown = done + 1 if j.state.status == JobStatus.RUNNING else done
    return f"{shown}/{total}"


def _job_lines(j: Any, holders: list[Any], fmt: Callable[[int], str] = format_eth) -> str:
    s, st = j.spec, j.state
    lines = [
        f"job {j.id}  {s.method.name}  {st.status.name.lower()}",
        f"  caller      {st.caller}",
        f"  epoch       {_epoch_of(j)}"
        + (f"  ({st.failed_epochs} failed in a row)" if st.failed_epochs else ""),
        f"  members     {len(j.members)}/{s.max_operators} (at least {s.min_operators}), "
        f"{len(j.pending_joins)} joining",
    ]
    if j.deadline:
        lines += [
            f"  votes       {j.committed} committed, {j.revealed} revealed",
            f"  commit by   {format_time(j.deadline)}",
            f"  reveal by   {format_time(j.reveal_deadline)}",
        ]
    lines += [
        f"  price       {fmt(s.price_per_operator_epoch)} per operator-epoch",
        f"  seat bond   {format_eth(s.seat_bond)} of each member's self-stake",
        f"  escrow      {fmt(st.escrow)} unearned",
        f"  checkpoint  0x{st.checkpoint.hex()}",
    ]
    if st.status == JobStatus.COMPLETED:
        lines.append("  served by   " + ("nobody paid for the last epoch" if not holders else ""))
        for h in holders:
            addrs = ", ".join(h.multiaddrs) or "no registered address"
            lines.append(f"    {h.operator}  peer {h.peer_id}  {addrs}")
        lines.append(f"  (fetch it with `dtrain job fetch {j.id} --out DIR` while one is up)")
    return "\n".join(lines)


@job.command("status")
@click.argument("job_id", type=int)
@pass_ctx
def job_status(ctx: Ctx, job_id: int) -> None:
    """Show a job's spec, epoch, members, votes, deadlines and escrow; once completed, who
    serves its final checkpoint (the members paid for the last epoch, with the peer ids and
    addresses they registered). Example: dtrain job status 1"""
    bsm = ctx.bsm(signing=False)
    j = bsm.job(job_id)
    holders = bsm.final_holders(job_id) if j.state.status == JobStatus.COMPLETED else []
    unit = _job_unit(bsm, job_id)
    ending = j.state.status == JobStatus.RUNNING and bsm.cancel_requested(job_id)
    data = {
        **_jsonable(j),
        "token": unit.address if unit else None,
        "final_holders": _jsonable(holders),
        "cancel_requested": ending,
    }
    human = _job_lines(j, holders, unit.format if unit else format_eth)
    if ending:
        human += f"\ncancel requested: the job ends after epoch {j.state.epoch}, the rest refunded"
    emit(ctx, data, human)


@job.command("list")
@pass_ctx
def job_list(ctx: Ctx) -> None:
    """List every job: method, state, epoch, members (n/max) and price per operator-epoch.

    Example: dtrain --json job list"""
    bsm = ctx.bsm(signing=False)
    jobs = bsm.jobs()
    units = {j.id: _job_unit(bsm, j.id) for j in jobs}
    human = "\n".join(
        f"{j.id:>4}  {j.spec.method.name:<4}  {j.state.status.name.lower():<9}  "
        f"epoch {_epoch_of(j):<5}  members {len(j.members)}/{j.spec.max_operators}  "
        f"price {_fmt_in(units[j.id], j.spec.price_per_operator_epoch)} per operator-epoch"
        for j in jobs
    )
    emit(ctx, jobs, human or "no jobs")


for _tx in (
    TxCommand(operator, "stake", "amount", "staked {amount}"),
    TxCommand(operator, "unstake", "amount", "unbonding {amount}"),
    TxCommand(operator, "deregister", "", "deregistered; stake is unbonding"),
    TxCommand(operator, "join", "job", "joined job {job}", "join_job"),
    TxCommand(operator, "leave", "job", "leaving job {job}", "leave_job"),
    TxCommand(stake_group, "delegate", "op amount", "delegated {amount} to {op}"),
    TxCommand(stake_group, "undelegate", "op amount", "unbonding {amount} from {op}"),
    TxCommand(stake_group, "withdraw", "op", "unbonded stake credited", "withdraw_unbonded"),
):
    _tx.register()


@job.command("cancel")
@click.argument("job_id", type=int)
@pass_ctx
def job_cancel(ctx: Ctx, job_id: int) -> None:
    """End a job; the escrow no epoch earned is credited back to its caller.

    The caller may cancel its open job at any time. A running job (caller only) ends after the
    epoch in progress: that epoch still settles as usual (its members paid, or slashed), then
    the job closes cancelled instead of starting the next epoch and the rest of the escrow is
    refunded to the wei (the refund shows in `rewards` once the epoch is finalized). Anyone may
    end a job that started and has since waited the deployment's open timeout for members (it
    then fails).

    Example: dtrain job cancel 1
    """
    bsm = ctx.bsm()
    rc = bsm.cancel_job(job_id)
    unit = _job_unit(bsm, job_id)
    fmt = unit.format if unit else format_eth  # the refund's unit
    if rc.all("CancelRequested"):
        epoch = rc.first("CancelRequested").args["epoch"]
        human = (
            f"job {job_id} ends after epoch {epoch}: that epoch is settled as usual, "
            "then the unearned escrow is credited to its caller"
        )
        emit(ctx, {"tx": rc.tx_hash, "status": "cancel_requested", "epoch": epoch}, human)
        return
    if rc.all("JobFailed"):
        refund = rc.first("JobFailed").args["refund"]
        human = (
            f"job {job_id} failed: it waited the open timeout for members; "
            f"{fmt(refund)} of escrow credited to its caller"
        )
        outcome = "failed"
    else:
        refund = rc.first("JobCancelled").args["refund"]
        human = f"job {job_id} cancelled; {fmt(refund)} of escrow credited, see rewards"
        outcome = "cancelled"
    emit(ctx, {"tx": rc.tx_hash, "status": outcome, "refund": refund}, human)


@job.command("finalize")
@click.argument("job_id", type=int)
@pass_ctx
def job_finalize(ctx: Ctx, job_id: int) -> None:
    """Settle the job's current epoch (anyone; earns slash bounties).

    An epoch can be settled once every member revealed its vote or the reveal deadline passed.
    On a chain that mines only when a transaction arrives (a local anvil), the latest block can
    be older than a deadline the wall clock has passed: the transaction is then sent with a
    fixed gas limit instead of an estimate (which would run against that old block), so it
    runs in a new block stamped with the current time.

    Example: dtrain job finalize 1
    """
    bsm = ctx.bsm()
    j = bsm.job(job_id)
    epoch = j.state.epoch
    if j.state.status != JobStatus.RUNNING:
        raise DtrainError(
            f"job {job_id} is {j.state.status.name.lower()}: no epoch to settle"
            + (
                f" (it waits for members: {len(j.members)} of at least {j.spec.min_operators})"
                if j.state.status == JobStatus.OPEN
                else ""
            )
        )
    all_in = j.revealed == len(j.members)
    block_ts = bsm.latest_block_timestamp()
    if not all_in and max(block_ts, int(time.time())) <= j.reveal_deadline:
        raise DtrainError(
            f"epoch {epoch + 1}/{j.spec.total_epochs} of job {job_id} cannot be settled yet: "
            f"{j.revealed} of {len(j.members)} members revealed and reveals are open until "
            f"{format_time(j.reveal_deadline)}; run this again after that"
        )
    stale = not all_in and block_ts <= j.reveal_deadline
    rc = bsm.finalize_epoch(job_id, epoch, gas=FINALIZE_GAS if stale else None)
    shown = ("EpochFinalized", "EpochFailed", "Slashed", "JobAborted", "JobCompleted", "JobFailed")
    names = [e.name for e in rc.events if e.name in shown]
    lines = [f"epoch {epoch + 1}/{j.spec.total_epochs} of job {job_id} settled"]
    unit = _job_unit(bsm, job_id)
    lines += [f"  {_event_text(e, unit)}" for e in rc.events if e.name in shown]
    if stale:
        lines.append(
            f"  (the chain's latest block, {format_time(block_ts)}, was older than the reveal "
            f"deadline: sent with a fixed gas limit of {FINALIZE_GAS:,} so it ran in a new block)"
        )
    emit(ctx, {"tx": rc.tx_hash, "events": names, "fixed_gas": stale}, "\n".join(lines))


AMOUNT_ARGS = frozenset(
    {"amount", "price", "refund", "escrow", "stake", "compensation", "minPricePerEpoch"}
)
TIME_ARGS = frozenset({"deadline", "unlockAt"})


def _arg_text(name: str, value: Any, fmt: Callable[[int], str] = format_eth) -> str:
    """An event argument as people read it: ETH (or `fmt`'s unit), local times, reasons and
    methods by name."""
    if name in AMOUNT_ARGS and isinstance(value, int):
        return fmt(value)
    if name in TIME_ARGS and isinstance(value, int):
        return format_time(value)
    if name == "reason" and isinstance(value, int):
        return SlashReason(value).label
    if name == "method" and isinstance(value, int):
        return Method(value).name
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return str(value)


HIDDEN_ARGS = ("attempt",)  # chain-wide counters that read as per-job ones (kept in --json)


def _event_text(e: Any, unit: _TokenUnit | None = None) -> str:
    """ "Slashed: operator 0xab.., jobId 1, epoch 0, reason dropout, amount 0.05 ETH, ...".
    A token job's amounts are in its token (`unit`), except slashes: staked ether."""
    fmt = unit.format if unit and e.name != "Slashed" else format_eth
    shown = ((k, v) for k, v in e.args.items() if k not in HIDDEN_ARGS)
    return f"{e.name}: " + ", ".join(f"{k} {_arg_text(k, v, fmt)}" for k, v in shown)


@job.command("watch")
@click.argument("job_id", type=int)
@click.option("--from-block", type=int, default=0, show_default=True)
@click.option("--follow/--no-follow", default=True, help="Keep polling until the job ends.")
@click.option("--poll", type=float, default=1.0, show_default=True, help="Seconds between polls.")
@click.option("--web", is_flag=True, help="Serve the job's page on localhost instead.")
@click.option(
    "--port", type=int, default=8765, show_default=True, help="Port of --web (0: a free one)."
)
@click.option(
    "--metrics",
    "metrics",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="A member's node data dir or metrics.jsonl, for --web's loss curve (repeatable).",
)
@pass_ctx
def job_watch(
    ctx: Ctx,
    job_id: int,
    from_block: int,
    follow: bool,
    poll: float,
    web: bool,
    port: int,
    metrics: tuple[Path, ...],
) -> None:
    """Print the job's events as they happen (amounts in ETH, local times, slash reasons by
    name; --json keeps the raw values). Example: dtrain job watch 1 --no-follow

    --web serves a page of the job instead (epochs, members, payouts, slashes and, from the
    members' --metrics, the loss curve), refreshed every few seconds, until Ctrl-C. Example:
    dtrain job watch 1 --web --metrics op1 --metrics op2"""
    if metrics and not web:
        raise click.UsageError("--metrics needs --web")
    bsm = ctx.bsm(signing=False)
    if web:
        _serve_job_page(ctx, bsm, job_id, port, metrics)
        return
    bsm.job(job_id)  # unknown job: error before waiting
    unit = _job_unit(bsm, job_id)
    done = {"flag": False}

    def ended() -> bool:
        return done["flag"]

    def show(e: Any) -> None:
        if e.name in ("JobCompleted", "JobFailed", "JobCancelled", "JobAborted"):
            done["flag"] = True
        args = {k: ("0x" + v.hex() if isinstance(v, bytes) else v) for k, v in e.args.items()}
        emit(
            ctx, {"event": e.name, "block": e.block, **args}, f"[{e.block}] {_event_text(e, unit)}"
        )

    if not follow:
        for e in bsm.events(from_block, "latest", JOB_EVENTS, job_id):
            show(e)
        return
    if bsm.job(job_id).state.status.is_ended:
        for e in bsm.events(from_block, "latest", JOB_EVENTS, job_id):
            show(e)
        return
    for e in bsm.watch(from_block, JOB_EVENTS, job_id, poll, stop=ended):
        show(e)


def _serve_job_page(ctx: Ctx, bsm: BSM, job_id: int, port: int, metrics: tuple[Path, ...]) -> None:
    from .jobpage import JobPage, JobPageServer

    server = JobPageServer(JobPage(bsm, job_id, metrics), port=port)
    try:  # a Ctrl-C right after the URL is printed stops as cleanly as a later one
        emit(ctx, {"url": server.url}, f"job {job_id}: {server.url} (Ctrl-C stops)")
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo(f"stopped serving the page of job {job_id}", err=True)
    finally:
        server.server_close()


# ---------------------------------------------------------------------- rewards


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


# ---------------------------------------------------------------------- helpers and main


# ---------------------------------------------------------------------- token


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
    from .devtoken import TestUSD

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
    from .devtoken import TestUSD

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


def _address(text: str, flag: str) -> str:
    if not Web3.is_address(text):
        raise ConfigError(f"{flag} {text!r} is not an address")
    return Web3.to_checksum_address(text)


def _hex32(text: str, flag: str) -> bytes:
    body = text.removeprefix("0x")
    try:
        raw = bytes.fromhex(body)
    except ValueError:
        raise click.BadParameter("not hex", param_hint=flag) from None
    if len(raw) != 32:
        raise click.BadParameter(f"expected 32 bytes, got {len(raw)}", param_hint=flag)
    return raw


def _key_address(ctx: Ctx) -> str:
    if not ctx.key:
        raise ConfigError("give an ADDRESS or --key")
    return load_key(ctx.key).address


def _load_plugins() -> None:
    """Each `dtrain.cli` entry point is a function that adds commands to the CLI."""
    for ep in entry_points(group="dtrain.cli"):
        try:
            ep.load()(cli)
        except ImportError as exc:  # an extra that is not fully installed
            click.echo(f"warning: commands {ep.name!r} unavailable: {exc}", err=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    negative = next((a for a in args if re.match(r"-[0-9.]", a)), None)
    if negative is not None:
        # Click would read "-1ether" as options (-1 -e -t -h ...), so name the problem here.
        click.echo(f"error: cannot read amount {negative!r}: amounts are never negative", err=True)
        return 2
    _load_plugins()
    if not debug:
        _quiet_library_logs()
    try:
        cli.main(args=args, prog_name="dtrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except DtrainError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        return 1
    except (requests.exceptions.RequestException, OSError) as exc:
        if debug:
            raise
        click.echo(f"error: RPC unreachable ({type(exc).__name__})", err=True)
        return 1
    except Exception as exc:
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        first = first if len(first) <= 300 else first[:300] + "..."
        click.echo(f"error: {type(exc).__name__}: {first} (rerun with --debug)", err=True)
        return 1
    return 0


def _quiet_library_logs() -> None:
    """Libraries' log records (libp2p logs each failed dial as an error) stay out of the
    terminal: without a handler Python prints WARNING and above to stderr. Commands say what
    went wrong in their one error line; `--debug` shows everything. A command that logs (`dtrain
    node run`) installs its own handlers."""
    import logging

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


__all__ = ["cli", "connect", "main"]

if __name__ == "__main__":
    sys.exit(main())

"""`dtrain`: the command line over the SDK.

Global options (or env vars DTRAIN_RPC_URL, DTRAIN_CONTRACT, DTRAIN_KEY, or a TOML file given
by --config / DTRAIN_CONFIG with keys rpc_url, contract, key) pick the chain, the contract and
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from enum import Enum
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import click
import requests

from .chain import LocalChain
from .client import BSM, JOB_EVENTS, connect, load_key
from .errors import ConfigError, DtrainError
from .models import JobSpec, Method, Params
from .units import format_eth, parse_amount, parse_duration

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
            raise ConfigError("no RPC URL: pass --rpc-url or set DTRAIN_RPC_URL")
        if not self.contract:
            raise ConfigError("no contract: pass --contract or set DTRAIN_CONTRACT")
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
    click_ctx.obj = Ctx(
        rpc_url=rpc_url or conf.get("rpc_url"),
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
@pass_ctx
def chain_up(ctx: Ctx, accounts: int, balance: int) -> None:
    """Start anvil on a free loopback port; print its URL and funded keys; run until Ctrl-C."""
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    with LocalChain(accounts=accounts, balance_ether=balance) as c:
        data = {"url": c.url, "accounts": [asdict(a) for a in c.accounts]}
        lines = [f"anvil listening on {c.url}"] + [
            f"  {a.address}  key {a.key}" for a in c.accounts
        ]
        emit(ctx, data, "\n".join(lines))
        sys.stdout.flush()
        try:
            while not stop["now"] and c.running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass


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
    help="Cap on a finalizer's reward from one epoch's slashes (the rest goes to the treasury).",
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
    )
    bsm = BSM.deploy(ctx.rpc_url, account, params)
    emit(ctx, {"address": bsm.address, "chain_id": bsm.chain_id}, bsm.address)


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
@click.option("--peer-key", required=True, help="Ed25519 public key of the libp2p identity.")
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
    """Show an operator (default: the --key account). Example: dtrain operator info 0xabc..."""
    bsm = ctx.bsm(signing=False)
    addr = address or _key_address(ctx)
    o = bsm.operator(addr)
    human = "\n".join(
        [
            f"operator    {o.address}",
            f"registered  {o.registered}",
            f"self-stake  {format_eth(o.self_stake)} ({format_eth(o.bonded)} bonded to seats)",
            f"pool        {format_eth(o.pool.total_assets if o.pool else 0)}",
            f"active jobs {o.active_jobs}",
            f"min price   {format_eth(o.min_price_per_epoch)}",
            f"peer key    0x{o.peer_key.hex()}",
            f"addresses   {', '.join(o.multiaddrs) or '-'}",
            f"hardware    {o.hardware or '-'}",
        ]
    )
    emit(ctx, o, human)


# ---------------------------------------------------------------------- stake


@cli.group("stake")
def stake_group() -> None:
    """Delegate stake to operators."""


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
            emit(ctx, {"tx": rc.tx_hash}, self.done.format(**shown))

        command = pass_ctx(send)
        for a in reversed(self.args.split()):
            command = TX_ARGS[a](command)
        self.group.command(self.name, help=TX_HELP[self.name])(command)


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
    "withdraw": "Credit unbonded stake once unlocked (then `dtrain rewards withdraw`).",
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
    if low < MIN_OPERATORS:
        raise click.BadParameter(
            f"a job needs at least {MIN_OPERATORS} operators (votes are checked by a 2/3 "
            f"quorum of its members), got {low}",
            param_hint="--operators",
        )
    if high < low:
        raise click.BadParameter(f"MAX {high} is below MIN {low}", param_hint="--operators")
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
    "--sync", "sync_interval", default=10, show_default=True, help="DeMo sync every K steps."
)
@click.option(
    "--operators",
    "operators_range",
    default="2:3",
    show_default=True,
    help="MIN:MAX operators (MIN at least 2).",
)
@click.option("--price", type=AMOUNT, required=True, help="Price per operator-epoch.")
@click.option(
    "--seat-bond",
    type=AMOUNT,
    default=None,
    help="Self-stake each member bonds for its seat while in the job "
    "[default: the deployment's minimum seat bond].",
)
@click.option("--epoch-duration", type=DURATION, default="1h", show_default=True)
@click.option("--model-hash", default="0x" + "00" * 32, help="Model config or base checkpoint.")
@click.option("--model-uri", default="")
@click.option("--dataset-hash", default="0x" + "00" * 32)
@click.option("--dataset-uri", default="")
@click.option("--topk", default=4, show_default=True, help="Top-k values per DCT chunk.")
@click.option("--quant-bits", type=click.Choice(["1", "2"]), default="2", show_default=True)
@click.option("--tee", is_flag=True, help="Require TEE-attested operators.")
@pass_ctx
def job_submit(
    ctx: Ctx,
    method: str,
    epochs: int,
    steps: int,
    sync_interval: int,
    operators_range: str,
    price: int,
    seat_bond: int | None,
    epoch_duration: int,
    model_hash: str,
    model_uri: str,
    dataset_hash: str,
    dataset_uri: str,
    topk: int,
    quant_bits: str,
    tee: bool,
) -> None:
    """Create a job, escrowing price x max operators x epochs.

    Each member bonds --seat-bond of its self-stake while in the job.
    """
    lo, hi = _operators(operators_range)
    bsm = ctx.bsm()
    spec = JobSpec(
        price_per_operator_epoch=price,
        total_epochs=epochs,
        steps_per_epoch=steps,
        sync_interval=sync_interval,
        min_operators=lo,
        max_operators=hi,
        method=Method[method.upper()],
        model_hash=_hex32(model_hash, "--model-hash"),
        model_uri=model_uri,
        dataset_hash=_hex32(dataset_hash, "--dataset-hash"),
        dataset_uri=dataset_uri,
        topk_per_chunk=topk,
        quant_bits=int(quant_bits),
        epoch_duration=epoch_duration,
        tee_required=tee,
        seat_bond=seat_bond or bsm.params().min_seat_bond,
    )
    job_id = bsm.create_job(spec)
    emit(
        ctx,
        {"job_id": job_id, "escrow": spec.escrow, "seat_bond": spec.seat_bond},
        f"job {job_id} created, {format_eth(spec.escrow)} escrowed, "
        f"{format_eth(spec.seat_bond)} seat bond",
    )


def _job_lines(j: Any) -> str:
    s, st = j.spec, j.state
    lines = [
        f"job {j.id}  {s.method.name}  {st.status.name.lower()}",
        f"  caller      {st.caller}",
        f"  epoch       {st.epoch} of {s.total_epochs}  (attempt {st.attempt}, "
        f"failed {st.failed_epochs})",
        f"  members     {len(j.members)} (min {s.min_operators}, max {s.max_operators}), "
        f"{len(j.pending_joins)} joining",
        f"  votes       {j.committed} committed, {j.revealed} revealed",
    ]
    if j.deadline:
        lines.append(f"  deadlines   commit {_when(j.deadline)}, reveal {_when(j.reveal_deadline)}")
    return "\n".join(
        [
            *lines,
            f"  price       {format_eth(s.price_per_operator_epoch)} per operator-epoch",
            f"  seat bond   {format_eth(s.seat_bond)} of each member's self-stake",
            f"  escrow      {format_eth(st.escrow)} unearned",
            f"  checkpoint  0x{st.checkpoint.hex()}",
        ]
    )


def _when(ts: int) -> str:
    """A unix time as UTC and as itself (block times are compared to it)."""
    return f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(ts))} UTC ({ts})"


@job.command("status")
@click.argument("job_id", type=int)
@pass_ctx
def job_status(ctx: Ctx, job_id: int) -> None:
    """Show a job's spec, epoch, members and escrow. Example: dtrain job status 1"""
    j = ctx.bsm(signing=False).job(job_id)
    emit(ctx, j, _job_lines(j))


@job.command("list")
@pass_ctx
def job_list(ctx: Ctx) -> None:
    """List every job. Example: dtrain --json job list"""
    jobs = ctx.bsm(signing=False).jobs()
    human = "\n".join(
        f"{j.id:>4}  {j.spec.method.name:<4}  {j.state.status.name.lower():<9}  "
        f"epoch {j.state.epoch}/{j.spec.total_epochs}  members {len(j.members)}"
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
    """End an open job; its escrow is credited back to its caller.

    The caller may cancel its open job at any time. Anyone may end a job that started and has
    since waited the deployment's open timeout for members (it then fails).

    Example: dtrain job cancel 1
    """
    rc = ctx.bsm().cancel_job(job_id)
    if rc.all("JobFailed"):
        refund = rc.first("JobFailed").args["refund"]
        human = (
            f"job {job_id} failed: it waited the open timeout for members; "
            f"{format_eth(refund)} of escrow credited to its caller"
        )
        outcome = "failed"
    else:
        refund = rc.first("JobCancelled").args["refund"]
        human = f"job {job_id} cancelled; {format_eth(refund)} of escrow credited, see rewards"
        outcome = "cancelled"
    emit(ctx, {"tx": rc.tx_hash, "status": outcome, "refund": refund}, human)


@job.command("finalize")
@click.argument("job_id", type=int)
@pass_ctx
def job_finalize(ctx: Ctx, job_id: int) -> None:
    """Settle the job's current epoch (anyone; earns slash bounties).

    Example: dtrain job finalize 1
    """
    bsm = ctx.bsm()
    epoch = bsm.job(job_id).state.epoch
    rc = bsm.finalize_epoch(job_id, epoch)
    shown = ("EpochFinalized", "EpochFailed", "Slashed", "JobAborted", "JobCompleted", "JobFailed")
    names = [e.name for e in rc.events if e.name in shown]
    emit(ctx, {"tx": rc.tx_hash, "events": names}, f"epoch {epoch} settled: {', '.join(names)}")


@job.command("watch")
@click.argument("job_id", type=int)
@click.option("--from-block", type=int, default=0, show_default=True)
@click.option("--follow/--no-follow", default=True, help="Keep polling until the job ends.")
@click.option("--poll", type=float, default=1.0, show_default=True, help="Seconds between polls.")
@pass_ctx
def job_watch(ctx: Ctx, job_id: int, from_block: int, follow: bool, poll: float) -> None:
    """Print the job's events as they happen. Example: dtrain job watch 1 --no-follow"""
    bsm = ctx.bsm(signing=False)
    bsm.job(job_id)  # unknown job: error before waiting
    done = {"flag": False}

    def ended() -> bool:
        return done["flag"]

    def show(e: Any) -> None:
        if e.name in ("JobCompleted", "JobFailed", "JobCancelled", "JobAborted"):
            done["flag"] = True
        args = {k: ("0x" + v.hex() if isinstance(v, bytes) else v) for k, v in e.args.items()}
        emit(
            ctx,
            {"event": e.name, "block": e.block, **args},
            f"[{e.block}] {e.name} " + " ".join(f"{k}={v}" for k, v in args.items()),
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


# ---------------------------------------------------------------------- rewards


@cli.group()
def rewards() -> None:
    """Credits, staking rewards and withdrawals."""


@rewards.command("show")
@click.argument("address", required=False)
@click.option("--operator", "operators", multiple=True, help="Pools to show pending rewards of.")
@pass_ctx
def rewards_show(ctx: Ctx, address: str | None, operators: tuple[str, ...]) -> None:
    """Show wallet balance, claimable credit and pending pool rewards.

    Example: dtrain rewards show 0xabc... --operator 0xdef...
    """
    bsm = ctx.bsm(signing=False)
    b = bsm.balances(address or _key_address(ctx), operators)
    lines = [
        f"account  {b.address}",
        f"wallet   {format_eth(b.wallet)}",
        f"credit   {format_eth(b.credit)} (withdraw with `dtrain rewards withdraw`)",
    ]
    lines += [f"pending  {format_eth(v)} from pool of {k}" for k, v in b.pending_rewards.items()]
    emit(ctx, b, "\n".join(lines))


@rewards.command("withdraw")
@click.option("--claim", "claim_from", multiple=True, help="Claim pool rewards first (repeatable).")
@pass_ctx
def rewards_withdraw(ctx: Ctx, claim_from: tuple[str, ...]) -> None:
    """Claim pool rewards (optional) and withdraw all credit. Example: dtrain rewards withdraw"""
    bsm = ctx.bsm()
    for op in claim_from:
        bsm.claim_rewards(op)
    amount = bsm.credit_of(bsm.sender)
    rc = bsm.withdraw()
    emit(ctx, {"tx": rc.tx_hash, "amount": amount}, f"withdrew {format_eth(amount)}")


# ---------------------------------------------------------------------- helpers and main


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
        click.echo(f"error: {type(exc).__name__}: {exc} (rerun with --debug)", err=True)
        return 1
    return 0


__all__ = ["cli", "connect", "main"]

if __name__ == "__main__":
    sys.exit(main())

"""`dtrain job submit`: checks, pins, dry run and creation of a job."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import click

from .. import estimate, pins
from ..client import BSM, load_key
from ..errors import ConfigError, InsufficientFunds
from ..models import TOPK_MAX, JobSpec, Method, coverage, default_topk
from ..recipe import Recipe
from ..units import format_eth
from .job import job
from .refs import DEFAULT_CACHE, DEFAULT_MODEL, References, Wanted, pin_job
from .root import AMOUNT, DURATION, EXAMPLES, Ctx, _price, _TokenUnit, emit, pass_ctx
from .submit_serve import (
    ANY_HOST,
    Listen,
    _buy_job,
    _check_host,
    _gateway_terms,
    _serve_until_ended,
    _start_serving,
)

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
    default=DEFAULT_MODEL,
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
    help="The dataset file (a text corpus, or JSONL for SFT/DPO/GRPO): an absolute path the "
    "operators read, or its p2p:...#sha256=... or https://...#sha256=... URI (fetched here by "
    "that hash and checked; see --serve).",
)
@click.option(
    "--dataset-hash",
    default=None,
    help="Pin this sha256 instead of reading --dataset-uri here (a file only operators have; "
    "the dataset is then not checked).",
)
@click.option(
    "--topk",
    type=int,
    default=None,
    help="Top-k values per DCT chunk [default: enough for coverage 1 an epoch, at least 4 up "
    "to 4 operators and 6 above, within the gossip limit].",
)
@click.option("--quant-bits", type=click.Choice(["1", "2"]), default="1", show_default=True)
@click.option("--tee", is_flag=True, help="Require TEE-attested operators.")
@click.option(
    "--recipe",
    "recipe_path",
    default=None,
    help="A recipe TOML (batch size, learning rates, outer step, DPO/GRPO settings, seed): an "
    "absolute path the operators read, or a p2p: or https: URI with #sha256= (fetched here); its "
    "hash is pinned [default: the reference recipe].",
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
    "--host",
    default=ANY_HOST,
    show_default=True,
    help="With --serve: the IP address to listen on, named in the job's p2p: URIs "
    f"({ANY_HOST}: every interface, named by this machine's address on its default route).",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=DEFAULT_CACHE,
    show_default=True,
    help="Where p2p: and https: references are fetched to be checked (by sha256), and where "
    "--serve packs folders; `dtrain data serve`'s, so a folder it serves is read from there.",
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
    host: str,
    cache_dir: Path,
    x402_url: str | None,
    dry_run: bool,
) -> None:
    """Create a job, escrowing price x max operators x epochs.

    The model and dataset hashes are computed from --model-uri and --dataset-uri (and
    printed), unless given; so is the recipe's, from --recipe. A p2p: or https: reference is
    fetched by its #sha256= first and checked like a local file. Each member bonds --seat-bond of
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
    if host != ANY_HOST and not serve:
        raise click.UsageError("--host goes with --serve")
    _check_host(host)
    for flag, uri, pinned in (
        ("--model-uri", model_uri, bool(model_hash)),
        ("--dataset-uri", dataset_uri, bool(dataset_hash)),
        ("--recipe", recipe_path or "", False),
    ):
        _refuse_relative_path(flag, uri, serve, pinned)
    price_units = 0 if token or x402_url else _price(price, None)
    lo, hi = _operators(operators_range)
    syncs = steps // sync_interval
    topk_per_chunk = default_topk(hi, syncs) if topk is None else topk
    wanted = Wanted(
        method,
        model_uri,
        dataset_uri,
        recipe_path or "",
        model_hash,
        dataset_hash,
        (topk_per_chunk, int(quant_bits), hi),
        fit_topk=topk is None,
    )
    bsm = ctx.bsm() if x402_url is None else None
    if bsm is not None and not token:  # the escrow in ether: refused before the model loads
        _check_funds(bsm, price_units * hi * epochs, hi, epochs)
    with References(cache_dir) as refs:  # a dry run of the job as the nodes will build it
        pinned = pin_job(refs, wanted)
    recipe, recipe_pin, data_summary = pinned.recipe, pinned.recipe_hash, pinned.summary
    if recipe is not None and recipe.demo_mode == "paper" and sync_interval != 1:
        raise ConfigError(
            f"--sync {sync_interval}: the recipe's demo_mode 'paper' syncs every step "
            "(submit it with --sync 1)"
        )
    model_pin, data_pin = pinned.model, pinned.dataset
    if pinned.sync is not None:  # a default top-k lowered to fit the gossip limit
        topk_per_chunk = pinned.sync["topk"]
    sync_line, sync_json = _sync_summary(topk_per_chunk, syncs, hi, sync_interval, pinned.sync)
    server = None
    if serve and not dry_run:  # hashes above come from the local files; the job names p2p URIs
        server, model_uri, dataset_uri, recipe_path = _start_serving(
            model_uri, dataset_uri, recipe_path or "", Listen(host, serve_port, cache_dir)
        )
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
        topk_per_chunk=topk_per_chunk,
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
        checked = Checked(data_summary, sync_line, sync_json)
        _show_dry_run(ctx, spec, unit, checked, gas, serve, x402_url, forecast)
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
            "model_uri": spec.model_uri,
            "model_hash": "0x" + model_pin.hex(),
            "dataset_uri": spec.dataset_uri,
            "dataset_hash": "0x" + data_pin.hex(),
            "dataset_summary": data_summary,
            "recipe_hash": "0x" + recipe_pin.hex(),
            "recipe_uri": spec.recipe_uri,
            "estimate": forecast[1],
            "sync": sync_json,
        },
        f"job {job_id} created, {fmt(spec.escrow)} escrowed, "
        f"{format_eth(spec.seat_bond)} seat bond\n"
        f"  model    {model_uri}  0x{model_pin.hex()}\n"
        f"  dataset  {dataset_uri}  0x{data_pin.hex()} (sha256)"
        + (f", {data_summary}" if data_summary else "")
        + (f"\n  recipe   {recipe_path}  0x{recipe_pin.hex()}" if recipe_path else "")
        + f"\n  sync     {sync_line}"
        + f"\n{forecast[0]}",
    )
    if server is not None:
        _serve_until_ended(ctx, server, bsm, job_id)


@dataclass(frozen=True)
class Checked:
    """What checking the job's inputs found: the dataset's summary and the members' sync."""

    summary: str
    sync_line: str
    sync: dict[str, Any]


def _sync_summary(
    topk: int, syncs: int, seats: int, interval: int, checked: dict[str, int] | None
) -> tuple[str, dict[str, Any]]:
    """The job's sync as `job submit` states it: top-k per chunk, the coverage an epoch reaches
    (how many times over each coefficient of a chunk is sent), and, where the node package
    checked the model, a member's upload per step against a bf16 ring all-reduce's."""
    cover = coverage(topk, syncs)
    out: dict[str, Any] = dict(topk_per_chunk=topk, syncs_per_epoch=syncs, coverage=cover)
    line = f"top-k {topk} per 64x64 chunk, {syncs} syncs an epoch: coverage {cover:.2f}"
    if checked is not None and checked["packet_bytes"] > 0:
        per_step = checked["packet_bytes"] / interval
        ring = 4 * (seats - 1) / seats * checked["params"] if seats > 1 else 0.0
        out |= dict(packet_bytes=checked["packet_bytes"], less_than_bf16_ring=ring / per_step)
        line += f", {checked['packet_bytes']:,} bytes a sync"
        if ring:
            line += f" ({ring / per_step:,.0f}x less upload per step than a bf16 ring)"
    return line, out


def _forecast(
    bsm: BSM | None, spec: JobSpec, recipe: Recipe | None, fmt: Callable[[int], str]
) -> tuple[str, dict[str, Any]]:
    """`job submit`'s estimate of the job's time and cost (dtrain.estimate), and the recipe's
    schedule over the job's inner steps: summary lines and their JSON."""
    params = bsm.params() if bsm is not None else None
    speed = estimate.past_speed(bsm, spec.model_hash) if bsm is not None else None
    est = estimate.estimate(spec, params, speed)
    text = estimate.describe(est, spec, params, fmt)
    note = estimate.schedule_note(recipe, spec)
    return (f"{note}\n{text}" if note else text), est.as_dict()


def _show_dry_run(
    ctx: Ctx,
    spec: JobSpec,
    unit: _TokenUnit | None,
    checked: Checked,
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
        verified = "the gateway checks it when paid"
    elif gas:
        verified = f"the contract accepts it, {gas:,} gas"
    else:  # a token job whose allowance is short: the approval would come first
        verified = "the escrow's approval comes first, then the contract's checks"
    bond = format_eth(spec.seat_bond) if spec.seat_bond else "the deployment's minimum"
    human = (
        f"dry run: nothing sent; the job would be created as follows ({verified}){served}\n"
        f"  model    {spec.model_uri}  0x{spec.model_hash.hex()}\n"
        f"  dataset  {spec.dataset_uri}  0x{spec.dataset_hash.hex()} (sha256)"
        + (f", {checked.summary}" if checked.summary else "")
        + f"\n  recipe   {recipe_uri}  0x{spec.recipe_hash.hex()}\n"
        f"  escrow   {fmt(spec.escrow)} = {fmt(spec.price_per_operator_epoch)} x "
        f"{spec.max_operators} operators x {spec.total_epochs} epoch(s), paid by {payer}\n"
        f"  seat bond {bond} of each member's self-stake\n"
        f"  sync     {checked.sync_line}\n{forecast[0]}"
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
        "dataset_summary": checked.summary,
        "recipe_uri": spec.recipe_uri,
        "recipe_hash": "0x" + spec.recipe_hash.hex(),
        "gas": gas,
        "serve": serve,
        "x402": x402_url,
        "estimate": forecast[1],
        "sync": checked.sync,
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
    if topk is not None and not 1 <= topk <= TOPK_MAX:
        raise ConfigError(
            f"--topk must be in [1, {TOPK_MAX}] (a 64x64 DCT chunk's coefficients), got {topk}"
        )


def _check_funds(bsm: BSM, escrow: int, operators: int, epochs: int) -> None:
    """InsufficientFunds, in one line, when the key cannot escrow the job in ether."""
    has = bsm.w3.eth.get_balance(bsm.sender)
    if has < escrow:
        raise InsufficientFunds(
            f"the job escrows {format_eth(escrow)} (--price x {operators} operators x {epochs} "
            f"epochs) plus gas; account {bsm.sender} has {format_eth(has)}: send it ETH or use "
            "a funded key (`dtrain chain up` prints some)"
        )


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

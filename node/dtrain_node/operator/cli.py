"""`dtrain node run` and `dtrain job fetch`, added to the SDK's CLI when the node is installed."""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

import click

from dtrain.cli import AMOUNT, Ctx, emit
from dtrain.errors import ConfigError


def register(root: click.Group) -> None:
    root.add_command(node)
    job = root.commands.get("job")
    if isinstance(job, click.Group):
        job.add_command(fetch)


@click.group()
def node() -> None:
    """Run the reference operator node."""


@node.command("run")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Keys, checkpoints, round state and metrics.jsonl live here.",
)
@click.option(
    "--listen", default="/ip4/127.0.0.1/tcp/0", show_default=True, help="libp2p listen multiaddr."
)
@click.option("--job", "job_id", type=int, help="Job to join.")
@click.option(
    "--auto",
    is_flag=True,
    help="Join the first open job that pays our ask and that we can finish in time.",
)
@click.option(
    "--stake", type=AMOUNT, default="1ether", show_default=True, help="Self-stake when registering."
)
@click.option("--min-price", type=AMOUNT, default="0", help="Lowest price per epoch accepted.")
@click.option(
    "--step-seconds",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="Our seconds per training step: --auto skips jobs whose epochs are too short for it.",
)
@click.option("--batch-size", default=8, show_default=True)
@click.option(
    "--round-deadline",
    type=float,
    default=20.0,
    show_default=True,
    help="Seconds to wait for all members' packets in a sync round.",
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help=(
        "Misbehave on purpose (repeatable): fabricate, no-reveal (commit, never reveal), "
        "garbage, stop-sync=N, offline=N, "
        "attack=KIND with KIND poison, scale=X, signflip, noise, stale or copy (copy re-sends "
        "another member's packet of the previous round), scoped by epoch=E and once."
    ),
)
@click.option(
    "--linger",
    type=float,
    default=0.0,
    help="Seconds to keep serving checkpoints after the job ends.",
)
@click.option("--no-withdraw", is_flag=True, help="Leave earnings as credit.")
@click.pass_obj
def node_run(
    ctx: Ctx,
    data_dir: Path,
    listen: str,
    job_id: int | None,
    auto: bool,
    stake: int,
    min_price: int,
    step_seconds: float,
    batch_size: int,
    round_deadline: float,
    faults: tuple[str, ...],
    linger: float,
    no_withdraw: bool,
) -> None:
    """Register, join, train with DeMo over gossip, commit and reveal checkpoints, get paid.

    Ctrl-C once leaves the job after this epoch; twice stops now.

    Example: dtrain --key 0x... node run --data-dir ./op1 --job 1
    """
    from dtrain_node.operator.faults import Faults
    from dtrain_node.operator.node import Node, NodeConfig

    try:
        parsed = Faults.parse(list(faults))
    except ValueError as exc:
        raise ConfigError(f"--fault: {exc}") from None
    if not (ctx.rpc_url and ctx.contract and ctx.key):
        raise ConfigError("node run needs --rpc-url, --contract and --key")
    if (job_id is None) == (not auto):
        raise click.UsageError("give exactly one of --job ID or --auto")
    _logging(data_dir)
    cfg = NodeConfig(
        key=ctx.key,
        rpc_url=ctx.rpc_url,
        contract=ctx.contract,
        data_dir=data_dir,
        listen=listen,
        job_id=job_id,
        auto=auto,
        stake=stake,
        min_price=min_price,
        step_s=step_seconds,
        batch_size=batch_size,
        round_deadline_s=round_deadline,
        faults=parsed,
        withdraw=not no_withdraw,
        linger_s=linger,
    )
    runner = Node(cfg)
    runner.install_signals()
    result = runner.run()
    emit(ctx, result, " ".join(f"{k}={v}" for k, v in result.items()))


def _logging(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [logging.FileHandler(data_dir / "node.log")]
    if sys.stderr.isatty():
        from rich.logging import RichHandler

        handlers.append(RichHandler(show_path=False))
    else:
        handlers.append(logging.StreamHandler(sys.stderr))
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(name)s %(message)s",
        handlers=handlers,
        force=True,
    )


@click.command("fetch")
@click.argument("job_id", type=int)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Directory for the Hugging Face export.",
)
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.pass_obj
def fetch(ctx: Ctx, job_id: int, out: Path, timeout: float) -> None:
    """Fetch a completed job's final checkpoint from its operators, verify it against the
    on-chain hash and export it in Hugging Face format.

    Example: dtrain job fetch 1 --out ./model
    """
    from dtrain_node.operator.fetch import fetch_final

    bsm = ctx.bsm(signing=False)
    with tempfile.TemporaryDirectory(prefix="dtrain-fetch-") as tmp:
        t0 = time.monotonic()
        path, digest = fetch_final(bsm, job_id, out, Path(tmp), timeout)
    emit(
        ctx,
        {"job_id": job_id, "out": str(path), "checkpoint": digest.hex()},
        f"job {job_id}: checkpoint 0x{digest.hex()} verified, exported to {path} "
        f"in {time.monotonic() - t0:.1f}s",
    )


__all__ = ["register"]

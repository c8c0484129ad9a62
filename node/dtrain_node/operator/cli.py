"""`dtrain node run` and `dtrain job fetch`, added to the SDK's CLI when the node is installed."""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from dtrain.cli import AMOUNT, Ctx, emit
from dtrain.errors import ConfigError
from dtrain.inputs import parse_duration

DEFAULT_LINGER = "1h"  # how long `node run` serves the final checkpoint after the job
DEFAULT_KEEP_FINAL = "7d"  # and for its caller, until the caller's receipt, at most
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(message)s"  # one timestamp per line
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class Seconds(click.ParamType):
    """Seconds as a number ("90", "0.5") or a duration ("30m", "2h", "1d")."""

    name = "duration"

    def convert(self, value: Any, param: Any, ctx: Any) -> float:
        if isinstance(value, int | float):
            return float(value)
        try:
            return float(value)
        except ValueError:
            pass
        try:
            return float(parse_duration(value))
        except Exception as exc:  # every bad value is a usage error
            self.fail(f"{value!r}: give seconds or a duration such as 30m, 2h or 1d ({exc})")


def register(root: click.Group) -> None:
    root.add_command(node)
    job = root.commands.get("job")
    if isinstance(job, click.Group):
        job.add_command(fetch)
    data_group = root.commands.get("data")  # the SDK's `data` group, if it has one
    if not isinstance(data_group, click.Group):
        data_group = data
        root.add_command(data)
    data_group.add_command(data_serve)
    model_group = root.commands.get("model")
    if isinstance(model_group, click.Group):
        model_group.add_command(model_init)
    from dtrain_node.gateway.cli import gateway
    from dtrain_node.operator.attest_cli import register as register_attest
    from dtrain_node.serve import cli as serve_cli

    root.add_command(serve_cli.command(_fetch_final))
    root.add_command(gateway)
    register_attest(root)


def _fetch_final(
    bsm: Any, job_id: int, out: Path, work: Path, timeout: float
) -> tuple[Path, bytes]:
    # imported when a server fetches, not whenever the CLI starts (it loads torch)
    from dtrain_node.operator.fetch import fetch_final

    return fetch_final(bsm, job_id, out, work, timeout)


@click.command("init")
@click.argument("arch", type=click.Choice(["gpt2", "llama"]))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, help="Initialisation seed.")
def model_init(arch: str, out: Path, seed: int) -> None:
    """Write a small random-initialised ARCH model folder to OUT (a from_pretrained layout with
    a BPE tokenizer trained on this machine's Python sources and a chat template): to try a job
    on a model folder offline. A real job names your own folder or hf://org/name@revision."""
    from dtrain_node.train.start import model_hash
    from dtrain_node.train.toy_models import save

    if out.exists() and any(out.iterdir()):
        raise click.ClickException(f"{out} exists and is not empty: choose a new folder")
    save(arch, out, seed=seed)
    click.echo(f"wrote a toy {arch} model to {out}  (model hash 0x{model_hash(str(out)).hex()})")


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
@click.option(
    "--min-price",
    type=AMOUNT,
    default=None,
    help="Our ask in ether per operator-epoch, set on chain at start when it differs "
    "[default: keep the on-chain ask; 0 when registering].",
)
@click.option(
    "--step-seconds",
    type=click.FloatRange(min=0),
    default=0.5,
    show_default=True,
    help="Our seconds per training step (the time measured on the job counts when longer): "
    "jobs whose epochs are too short for it are refused.",
)
@click.option("--batch-size", default=8, show_default=True)
@click.option(
    "--round-deadline",
    type=float,
    default=20.0,
    show_default=True,
    help=(
        "Seconds a sync round waits for members that are gone (4x in an epoch's first round); "
        "live members not yet in the round are waited for up to the round's share of the "
        "epoch's time, and the epoch's transcript is agreed at its end (docs/protocol.md 4.5)."
    ),
)
@click.option(
    "--fault",
    "faults",
    multiple=True,
    help=(
        "Misbehave on purpose (repeatable): fabricate, no-reveal (commit, never reveal), "
        "garbage, stop-sync=N, offline=N, "
        "attack=KIND with KIND poison, scale=X, signflip, noise, stale or copy (copy re-sends "
        "another member's packet of the previous round), ahead (no training, every round "
        "committed before the others), slow=X (an honest machine X times slower), "
        "equivocate=N (two commitments in round N), withhold=N (commit in round N, never "
        "reveal), late=N (reveal round N late, to one member only), scoped by epoch=E and once."
    ),
)
@click.option(
    "--linger",
    type=Seconds(),
    default=DEFAULT_LINGER,
    show_default=True,
    help=(
        "After the job completes, keep serving its final checkpoint this long so the caller "
        "can `dtrain job fetch` it (seconds, or 30m, 2h, 1d; 0 to exit at once). Ctrl-C ends "
        "it early."
    ),
)
@click.option(
    "--keep-final",
    type=Seconds(),
    default=DEFAULT_KEEP_FINAL,
    show_default=True,
    help=(
        "After --linger, keep serving the final checkpoint until the job's caller confirms a "
        "verified fetch (`dtrain job fetch` with the caller's key), at most this long after "
        "the job (seconds, or 30m, 2h, 7d). Ctrl-C ends it early."
    ),
)
@click.option("--no-withdraw", is_flag=True, help="Leave earnings as credit.")
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where the jobs' fetched models and datasets are kept, by sha256 (shareable between "
    "nodes) [default: DATA_DIR/cache].",
)
@click.option(
    "--device",
    type=click.Choice(["auto", "cpu", "cuda"]),
    default="auto",
    show_default=True,
    help="Where the inner steps run (auto: CUDA when present); the shared state stays on the "
    "CPU, bitwise the same as every other node's.",
)
@click.option(
    "--tee",
    is_flag=True,
    help="Join teeRequired jobs: attest first (a configfs-tsm report signed by "
    "--attestation-service, or the statement in --attestation-file) and submit it.",
)
@click.option("--attestation-service", help="URL of the attestation service (with --tee).")
@click.option(
    "--attestation-file",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="A statement saved by `dtrain attest request` (with --tee).",
)
@click.option(
    "--tsm-root",
    type=click.Path(path_type=Path, file_okay=False),
    default="/sys/kernel/config/tsm/report",
    show_default=True,
    help="configfs-tsm report directory (with --tee --attestation-service).",
)
@click.pass_obj
def node_run(
    ctx: Ctx,
    data_dir: Path,
    listen: str,
    job_id: int | None,
    auto: bool,
    stake: int,
    min_price: int | None,
    step_seconds: float,
    batch_size: int,
    round_deadline: float,
    faults: tuple[str, ...],
    linger: float,
    keep_final: float,
    no_withdraw: bool,
    cache_dir: Path | None,
    device: str,
    tee: bool,
    attestation_service: str | None,
    attestation_file: Path | None,
    tsm_root: Path,
) -> None:
    """Register, join, train with DeMo over gossip, commit and reveal checkpoints, get paid,
    then serve the final checkpoint for --linger.

    Ctrl-C (or SIGTERM) once leaves at the next safe point: at once before joining or while
    the job has not started an epoch with us (the seat and its bond are given back), after
    committing, revealing and finalizing the epoch we are a member of, at once while lingering.
    Twice stops now and says what that costs (exit status 128 + the signal's number).

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
    if tee and (attestation_service is None) == (attestation_file is None):
        raise click.UsageError("--tee needs one of --attestation-service URL or --attestation-file")
    if not tee and (attestation_service or attestation_file):
        raise click.UsageError("--attestation-service and --attestation-file need --tee")
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
        keep_final_s=keep_final,
        cache_dir=cache_dir.expanduser() if cache_dir else None,
        device=device,
        tee=tee,
        attestation_service=attestation_service,
        attestation_file=attestation_file,
        tsm_root=tsm_root,
    )
    if device == "cuda":
        from dtrain_node.train.devices import pick

        pick("cuda")  # no CUDA here: one line now, not at the first epoch
    live = terminal(data_dir)
    runner = Node(cfg)
    with live(runner.status):
        runner.install_signals()
        result = runner.run()
    emit(ctx, result, summary(result))
    if result.get("stopped"):
        sys.exit(128 + (runner.stop_signal or signal.SIGINT))
    if result.get("refused"):
        sys.exit(1)


def summary(result: dict[str, Any]) -> str:
    """The last line of `node run`."""
    if result.get("stopped"):
        return "stopped"
    if result.get("left"):
        return f"left job {result['job']}" if "job" in result else "left before joining a job"
    if result.get("refused"):
        return f"not joining job {result['job']}: {result['refused']}"
    line = f"job {result['job']} {result['status']}"
    if result.get("checkpoint") and any(bytes.fromhex(result["checkpoint"])):
        line += f", final checkpoint 0x{result['checkpoint']}"
    if "export" in result:
        line += f", exported to {result['export']}"
    return line


def terminal(data_dir: Path, tty: bool | None = None) -> Any:
    """Log to data_dir/node.log and to stderr, one timestamp per line: rich with the node's
    live progress line on a terminal, plain lines otherwise (every round one line). Returns
    a function of the node's `Status` giving the context that shows the live line."""
    from dtrain_node.operator.progress import LiveLine

    data_dir.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(data_dir / "node.log")
    to_file.setFormatter(logging.Formatter(FILE_FORMAT))
    if sys.stderr.isatty() if tty is None else tty:
        from rich.console import Console
        from rich.live import Live
        from rich.logging import RichHandler

        console = Console(stderr=True)
        term: logging.Handler = RichHandler(console=console, show_path=False)
        term.setFormatter(logging.Formatter("%(message)s"))  # rich prints the time
        term.addFilter(lambda r: not getattr(r, "progress", False))  # rounds: the live line

        def live(status: Any) -> Any:
            return Live(LiveLine(status), console=console, refresh_per_second=2, transient=True)

    else:
        term = logging.StreamHandler(sys.stderr)
        term.setFormatter(logging.Formatter(PLAIN_FORMAT, DATE_FORMAT))

        def live(status: Any) -> Any:
            return contextlib.nullcontext()

    logging.basicConfig(level=logging.INFO, handlers=[to_file, term], force=True)
    # libp2p's own errors (a dial to a peer that left) go to node.log, timestamped: the node
    # reports what matters itself. Without a handler of its own (it does not propagate) Python
    # would print each on stderr, bare.
    lib = logging.getLogger("libp2p")
    lib.handlers[:] = [to_file]
    lib.setLevel(logging.ERROR)
    return live


@click.command("fetch")
@click.argument("job_id", type=int)
@click.option(
    "--out",
    type=click.Path(path_type=Path, file_okay=False),
    required=True,
    help="Directory for the Hugging Face export.",
)
@click.option(
    "--epoch",
    type=click.IntRange(min=0),
    default=None,
    help="A finalized epoch's checkpoint (epochs count from 0, as on chain), also while the "
    "job runs "
    "[default: the completed job's final one].",
)
@click.option("--timeout", type=float, default=60.0, show_default=True)
@click.pass_obj
def fetch(ctx: Ctx, job_id: int, out: Path, epoch: int | None, timeout: float) -> None:
    """Fetch a job's checkpoint from its operators, verify it against the on-chain hash and
    export it in Hugging Face format: the completed job's final one, or --epoch N's. With the
    job's caller key (--key), a verified final checkpoint is confirmed to its holders, which
    then stop keeping it for the caller (`node run --keep-final`).

    Example: dtrain job fetch 1 --out ./model
    """
    from eth_account import Account

    from dtrain_node.operator.fetch import fetch_checkpoint

    bsm = ctx.bsm(signing=False)
    caller = Account.from_key(ctx.key) if ctx.key else None
    # FinalCheckpointUnavailable (the SDK's NotServed): one line when nobody serves it.
    with tempfile.TemporaryDirectory(prefix="dtrain-fetch-") as tmp:
        t0 = time.monotonic()
        got = fetch_checkpoint(bsm, job_id, out, Path(tmp), timeout, epoch, caller)
    digest, took = got.checkpoint.hex(), time.monotonic() - t0
    text = f"job {job_id}: checkpoint 0x{digest} verified, exported to {got.path} in {took:.1f}s"
    if epoch is not None:
        text = text.replace("checkpoint", f"epoch {epoch} checkpoint", 1)
    if got.confirmed is not None:
        text += f"; fetch confirmed to {got.confirmed} operator(s) keeping it for you"
    data = {"job_id": job_id, "out": str(got.path), "checkpoint": digest, "epoch": got.epoch}
    emit(ctx, {**data, "confirmed": got.confirmed}, text)


@node.command("recompute")
@click.argument("transcript", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option(
    "--start",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help="The epoch's start checkpoint (safetensors or canonical stream), after a job's "
    "first epoch.",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where the job's model and dataset are fetched to, verified by hash "
    "[default: ~/.dtrain/referee].",
)
@click.pass_obj
def node_recompute(ctx: Ctx, transcript: Path, start: Path | None, data_dir: Path | None) -> None:
    """Re-execute an epoch from its transcript file and compare with the checkpoint the chain
    certified for it: exit 0 if they are the same, 1 if not.

    Every member writes the file as <data-dir>/jobs/<job>/transcript-<attempt>.bin. Each of
    its packets is checked against its sender's signed commitment, then the rounds are
    applied from the epoch's start state (no training; needs no key).

    Example: dtrain node recompute ./op1/jobs/1/transcript-1.bin
    """
    from dtrain_node.errors import EpochNotReproduced
    from dtrain_node.operator import referee
    from dtrain_node.operator.config import NodeConfig
    from dtrain_node.verify import evidence

    bsm = ctx.bsm(signing=False)
    t = evidence.load(transcript)
    assert ctx.rpc_url is not None  # ctx.bsm() checked it
    data_dir = data_dir or Path.home() / ".dtrain" / "referee"
    cfg = NodeConfig("", ctx.rpc_url, bsm.address, data_dir, job_id=t.job_id)  # reads only
    v = referee.check(bsm, cfg, t, start)
    where = f"job {v.job_id} epoch {v.epoch} (attempt {v.attempt})"
    if v.certified is None:
        raise EpochNotReproduced(
            f"{where}: the transcript leads to 0x{v.recomputed.hex()}; the chain certified "
            f"no checkpoint for this attempt"
        )
    if not v.matches:
        raise EpochNotReproduced(
            f"{where}: the transcript leads to 0x{v.recomputed.hex()}, the chain certified "
            f"0x{v.certified.hex()}"
        )
    record = {"job_id": v.job_id, "epoch": v.epoch, "attempt": v.attempt}
    emit(
        ctx,
        {**record, "checkpoint": v.certified.hex()},
        f"{where}: the transcript leads to the certified checkpoint 0x{v.certified.hex()}",
    )


@node.command("referee")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where transcripts, models and datasets are fetched to and metrics.jsonl is "
    "written [default: ~/.dtrain/referee].",
)
@click.option(
    "--from-block",
    type=click.IntRange(0),
    default=0,
    show_default=True,
    help="First block whose challenges are refereed.",
)
@click.pass_obj
def node_referee(ctx: Ctx, data_dir: Path | None, from_block: int) -> None:
    """Referee challenged epochs of jobs this operator is not in, until SIGINT or SIGTERM.

    For each challenge: apply (bonding the deployment's challenge bond of free self-stake),
    fetch the epoch's transcript over p2p, re-execute it and, if drawn, commit, reveal and
    resolve the verdict. A referee off the referees' majority, or silent, is slashed. The
    --key account must be a registered operator outside the job.

    Example: dtrain node referee --data-dir ./referee
    """
    import json as _json

    from dtrain_node.operator.config import NodeConfig
    from dtrain_node.operator.referee_service import RefereeService

    bsm = ctx.bsm()
    if not bsm.operator(bsm.sender).registered:
        raise ConfigError(f"{bsm.sender} is not a registered operator: register it first")
    assert ctx.rpc_url is not None  # ctx.bsm() checked it
    data_dir = data_dir or Path.home() / ".dtrain" / "referee"
    data_dir.mkdir(parents=True, exist_ok=True)
    cfg = NodeConfig("", ctx.rpc_url, bsm.address, data_dir, auto=True)  # reads only

    def metric(kind: str, **data: Any) -> None:
        rec = {"t": round(time.time(), 3), "kind": kind, "node": bsm.sender, **data}
        with open(data_dir / "metrics.jsonl", "a") as f:
            f.write(_json.dumps(rec) + "\n")

    # force: an import that logged first left a handler (in a forked node, the server's stderr)
    logging.basicConfig(level=logging.INFO, format=PLAIN_FORMAT, datefmt=DATE_FORMAT, force=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    metric("referee_started", from_block=from_block)
    RefereeService(bsm, cfg, metric).run(stop, from_block)


@click.group()
def data() -> None:
    """Datasets and models for jobs."""


@click.command("serve")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=4100,
    show_default=True,
    help="TCP port to listen on (0: any free one).",
)
@click.option("--host", default="0.0.0.0", show_default=True, help="IP address to listen on.")
@click.option(
    "--public-ip",
    default=None,
    help="The IP the URIs name [default: --host if it is a loopback address, else this "
    "machine's address on its default route].",
)
@click.option(
    "--key-file",
    type=click.Path(path_type=Path, dir_okay=False),
    default="~/.dtrain/data-peer.key",
    show_default=True,
    help="This peer's libp2p key (created if missing): the same key keeps the URIs valid "
    "across restarts.",
)
@click.option(
    "--cache-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default="~/.dtrain/cache",
    show_default=True,
    help="Where folders are packed (as sha256/<hash>).",
)
@click.pass_obj
def data_serve(
    ctx: Ctx,
    paths: tuple[Path, ...],
    port: int,
    host: str,
    public_ip: str | None,
    key_file: Path,
    cache_dir: Path,
) -> None:
    """Serve files and model folders to a job's operators over libp2p, by sha256.

    A file (a dataset, a recipe) is served as it is; a folder (a Hugging Face model: config,
    weights, tokenizer) as a deterministic tar pack. One line per PATH gives the URI to pass to
    `job submit` (--dataset-uri, --model-uri, --recipe). Serves until Ctrl-C.

    Example: dtrain data serve ./gpt2-small ./sft.jsonl ./recipe.toml
    """
    from dtrain_node.p2p.dataserve import DataServer, serve_until, stop_signals

    logging.getLogger("libp2p").setLevel(logging.CRITICAL)
    try:
        server = DataServer(
            key_file.expanduser(), host, port, public_ip, cache_dir.expanduser() / "sha256"
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--host") from None
    with server, stop_signals() as stop:
        served = [server.add(p) for p in paths]
        for s in served:
            what = "folder, packed" if s.is_pack else "file"
            size = s.file.stat().st_size / 1e6
            emit(
                ctx,
                {"path": str(s.path), "uri": s.uri, "sha256": s.sha256, "pack": s.is_pack},
                f"{s.uri}  {s.path} ({what}, {size:.1f} MB)",
            )
        addrs = ", ".join(server.peer.listen_addrs)
        if not ctx.as_json:
            click.echo(f"serving {len(served)} path(s) on {addrs} until Ctrl-C", err=True)
        sys.stdout.flush()
        serve_until(lambda: None, stop=stop)
        sent = server.bytes_sent()
    emit(ctx, {"stopped": True, "bytes_sent": sent}, f"stopped serving ({sent / 1e6:.1f} MB sent)")


__all__ = ["register"]

"""`dtrain job`: status, list, cancel, finalize and watch (`job submit`: job_submit.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .. import progress
from ..client import BSM, FINALIZE_GAS, JOB_EVENTS
from ..errors import ConfigError, DtrainError
from ..models import JobStatus, Method, SlashReason
from ..units import format_epoch, format_eth, format_time
from .root import Ctx, _fmt_in, _job_unit, _jsonable, _TokenUnit, cli, emit, pass_ctx


@cli.group()
def job() -> None:
    """Submit, inspect, watch and cancel training jobs."""


def _epoch_of(j: Any) -> str:
    """ "e (0..E-1)": the epoch in progress (from 0) while running, else "d/E done"."""
    done, total = j.state.epoch, j.spec.total_epochs
    if j.state.status == JobStatus.RUNNING:
        return f"{done} (0..{total - 1})"
    return f"{done}/{total} done"


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
    if j.final_epoch is not None:
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
    """Show a job's spec, epoch, members, votes, deadlines and escrow; once completed (or
    cancelled after a paid epoch), who serves its final checkpoint (the members paid for the
    last epoch, with the peer ids and addresses they registered). Example: dtrain job status 1"""
    bsm = ctx.bsm(signing=False)
    j = bsm.job(job_id)
    holders = bsm.final_holders(job_id)
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
    if j.state.status in (JobStatus.OPEN, JobStatus.RUNNING):
        found = progress.refusals(bsm, job_id)
        data["refusals"] = [r.__dict__ for r in found]
        if found:
            human += "\n" + progress.refusal_summary(found)
            human += "".join(f"\n  {r.operator}  {r.why}: {r.detail}" for r in found)
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
        f"epoch {_epoch_of(j):<8}  members {len(j.members)}/{j.spec.max_operators}  "
        f"price {_fmt_in(units[j.id], j.spec.price_per_operator_epoch)} per operator-epoch"
        for j in jobs
    )
    emit(ctx, jobs, human or "no jobs")


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
            f"{format_epoch(epoch, j.spec.total_epochs)} of job {job_id} cannot be settled yet: "
            f"{j.revealed} of {len(j.members)} members revealed and reveals are open until "
            f"{format_time(j.reveal_deadline)}; run this again after that"
        )
    stale = not all_in and block_ts <= j.reveal_deadline
    rc = bsm.finalize_epoch(job_id, epoch, gas=FINALIZE_GAS if stale else None)
    shown = ("EpochFinalized", "EpochFailed", "Slashed", "JobAborted", "JobCompleted", "JobFailed")
    names = [e.name for e in rc.events if e.name in shown]
    lines = [f"{format_epoch(epoch, j.spec.total_epochs)} of job {job_id} settled"]
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
    name; --json keeps the raw values), and while following, each round's progress as the
    members sign and gossip it (step, loss, tokens, the method's metric, ETA of the job).
    Example: dtrain job watch 1 --no-follow

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
    feed = _progress_feed(ctx, bsm, job_id)
    try:
        for e in bsm.watch(from_block, JOB_EVENTS, job_id, poll, stop=ended):
            show(e)
    finally:
        if feed is not None:
            counts = feed.stop()
            emit(ctx, {"progress_notes": counts}, progress.summary(counts))


def _progress_feed(ctx: Ctx, bsm: BSM, job_id: int) -> progress.ProgressFeed | None:
    """The members' per-round progress from gossip, printed as it comes (None, saying why on
    stderr, without the node package)."""
    try:
        return progress.ProgressFeed(
            bsm, job_id, lambda line: emit(ctx, line.as_dict(), line.text())
        ).start()
    except ConfigError as e:
        click.echo(f"no per-round progress: {e}", err=True)
        return None


def _serve_job_page(ctx: Ctx, bsm: BSM, job_id: int, port: int, metrics: tuple[Path, ...]) -> None:
    from ..jobpage import JobPage, JobPageServer

    page = JobPage(bsm, job_id, metrics)
    server = JobPageServer(page, port=port)
    feed = None if bsm.job(job_id).state.status.is_ended else _page_feed(bsm, job_id, page)
    try:  # a Ctrl-C right after the URL is printed stops as cleanly as a later one
        emit(ctx, {"url": server.url}, f"job {job_id}: {server.url} (Ctrl-C stops)")
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo(f"stopped serving the page of job {job_id}", err=True)
    finally:
        server.server_close()
        if feed is not None:
            feed.stop()


def _page_feed(bsm: BSM, job_id: int, page: Any) -> progress.ProgressFeed | None:
    """The members' gossiped progress into the page's data: each note a point of the loss
    curve, the last round line (with the ETA) as `progress` (None without the node package)."""

    def latest(line: progress.RoundLine) -> None:
        page.progress = line.as_dict()["progress"]

    try:
        return progress.ProgressFeed(bsm, job_id, latest, on_note=page.add_note).start()
    except ConfigError:
        return None

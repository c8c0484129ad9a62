"""The operator's terminal: where the node is (`Status`), one progress line of it, a readable
line per event, and what a Ctrl-C does (and costs) right now.

On a terminal the CLI shows the progress line live (rich) under the log; elsewhere every round
logs it as a plain line. The JSON metrics file is written by the node, untouched by this.

    TRAIN    | job 7 | epoch 1 (epochs 0..2) | round 5/30 | loss 3.2104 | 1234 tok/s | ETA 2m10s
             | commit deadline in 4m02s | peers 2/2          (one line)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from dtrain.models import Job, JobStatus
from dtrain.units import format_epoch, format_eth

# The states of the node (docs/node.md), in the order they are entered.
STATES = ("REGISTER", "JOIN", "WAIT", "START", "TRAIN", "COMMIT", "REVEAL", "FINALIZE", "DONE")
AGAIN = "press Ctrl-C again to stop now"


def span(seconds: float) -> str:
    """A short duration: "45s", "4m02s", "2h05m", "3d04h"."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def clock(ts: float, now: float) -> str:
    """A local wall-clock time with how far away it is: "14:05:09 (in 4m02s)"."""
    at = time.strftime("%H:%M:%S", time.localtime(ts))
    return f"{at} (in {span(ts - now)})" if ts >= now else f"{at} ({span(now - ts)} ago)"


@dataclass
class Status:
    """What the node is doing: its state, the job snapshot it last read, the last round."""

    state: str = "REGISTER"
    job: int | None = None
    epoch: int | None = None
    epochs: int | None = None  # the job's total epochs
    rounds: int | None = None  # sync rounds per epoch
    round: int | None = None  # last finished round (0-based) of this attempt
    loss: float | None = None
    reward: float | None = None  # GRPO: mean reward of the round's sampled completions
    tokens_per_s: float | None = None
    round_s: float | None = None  # mean seconds per round of this attempt
    peers: tuple[int, int] | None = None  # (peers whose packet we applied, peers)
    deadline: int = 0  # commit deadline of the epoch in progress
    reveal_deadline: int = 0
    member: bool = False  # of the epoch in progress (or of the Open job)
    pending: bool = False  # joined, a member from the next boundary
    running: bool = False  # the job runs an epoch
    committed: bool = False
    revealed: bool = False
    leaving: bool = False  # our leave is announced on chain
    lost: str = ""  # why the epoch in progress is lost to us (we will not vote it)
    retry: int = 0  # attempts of this epoch before this one (that we saw)
    linger_until: float = 0.0
    dropout_bps: int = 0
    withheld_bps: int = 0  # a committed vote never revealed: the fabrication rate
    pool: int = 0  # our pool's assets, what a slash takes its share of

    def observe(self, job: Job, me: str) -> None:
        """Update from a job snapshot (read at one block)."""
        if job.state.epoch != self.epoch or job.id != self.job:
            self.round, self.loss, self.tokens_per_s, self.round_s, self.peers = (None,) * 5
            self.reward, self.lost = None, ""
        self.job, self.epoch = job.id, job.state.epoch
        self.epochs = job.spec.total_epochs
        self.rounds = job.spec.steps_per_epoch // job.spec.sync_interval
        self.deadline, self.reveal_deadline = job.deadline, job.reveal_deadline
        self.member, self.pending = me in job.members, me in job.pending_joins
        self.running = job.state.status == JobStatus.RUNNING

    def on_round(self, data: dict[str, Any]) -> None:
        """Update from a `round` metric record."""
        n = 0 if self.round is None or data["round"] <= self.round else data["round"] - self.round
        took = data.get("compute_s", 0.0) + data.get("sync_s", 0.0)
        if n and self.round_s is not None:
            self.round_s = (self.round_s + took) / 2
        else:
            self.round_s = took
        self.round, self.loss = data["round"], data["loss"]
        self.reward = data.get("reward")
        self.tokens_per_s = data["tokens_per_s"]
        self.peers = (max(0, data["applied"] - 1), data["peers"])


# What a `round` record puts in the progress note the node publishes (docs/protocol.md 4.8).
NOTE_FIELDS = ("epoch", "attempt", "round", "step", "loss", "tokens", "tokens_per_s")
NOTE_METRICS = ("reward", "accuracy", "preference_accuracy")


def note_body(data: dict[str, Any], rounds: int | None) -> dict[str, Any]:
    """The body of our signed progress note for a `round` metric record."""
    body = {k: data[k] for k in NOTE_FIELDS if k in data}
    body.update({k: data[k] for k in NOTE_METRICS if data.get(k) is not None})
    body["rounds"] = rounds or 0
    body["round_s"] = round(data.get("compute_s", 0.0) + data.get("sync_s", 0.0), 3)
    body["t"] = round(time.time(), 3)
    return body


def progress_line(s: Status, now: float) -> str:
    """One line: job, epoch e/E, round r/R, loss (and a GRPO round's mean reward), tokens/s,
    ETA, time to the commit deadline, peers (what is not known yet is left out)."""
    parts = [f"{s.state:<8}"]
    if s.job is not None:
        parts.append(f"job {s.job}")
    if s.epoch is not None and s.epochs:
        retry = f" (retry {s.retry})" if s.retry else ""
        parts.append(f"epoch {_epoch(s)}{retry}")
    if s.state == "DONE" and s.linger_until:
        parts.append(f"serving the final checkpoint for {span(s.linger_until - now)} more")
        return " | ".join(parts)
    if s.rounds and s.state in ("START", "TRAIN"):
        done = 0 if s.round is None else s.round + 1
        parts.append(f"round {done}/{s.rounds}")
    if s.lost and s.state in ("TRAIN", "REVEAL", "FINALIZE"):
        parts.append(f"epoch lost ({s.lost}): not voting it, leaving at its end")
        return " | ".join(parts)
    if s.loss is not None and s.state == "TRAIN":
        parts.append(f"loss {s.loss:.4f}")
        if s.reward is not None:  # a GRPO loss near 0 says nothing of what it learns
            parts.append(f"reward {s.reward:.4f}")
        parts.append(f"{s.tokens_per_s:.0f} tok/s")
        if s.round_s is not None and s.rounds:
            parts.append(f"ETA {span((s.rounds - (s.round or 0) - 1) * s.round_s)}")
    if s.running and s.deadline and s.state in ("START", "TRAIN", "COMMIT"):
        parts.append(f"commit deadline in {span(s.deadline - now)}")
    elif s.running and s.reveal_deadline and s.state in ("REVEAL", "FINALIZE"):
        parts.append(f"reveal deadline in {span(s.reveal_deadline - now)}")
    if s.peers is not None and s.state == "TRAIN":
        parts.append(f"peers {s.peers[0]}/{s.peers[1]}")
    return " | ".join(parts)


def _epoch(s: Status) -> str:
    """ "1 (epochs 0..2)": the epoch counted from 0, with the job's range."""
    return format_epoch(s.epoch, s.epochs).removeprefix("epoch ")


def first_signal_message(s: Status) -> str:
    """What the first Ctrl-C (or SIGTERM) does in the state the node is in."""
    job = f"job {s.job}" if s.job is not None else "the job"
    if s.state == "DONE":
        return f"stopping: {job} ended; no longer serving its final checkpoint"
    if s.state == "REGISTER":
        return f"leaving after registering: no job joined, nothing at stake; {AGAIN}"
    if s.job is None:
        return f"leaving now: no job joined, nothing at stake; {AGAIN}"
    if s.state == "JOIN" or (s.state == "WAIT" and not s.running) or s.pending:
        return (
            f"leaving now: {job} has not started an epoch with us, so we give our seat and "
            f"its bond back at once; {AGAIN}"
        )
    epoch = "this epoch" if s.epoch is None else f"epoch {_epoch(s)}"
    return (
        f"leaving after this epoch: {job} keeps our seat until the end of {epoch} (we still "
        f"commit, reveal and finalize it, or are slashed as a dropout); {AGAIN}"
    )


def _slash(s: Status, bps: int, why: str) -> str:
    out = f"slashed {bps / 100:g}% of our pool"
    if s.pool:
        out += f" ({format_eth(s.pool * bps // 10_000)} of {format_eth(s.pool)})"
    return out + f" for {why}; restart with the same --data-dir to carry on"


def second_signal_message(s: Status, now: float) -> str:
    """What stopping now costs, in the state the node is in."""
    if s.state in ("REGISTER", "JOIN", "DONE") or s.job is None:
        return "stopping now: nothing at stake"
    slash = _slash(s, s.dropout_bps, "dropout")
    if not s.running or s.pending or not s.member:
        return (
            f"stopping now: we hold a seat in job {s.job}; once it runs an epoch with us, if "
            f"we do not commit and reveal it we are {slash}"
        )
    epoch = f"epoch {_epoch(s)} of job {s.job}"
    if s.revealed and s.leaving:
        return f"stopping now: our vote for {epoch} is in and we leave at its end; nothing lost"
    if s.revealed:
        return (
            f"stopping now: our vote for {epoch} is in, but we stay a member of the next "
            f"epoch: if we do not commit and reveal it we are {slash}"
        )
    if s.committed:
        withheld = _slash(s, s.withheld_bps or s.dropout_bps, "a withheld reveal")
        return (
            f"stopping now: we are a member of {epoch}; if we do not reveal by "
            f"{clock(s.reveal_deadline, now)} we are {withheld}"
        )
    return (
        f"stopping now: we are a member of {epoch}; if we do not commit by "
        f"{clock(s.deadline, now)} and reveal by {clock(s.reveal_deadline, now)} we are {slash}"
    )


def _checkpoint(data: dict[str, Any]) -> str:
    return f"0x{data.get('checkpoint', '')[:12]}.."


EVENTS = {
    "registered": lambda d: f"registered with {format_eth(d['stake'])} stake, at {d['addrs']}",
    "addresses_updated": lambda d: f"peer addresses updated on chain: {d['addrs']}",
    "ask_updated": lambda d: (
        f"ask in ether updated on chain: {format_eth(d['was'])} -> {format_eth(d['ask'])} "
        "(asks in tokens: `dtrain operator update --token`)"
    ),
    "joined": lambda d: f"joined job {d['job']}",
    "rejoined": lambda d: f"already in job {d['job']}: carrying on",
    "leaving": lambda d: f"leave of job {d['job']} announced: it applies at the next boundary",
    "left": lambda d: f"left job {d['job']}: seat and bond given back",
    "not_a_member": lambda d: f"no longer a member of job {d['job']}",
    "seats_drawn": lambda d: f"drew the seats of job {d['job']} among its applicants",
    "seat_draw_sealed": lambda d: f"sealed the seat draw of job {d['job']}: the next block draws",
    "not_drawn": lambda d: f"not drawn for a seat of job {d['job']}: bond given back, nothing lost",
    "committed": lambda d: f"committed our vote for epoch {d['epoch']} ({_checkpoint(d)})",
    "revealed": lambda d: f"revealed our vote for epoch {d['epoch']} ({_checkpoint(d)})",
    "finalized": lambda d: f"epoch {d['epoch']} settled: {', '.join(d['events']) or '-'}",
    "challenged": lambda d: (
        f"epoch {d['epoch']}: the certified vote 0x{d['certified'][:16]}.. is not ours: "
        f"challenged, the referees re-execute our transcript"
    ),
    "challenge_resolved": lambda d: (
        f"epoch {d['epoch']}: the referees "
        f"{'overturned' if d['overturned'] else 'upheld'} the certified vote"
    ),
    "suspected": lambda d: (
        f"epoch {d['epoch']}: the robust rule saw a possible coalition ("
        + "; ".join(
            f"{a[:10]}.. "
            + ", ".join(f"{w} in {n} of {d['rounds']} rounds" for w, n in sorted(x.items()))
            for a, x in sorted(d["seen"].items())
        )
        + ")"
    ),
    "withdrew": lambda d: f"withdrew {d.get('text') or format_eth(d['amount'])}",
    "lingering": lambda d: f"serving the final checkpoint of job {d['job']} for {span(d['s'])}",
    "keeping_final": lambda d: (
        f"keeping the final checkpoint of job {d['job']} for its caller until it confirms a "
        f"fetch, {span(d['s'])} at most"
    ),
    "final_confirmed": lambda d: (
        f"the caller {d['caller']} confirmed its fetch of job {d['job']}'s final checkpoint"
    ),
    "stopped": lambda d: "stopped",
}
HIDDEN = ("attempt", "node", "t")  # job-wide attempt counter: in the metrics file only


def describe(kind: str, data: dict[str, Any], s: Status) -> str:
    """A readable line for a metric record (the `round` record: the progress line)."""
    if kind == "round":
        return progress_line(s, time.time())
    if kind == "epoch_start":
        retry = f" (retry {s.retry})" if s.retry else ""
        first = f", resuming at round {d + 1}" if (d := data.get("first_round")) else ""
        held = f", held-out loss {data['loss']:.4f}" if "loss" in data else ""
        return (
            f"{format_epoch(data['epoch'], s.epochs)}{retry} of job {data['job']} started: "
            f"{data['members']} members, shard of {data['shard']}{held}{first}"
        )
    fmt = EVENTS.get(kind)
    if fmt is not None:
        try:
            return fmt(data)
        except (KeyError, TypeError, ValueError):
            pass
    shown = " ".join(f"{k}={v}" for k, v in data.items() if k not in HIDDEN)
    return f"{kind.replace('_', ' ')} {shown}".rstrip()


class LiveLine:
    """The rich renderable of the live line: re-read on every refresh, so countdowns tick."""

    def __init__(self, status: Status) -> None:
        self.status = status

    def __rich__(self) -> Any:
        from rich.text import Text

        return Text(progress_line(self.status, time.time()), style="bold cyan")

"""Round timing: how long one sync round may wait for the members' packets.

Members reach the first round of an epoch at different times (fetching the start checkpoint,
building the model), so it gets `FIRST_ROUND_FACTOR` times the round deadline; once everyone
is in, rounds end as soon as all packets arrived. Missing members must not make us miss the
epoch's commit deadline: the rounds left share the time left, less the gossip settle phase of
each and `VOTE_MARGIN_S` to save the checkpoint and send both vote transactions (the commit
before the deadline and the reveal, which opens early once every member committed). A round
never gets less than `MIN_ROUND_S`.
"""

from __future__ import annotations

FIRST_ROUND_FACTOR = 4
SAVE_S = 10.0  # save and hash the checkpoint, persist the vote
TX_S = 5.0  # one transaction sent and mined
VOTE_MARGIN_S = SAVE_S + 2 * TX_S  # kept before the commit deadline: save, commit, reveal
MIN_ROUND_S = 1.0
REPLAY_S = 10.0  # replay the epoch's transcript when our live rounds differed from it


def round_deadline(
    base_s: float,
    *,
    first: bool,
    now: float,
    epoch_deadline: float,
    rounds_left: int,
    settle_s: float,
) -> float:
    """Seconds the round may wait for packets.

    base_s: the configured round deadline; first: the first round this process runs in the
    epoch (also after a resume); now and epoch_deadline: unix seconds (the commit deadline);
    rounds_left: this round and the ones after it (>= 1); settle_s: the transport's settle
    time after a deadline.
    """
    if rounds_left < 1:
        raise ValueError(f"rounds_left must be >= 1, got {rounds_left}")
    wanted = base_s * (FIRST_ROUND_FACTOR if first else 1)
    left = epoch_deadline - now - VOTE_MARGIN_S
    share = left / rounds_left - settle_s
    return max(MIN_ROUND_S, min(wanted, share))


def round_patience(
    *,
    now: float,
    epoch_deadline: float,
    rounds_left: int,
    settle_s: float,
    compute_s: float = 0.0,
) -> float:
    """Seconds a round may wait for a member that is alive but has not begun it yet (a slow
    machine): this round's fair share of the time left before the vote, less our own training
    of the rounds after it (`compute_s` each). Waiting that long still finishes the epoch in
    time, so no honest member is left out for being slow, nor made late by waiting for one."""
    if rounds_left < 1:
        raise ValueError(f"rounds_left must be >= 1, got {rounds_left}")
    left = epoch_deadline - now - VOTE_MARGIN_S - REPLAY_S - (rounds_left - 1) * compute_s
    return max(MIN_ROUND_S, left / rounds_left - settle_s)


def epoch_seconds_needed(steps: int, sync_interval: int, step_s: float) -> float:
    """Least epoch duration in which this node can finish an epoch: every inner step at
    `step_s` seconds, every sync round at least `MIN_ROUND_S`, the first round its longer
    start, and the margin to save, commit and reveal. An epoch shorter than this would get us
    slashed for dropping out, so `--auto` does not join such a job."""
    if steps < 1 or sync_interval < 1 or not step_s >= 0:
        raise ValueError(f"steps {steps}, sync_interval {sync_interval} >= 1, step_s {step_s} >= 0")
    rounds = steps // sync_interval
    return steps * step_s + (rounds + FIRST_ROUND_FACTOR) * MIN_ROUND_S + VOTE_MARGIN_S


def finish_needs_s(rounds_left: int, compute_s: float) -> float:
    """The least seconds this node needs from now to commit its vote, its rounds left at
    `compute_s` seconds of training each: their training alone, then saving the checkpoint
    and the commit transaction (the reveal may come after the deadline). More than the commit
    deadline leaves, and the epoch is lost to us even if every round synced at once: training
    on only spends compute on a vote that would come too late. A lower bound on purpose: an
    honest node that might still make it is never told to give up."""
    if rounds_left < 0 or not compute_s >= 0:
        raise ValueError(f"rounds_left {rounds_left} and compute_s {compute_s} must be >= 0")
    return rounds_left * compute_s + SAVE_S + TX_S


def reveal_window_fits(reveal_window_s: int) -> bool:
    """Can a reveal that opens only at the commit deadline (a member did not commit) still be
    mined within the chain's reveal window? `--auto` joins no job on a chain where it cannot:
    an unrevealed commitment is slashed as a dropout."""
    return reveal_window_s >= TX_S


def reconcile_deadline(*, now: float, epoch_deadline: float) -> float:
    """Seconds the end-of-epoch transcript agreement may wait for slow members: all the time
    left but what replaying, saving and both vote transactions need."""
    return max(MIN_ROUND_S, epoch_deadline - now - VOTE_MARGIN_S - REPLAY_S)

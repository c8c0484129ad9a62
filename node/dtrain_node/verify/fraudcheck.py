"""A referee re-runs a replay claim (docs/protocol.md 4.6, docs/contract.md "Challenges").

A claim (`claims.Claim`) says its checker replayed member M's round r and did not get M's
packet. The referee trusts none of it but M's own signatures: the claim's commitment must be
M's signed commitment of round r, naming the packet the epoch's transcript holds for M in that
round; the shared state at round r is the transcript's first r rounds applied to the epoch's
start state (`DeMo.replay`); M's private state is fetched by the digest M signed (from M, the
checker, or any member that kept it), checked, and M's round replayed as the trainer takes it
(`inner.replay_round`, the job's recipe). M is caught when the replay gives another packet
(or the state it hands over is not the one it committed to).

Every claim, "withheld" included, is a public request for the state: the challenge that names
it is on-chain, and each referee asks for the state itself, capped at the most bytes a state of
the job has (`statefile.size_bound`), asking again for half a challenge phase. M is caught as
withholding only when nobody served the referee its committed state in that time, and only
when the deadline its size takes at the documented minimum bandwidth
(`replaycheck.state_deadline`) fits in it (else the claim is undecided): what one checker
could not fetch is a reason to ask again, never guilt by itself.

A claim counts only if its checker was assigned the check: the assignment is recomputed from
the transcript (`spotcheck.assign` over the shared state after round r, at the protocol's
check rate), so nobody can sign a claim about a member or a round it was not given.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from web3 import Web3

from dtrain.models import Job
from dtrain_node.optim import statefile
from dtrain_node.optim.optimizer import DeMo
from dtrain_node.optim.settings import demo_config
from dtrain_node.train import devices, inner, shard
from dtrain_node.train.backend import make_backend, token_reach
from dtrain_node.train.job import TrainJob
from dtrain_node.verify import claims, evidence, replaycheck, spotcheck
from dtrain_node.verify.recompute import REFEREE, Attempt

log = logging.getLogger(__name__)

# (sha256 hex, member, destination, seconds, most bytes) -> the verified file; raises when
# nobody serves it in that time
StateFetch = Callable[[str, str, Path, float, int], Path]

# what a referee finds of a claim (`caught`)
REFUSED = "refused"  # not the signer's check: nothing fetched or re-run
UNDECIDED = "undecided"  # not served, but the state's deadline exceeds a phase
HONEST = "honest"  # the replay gives the member's packet
CAUGHT = "caught"  # another packet, another state, or not served in time


def applies(c: claims.Claim, t: evidence.EpochTranscript) -> bool:
    """The claim is signed by its checker, its commitment is the member's for its round, and
    it is about the packet the transcript holds for the member in that round (a round of the
    attempt: members keep every round's state until the challenge window closes)."""
    try:
        claims.verify(c)
    except claims.ClaimInvalid as exc:
        log.info("claim left out: %s", exc)
        return False
    head = (c.chain_id, c.contract, c.job_id, c.attempt)
    if head != (t.chain_id, t.contract, t.job_id, t.attempt) or c.round >= len(t.rounds):
        return False
    held = [p for p in t.rounds[c.round] if p.sender == c.member]
    return len(held) == 1 and hashlib.sha256(held[0].payload).digest() == c.packet


def caught(
    a: Attempt,
    c: claims.Claim,
    t: evidence.EpochTranscript,
    fetch: StateFetch,
    work: Path,
    phase_s: float,
) -> str:
    """What the replay of member `c.member`'s round `c.round` finds (see the module doc):
    CAUGHT, HONEST, REFUSED or UNDECIDED.
    `a`: the attempt as it began, its files fetched; `phase_s`: the time a referee can give
    the state, which its deadline must fit in for a state not served to decide anything."""
    job, tj, start = a.job, a.tj, a.start
    packet = next(p.payload for p in t.rounds[c.round] if p.sender == c.member)
    shared, reach, after, bound = _shared_at(a, t, c.round)
    if not assigned(c, after, job.members, spotcheck.rate_from_env()):
        log.info("claim on %s round %d refused: not %s's check", c.member, c.round, c.checker)
        return REFUSED
    replica = replaycheck.demo_replica(
        _builder(job, tj, start),
        demo_config(a.defaults, job, tj.recipe),
        job.spec.sync_interval,
        reach,
    )
    check = replaycheck.Check(c.round, c.member, packet, c.commitment, shared)
    within = replaycheck.state_deadline(bound)

    def capped(sha: str, member: str, dest: Path, left: float) -> Path:
        return fetch(sha, member, dest, left, bound)

    # the whole time we can give it, never less than its deadline: a member restarting when
    # we first ask still serves it in time
    o = replaycheck.run_check(check, replica, capped, work, phase_s)
    if o.reason == claims.WITHHELD and within > phase_s:
        log.info("claim on %s round %d: undecided, %.0f s > the phase", c.member, c.round, within)
        return UNDECIDED
    found = HONEST if o.reason is None else CAUGHT
    log.info("claim on %s round %d: %s (%s)", c.member, c.round, found, claims.REASONS[c.reason])
    return found


def assigned(c: claims.Claim, after: bytes, members: Sequence[str], rate: float) -> bool:
    """Whether the claim's checker was assigned the check of its member in its round, from
    `after`, the shared state's digest after that round."""
    pairs = spotcheck.assign(after, members, c.round, rate)
    return (c.checker.lower(), c.member.lower()) in {(a.lower(), b.lower()) for a, b in pairs}


def _shared_at(
    a: Attempt, t: evidence.EpochTranscript, rnd: int
) -> tuple[list[Any], int, bytes, int]:
    """The shared state before round `rnd`, the rows the model's tokens reach, the digest of
    the shared state after round `rnd` (the seed of its checks) and the most bytes a member's
    private state may have."""
    backend = make_backend(a.tj)
    if a.start is not None:
        backend.model.load_state_dict(a.start)
    reach = token_reach(backend)
    opt = DeMo.of_model(backend.model, demo_config(a.defaults, a.job, a.tj.recipe), REFEREE, reach)
    opt.replay([x.clone() for x in opt.theta_sync], t.packets()[:rnd])
    before = [x.clone() for x in opt.theta_sync]
    opt.replay([x.clone() for x in before], t.packets()[rnd : rnd + 1])
    return before, reach, spotcheck.shared_digest(opt.theta_sync), statefile.size_bound(opt)


def _builder(job: Job, tj: TrainJob, start: dict[str, Any] | None) -> Callable[[], Any]:
    """What `replaycheck.demo_replica` builds on first use: the member's model, its inner
    round as the trainer takes it, and its batch stream (the trainer's seed and shard)."""
    spec, st = job.spec, job.state
    members = [Web3.to_checksum_address(m) for m in job.members]
    plan = inner.InnerPlan(tj.recipe, spec.total_epochs * spec.steps_per_epoch)
    device = devices.pick("cpu")

    def build() -> Any:
        backend = make_backend(tj)
        if start is not None:
            backend.model.load_state_dict(start)

        def run(opt: Any, batches: Any) -> None:
            epoch_start = st.epoch * spec.steps_per_epoch
            inner.replay_round(opt, backend, batches, plan, epoch_start, device)

        def stream(member: str) -> Any:
            idx = shard.assign(backend.n_items(), job.id, st.epoch, members, member)
            seed = job.id * 1000 + st.attempt + tj.seed_offset
            return backend.batches(idx, tj.batch_size, seed=seed)

        return backend.model, run, stream

    return build

"""The reference operator node: one process per operator, driven by the chain.

States (each a method of `Node`, logged as it is entered):

    REGISTER  ensure registration (peer key + multiaddrs on-chain) and self-stake
    JOIN      join the job (or pick one with --auto: open, price >= our ask, epochs long enough,
              seat bond within our free self-stake), only after the pre-flight: its dataset
              reads and matches its hash, its start model builds and matches modelHash (a job
              we cannot do is never joined); joining bonds the job's seatBond
    WAIT      wait until we are a member of a running epoch (joins apply at boundaries); a job
              left Open past the open timeout is failed (the caller is refunded)
    START     read members, load the epoch's start checkpoint (verify its hash against the
              chain; fetch it from a peer when missing), connect to the members' peers
    TRAIN     K inner AdamW steps on our deterministic shard, then a DeMo sync over gossip;
              after each round the round state is saved so a restart resumes there
    COMMIT    save the checkpoint (safetensors + canonical stream), draw a fresh salt, persist
              (checkpoint, participation, salt), then commitCheckpoint(hash of it all) before
              the deadline (skipped when the chain already has our commitment). When the
              dataset or start model is unavailable or fails its hash, the vote is UNWORKABLE
    REVEAL    revealCheckpoint once every member committed or the deadline passed, before
              the reveal deadline (skipped when already revealed)
    FINALIZE  finalizeEpoch once everyone revealed or the reveal deadline passed (anyone may)
              and the certified vote's challenge window passed; a certified vote that is not
              ours is challenged, and the epoch finalized once the challenge is resolved
    DONE      job ended: export the final checkpoint in Hugging Face format, claim and withdraw,
              serve the final checkpoint for `linger_s` (callers fetch it)

SIGINT or SIGTERM once: leave at the next safe point of the state we are in (before joining:
at once; a seat in a job that has not started an epoch with us: given back at once; a member
of a running epoch: after committing, revealing and finalizing it; lingering: at once), saying
so. Twice: stop now, saying what it costs (`progress.second_signal_message`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dtrain import erc20
from dtrain.client import BSM
from dtrain.errors import ContractError, DtrainError, TransactionFailed
from dtrain.models import Job, JobState, JobStatus, Params
from dtrain.units import format_epoch, format_eth
from dtrain_node.errors import StopRequested
from dtrain_node.operator import asks, attest_service, referee, vote
from dtrain_node.operator.challenger import Challenger
from dtrain_node.operator.checkpoints import Checkpoints
from dtrain_node.operator.config import NodeConfig
from dtrain_node.operator.deadlines import epoch_seconds_needed, reveal_window_fits
from dtrain_node.operator.epoch import (
    UNWORKABLE_ERRORS,
    EpochEnv,
    EpochLost,
    EpochTrainer,
)
from dtrain_node.operator.faults import Faults
from dtrain_node.operator.keep import Keep
from dtrain_node.operator.preflight import Preflight
from dtrain_node.operator.progress import (
    Status,
    describe,
    first_signal_message,
    note_body,
    second_signal_message,
)
from dtrain_node.operator.settlement import (
    SETTLE_EVENTS,
    describe_settled,
    settled_by_other,
    slashes,
)
from dtrain_node.operator.transport import (
    PeerSpec,
    Transport,
    TransportFactory,
    gossip_transport,
    peer_specs,
)
from dtrain_node.operator.vote import Vote
from dtrain_node.p2p.files import sha256_file
from dtrain_node.p2p.reconcile import Equivocation
from dtrain_node.verify import evidence, spotcheck
from dtrain_node.verify.recompute import recompute

log = logging.getLogger("dtrain.node")

FINALIZE_GAS = 6_000_000  # above finalizeEpoch at the 32-member cap (docs/gas.md)
REVEAL_GAS = 1_000_000  # above revealCheckpoint at the 32-member cap (first sight of a vote)
DRAW_SEATS_GAS = 3_000_000  # above drawSeats among 32 applicants
# The contract's refusals of a join that are ours to explain to the caller (notes.REASONS).
JOIN_REFUSALS = {
    "PriceBelowAsk": "ask",
    "PriceBelowTokenAsk": "ask",
    "NoAskInToken": "ask",
    "InsufficientFreeStake": "capacity",
    "StakeBonded": "capacity",
}
MAX_APPLICANTS = 32  # the contract's cap on a drawing job's applicants (MAX_OPERATORS_CAP)
ATTEST_MARGIN_S = 600  # a recorded attestation this close to expiry is renewed before a join


class Node:
    def __init__(self, cfg: NodeConfig, transport_factory: TransportFactory | None = None) -> None:
        self.cfg = cfg
        self.bsm = BSM.attach(cfg.rpc_url, cfg.contract, cfg.key)
        self.me = self.bsm.sender
        self.dir = cfg.data_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.leave_requested = threading.Event()
        self._states_served: set[tuple[int, int]] = set()  # (job, attempt) re-served
        self.stop_now = threading.Event()
        self.job_id: int | None = cfg.job_id
        self._transport_factory = transport_factory or gossip_transport
        self.transport: Transport = None  # type: ignore[assignment]  # set by run()
        self.metrics_path = self.dir / "metrics.jsonl"
        self._first_attempt: dict[int, int] = {}
        self._params_cache: Params | None = None  # the deployed parameters never change
        # can we do a job? (fetches its files, then builds it; once per job)
        self._preflight = Preflight(cfg.batch_size, cfg.source_cache(), step_s=cfg.step_s)
        self.status = Status()  # where we are: the progress line and the signal messages
        self._entered_why = ""  # why we entered the current state (logged once)
        self.stop_signal: int | None = None  # the signal that stopped us now, if one did
        self._finishing = False  # stopping: a late signal must not interrupt the cleanup
        self._applied = False  # we applied for a seat of a job that draws them
        self._passed: dict[int, tuple[str, str]] = {}  # job -> (reason, why) --auto passed it by
        self._attempt_seen: dict[tuple[int, int], int] = {}  # (job, attempt) -> first block
        self._lost: set[tuple[int, int]] = set()  # (job, attempt) we gave up: no vote

    # ------------------------------------------------------------------ plumbing

    def _metric(self, kind: str, **data: Any) -> None:
        rec = {"t": round(time.time(), 3), "kind": kind, "node": self.me, **data}
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if kind == "round":
            self.status.on_round(data)
            self._publish_progress(data)
        elif kind == "epoch_start":
            self.status.retry = data["attempt"] - self._first_attempt.get(data["epoch"], 0)
        # The live line on a terminal shows rounds; the log gets every line.
        text = describe_settled(data, self.me) if kind == "finalized" else None
        log.info(text or describe(kind, data, self.status), extra={"progress": kind == "round"})

    def _publish_progress(self, data: dict[str, Any]) -> None:
        """Our round's signed progress on the job's gossip (a transport without it: none)."""
        publish = getattr(self.transport, "publish_progress", None)
        if publish is not None:
            publish(note_body(data, self.status.rounds))

    def _enter(self, state: str, why: str = "") -> None:
        """Log the state we enter, and why, once: not again on every poll that finds the same."""
        if (self.status.state, self._entered_why) != (state, why):
            self.status.state, self._entered_why = state, why
            log.info("%s%s", state, f": {why}" if why else "")

    def _observe(self, job: Job) -> None:
        self.status.observe(job, self.me)

    def _check_stop(self) -> None:
        if self.stop_now.is_set():
            raise StopRequested()

    def _sleep(self) -> None:
        self._check_stop()
        time.sleep(self.cfg.poll_s)

    def install_signals(self) -> None:
        """SIGINT and SIGTERM alike: the first leaves at the next safe point, the second stops
        now (raised here, in the main thread, so a long wait is cut short too)."""
        signal.signal(signal.SIGINT, self.on_signal)
        signal.signal(signal.SIGTERM, self.on_signal)

    def on_signal(self, signum: int, _frame: Any = None) -> None:
        name = signal.Signals(signum).name
        if self._finishing:
            return
        if not self.leave_requested.is_set():
            self.leave_requested.set()
            log.warning("%s: %s", name, first_signal_message(self.status))
            return
        self.stop_now.set()
        self.stop_signal = signum
        log.warning("%s again: %s", name, second_signal_message(self.status, time.time()))
        raise StopRequested()

    def job_dir(self, job_id: int) -> Path:
        d = self.dir / "jobs" / str(job_id)
        d.mkdir(parents=True, exist_ok=True)
        return d

    # ------------------------------------------------------------------ lifecycle

    def run(self) -> dict[str, Any]:
        """The whole life of the node: {"stopped": True} when stopped now, {"left": True, ...}
        when it left on request (or was no longer a member), else the job's outcome."""
        try:
            result = self._run()
        except StopRequested:
            self._finishing = True
            self._metric("stopped")
            return {"stopped": True}
        finally:
            self._finishing = True
            if self.transport is not None:
                self.transport.stop()
        return result

    def _run(self) -> dict[str, Any]:
        if self.cfg.job_id is None:
            self._sync_ask()  # --auto compares prices with it
            self._enter("JOIN", "looking for an open job that pays our ask")
        job_id = self.cfg.job_id if self.cfg.job_id is not None else self._pick_job()
        if job_id is None:
            return {"left": True}
        self.job_id = self.status.job = job_id
        self.transport = self._transport_factory(self.cfg, self.bsm, job_id)
        refuse = getattr(self.transport, "refuse", None)
        for passed, (reason, why) in self._passed.items() if refuse is not None else ():
            refuse(passed, reason, why)  # the jobs --auto passed by, for their callers
        self._enter("REGISTER", f"operator {self.me}")
        self.register()
        if self.leave_requested.is_set():
            return {"left": True}
        self._enter("JOIN", f"job {job_id}")
        refused = self.join(job_id)
        if refused:
            self._linger_refused(job_id)
            return {"job": job_id, "refused": refused}
        result = self.train_job(job_id)
        if self.cfg.withdraw:
            self.collect_earnings(job_id)
        self._linger(result)
        return result

    def _linger(self, result: dict[str, Any]) -> None:
        """Keep serving the final checkpoint (`Job.final_epoch`'s: a cancelled or failed job's
        last paid epoch's) for `linger_s` (callers fetch it from us), then until the job's
        caller confirms its fetch, `keep_final_s` at most (operator/keep.py), unless asked to
        leave."""
        if "export" not in result and not result.get("serving"):
            return
        if self.cfg.linger_s <= 0 or self.leave_requested.is_set():
            return
        job_id = result["job"]
        keep = Keep.after(
            self.bsm.job(job_id), self.job_dir(job_id), self.transport,
            self.cfg.linger_s, self.cfg.keep_final_s,
        )  # fmt: skip
        self.status.linger_until = keep.linger_until
        self._enter("DONE", f"job {job_id} ended")
        self._metric("lingering", job=job_id, s=self.cfg.linger_s)
        said = False
        while not keep.over(time.time()) and not self.leave_requested.is_set():
            self._check_stop()
            if not said and time.time() >= keep.linger_until:
                said = True
                self.status.linger_until = keep.keep_until
                self._metric("keeping_final", job=job_id, s=keep.keep_until - time.time())
            time.sleep(0.2)
        if keep.confirmed():
            self._metric("final_confirmed", job=job_id, caller=keep.caller)

    def register(self) -> None:
        self.status.dropout_bps = self._params().dropout_slash_bps
        self.status.withheld_bps = self._params().fabrication_slash_bps
        op = self.bsm.operator(self.me)
        addrs = [a.split("/p2p/")[0] for a in self.transport.listen_addrs]
        if not op.registered:
            self.bsm.register_operator(
                self.cfg.stake,
                self.transport.peer_key,
                addrs,
                self.cfg.hardware,
                self.cfg.min_price or 0,
            )
            self._metric("registered", stake=self.cfg.stake, addrs=addrs)
        elif op.peer_key != self.transport.peer_key or list(op.multiaddrs) != addrs:
            # Restarted on another port: peers must dial the new address.
            self.bsm.update_operator(
                self.transport.peer_key, addrs, op.hardware, op.min_price_per_epoch
            )
            self._metric("addresses_updated", addrs=addrs)
        self._sync_ask()
        min_stake = self._params().min_stake
        have = self.bsm.stake_of(self.me, self.me)
        if have < min_stake:
            self.bsm.stake(min_stake - have)
        self._pool()

    def join(self, job_id: int) -> str | None:
        """Joins the job unless we cannot do it; returns why not (we did not join), or None."""
        job = self.bsm.job(job_id)
        if job.state.status.is_ended:
            return None  # restarted after the job: serve its final checkpoint (DONE)
        if self.me in job.members or self.me in job.pending_joins:
            self._metric("rejoined", job=job_id)
            return None
        why, code = self._preflight(job), "preflight"
        if why is None and job.spec.tee_required:
            why, code = self.ensure_attested(), "tee"
        if why is None:
            try:
                self.bsm.join_job(job_id)
            except ContractError as exc:
                code = JOIN_REFUSALS.get(type(exc).__name__, "")
                if not code:
                    raise
                why = str(exc)
        if why is not None:
            self._refuse(job_id, code, why)
            return why
        self._metric("joined", job=job_id)
        return None

    def _refuse(self, job_id: int, code: str, why: str) -> None:
        """Log why we pass the job by, say it on chain (`declineJob`: the caller reads it after
        we are gone) and sign it for the caller's `dtrain job status` meanwhile."""
        log.warning("not joining job %s: %s", job_id, why)
        self._metric("refused", job=job_id, reason=why, code=code)
        try:
            self.bsm.decline_job(job_id, code, why)
        except DtrainError as exc:  # the signed note still says it while we run
            log.warning("could not say on chain why we pass job %s by: %s", job_id, exc)
        refuse = getattr(self.transport, "refuse", None)
        if refuse is not None:
            refuse(job_id, code, why)

    def _linger_refused(self, job_id: int) -> None:
        """Keep serving our refusal while the job is Open, for `linger_s` at most."""
        until = time.time() + self.cfg.linger_s
        if self.cfg.linger_s > 0 and getattr(self.transport, "refuse", None) is not None:
            self._enter("DONE", f"telling the caller why we passed job {job_id} by")
        while time.time() < until and not self.leave_requested.is_set():
            if self.bsm.job(job_id).state.status != JobStatus.OPEN:
                return
            self._sleep()

    def ensure_attested(self) -> str | None:
        """Before joining a teeRequired job: None when our recorded attestation counts for
        another `ATTEST_MARGIN_S` at least, or after obtaining and submitting a fresh one;
        else why we cannot attest."""
        if not self.cfg.tee:
            return "the job requires a TEE attestation: run with --tee"
        now = self.bsm.latest_block_timestamp()
        have = self.bsm.attestation_of(self.me)
        if have.valid and have.expires_at > now + ATTEST_MARGIN_S:
            return None
        try:
            if self.cfg.attestation_file is not None:
                answer = attest_service.load_answer(self.cfg.attestation_file)
            else:
                answer = attest_service.obtain(
                    self.cfg.attestation_service or "",
                    self.bsm,
                    self.me,
                    self.transport.peer_key,
                    self.cfg.tsm_root,
                )
            attest_service.submit(self.bsm, answer)
        except DtrainError as exc:
            return f"TEE attestation failed: {exc}"
        got = self.bsm.attestation_of(self.me)
        self._metric("attested", verifier=got.verifier, expires=got.expires_at)
        return None

    def _pick_job(self) -> int | None:
        """--auto: the first open or running job with room that pays at least our ask, whose
        epochs are long enough for us to finish them and whose seat bond our free self-stake
        covers; None when asked to leave first."""
        while not self.leave_requested.is_set():
            free = self._free_stake()
            for j in self.bsm.jobs():
                if self._acceptable(j, free):
                    return j.id
            self._sleep()
        return None

    def _acceptable(self, j: Job, free_stake: int) -> bool:
        passed = self._passed_by(j, free_stake)
        if passed is not None and passed[0]:
            self._passed[j.id] = passed  # told to its caller once we run a host
        return passed is None

    def _passed_by(self, j: Job, free_stake: int) -> tuple[str, str] | None:
        """None when we take the job, else (reason, why): a key of notes.REASONS, or "" when
        it is no refusal of ours (the job ended or is full, the chain's windows do not fit)."""
        s = j.spec
        # where seats are drawn, a job takes applicants beyond its seats (a running job's
        # queue waits for the vacancies drawn at its boundaries)
        drawing = self._params().seat_draw_window > 0
        seats = MAX_APPLICANTS if drawing else s.max_operators
        room = len(j.members) + len(j.pending_joins) < seats
        live = j.state.status in (JobStatus.OPEN, JobStatus.RUNNING)
        if not (live and room and reveal_window_fits(self._params().reveal_window)):
            return ("", "")
        if s.tee_required and not self.cfg.tee:
            return ("tee", "the job requires a TEE attestation: run with --tee")
        if not asks.pays_our_ask(self.bsm, self.me, j, self.cfg.min_price or 0):
            return ("ask", "the job's price is below our ask")
        need = epoch_seconds_needed(s.steps_per_epoch, s.sync_interval, self.cfg.step_s)
        if s.epoch_duration < need:
            return ("capacity", f"an epoch of {s.epoch_duration} s, we need {need:.0f} s")
        if s.seat_bond > free_stake:
            return ("capacity", f"seat bond {format_eth(s.seat_bond)} above our free stake")
        why = self._preflight(j)  # last: it reads the dataset and builds the model
        return None if why is None else ("preflight", why)

    def _sync_ask(self) -> None:
        """`--min-price` is our ask in ether on chain: set it when it differs, and say so."""
        was = asks.sync_ether_ask(self.bsm, self.bsm.operator(self.me), self.cfg.min_price)
        if was is not None:
            self._metric("ask_updated", was=was, ask=self.cfg.min_price)

    def _free_stake(self) -> int:
        """Self-stake our seats have not bonded: what a new seat's bond must fit in. Before
        registering, the stake we will register with; `register` tops it up to the minimum."""
        registered = self.bsm.operator(self.me).registered
        have = self.bsm.stake_of(self.me, self.me) if registered else self.cfg.stake
        return max(have, self._params().min_stake) - self.bsm.bonded_of(self.me)

    def _params(self) -> Params:
        if self._params_cache is None:
            self._params_cache = self.bsm.params()
        return self._params_cache

    # ------------------------------------------------------------------ epochs

    def train_job(self, job_id: int) -> dict[str, Any]:
        while True:
            self._check_stop()
            job = self.bsm.job(job_id)
            self._observe(job)
            if job.state.status.is_ended:
                return self.done(job)
            if job.state.status != JobStatus.RUNNING or self.me not in job.members:
                if self.me not in job.members and self.me not in job.pending_joins:
                    drawn_out = self._applied and job.state.status == JobStatus.RUNNING
                    self._metric("not_drawn" if drawn_out else "not_a_member", job=job_id)
                    return {"left": True, "job": job_id}
                self._enter("WAIT", f"job {job_id} has not started an epoch with us yet")
                if self.leave_requested.is_set():
                    return self._leave_now(job)
                self._fail_if_abandoned(job)
                self._draw_if_due(job)
                self._sleep()
                continue
            if not job.deadline:
                # a running epoch always has a deadline: this read met a block being mined
                # (seen on anvil), so read again rather than find the commit deadline passed
                self._sleep()
                continue
            self._pool()
            self._leave_if_asked(job)
            sub = self.bsm.submission_of(job_id, self.me, job.block)
            self.status.committed, self.status.revealed = any(sub.commitment), any(sub.checkpoint)
            if not self.status.committed and (job_id, job.state.attempt) not in self._lost:
                self.commit(job)
            self.reveal(job)
            since = self._attempt_seen.setdefault((job_id, job.state.attempt), job.block)
            self.finalize(job_id, job.state.attempt, since, job.state.epoch)

    def _leave_now(self, job: Job) -> dict[str, Any]:
        """Asked to leave while the job runs no epoch with us (a pending seat, or a seat in an
        Open job): the seat and its bond are given back at once."""
        try:
            self.bsm.leave_job(job.id)
            self._metric("left", job=job.id)
        except ContractError as exc:
            log.info("leave not taken: %s", exc)  # already leaving, or no longer a member
        return {"left": True, "job": job.id}

    def _pool(self) -> None:
        """Our pool's assets, for what a dropout slash would take (once per epoch)."""
        try:
            pool = self.bsm.pool(self.me)
            self.status.pool = pool.total_assets + pool.unbonding_assets
        except (ContractError, TransactionFailed, ValueError):
            self.status.pool = 0

    def _faults(self, st: JobState) -> Faults:
        """The faults active in this epoch attempt (`once`: only in the first one we saw)."""
        retry = self._first_attempt.setdefault(st.epoch, st.attempt) != st.attempt
        return self.cfg.faults.active(st.epoch, retry)

    def commit(self, job: Job) -> None:
        """TRAIN the epoch attempt (or find it unworkable), persist the vote, COMMIT to it. A
        vote saved by an earlier run of this node (killed before its commit) is committed
        as it is: never trained again, never a second salt."""
        st = job.state
        path = vote.path(self.job_dir(job.id), st.attempt)
        mine = vote.load(path)
        if mine is None:
            if time.time() > job.deadline:
                self._metric("commit_missed", job=job.id, epoch=st.epoch, deadline=job.deadline)
                return
            try:
                mine = self._vote(job)
            except EpochLost:
                return  # no vote: we announced our leave (`_give_up`)
            vote.save(path, mine)  # before the commit: a restarted node must still reveal
        self._enter("COMMIT", format_epoch(st.epoch, job.spec.total_epochs))
        try:
            self.bsm.commit_checkpoint(job.id, st.epoch, mine.commitment(job.id, st.epoch, self.me))
            self.status.committed = True
            self._metric(
                "committed",
                job=job.id,
                epoch=st.epoch,
                checkpoint=mine.checkpoint.hex(),
                unworkable=mine.is_unworkable,
            )
        except ContractError as exc:
            # The deadline passed or the epoch moved on: the chain has the last word.
            self._metric("commit_skipped", job=job.id, reason=str(exc))

    def _vote(self, job: Job) -> Vote:
        """Our vote for the attempt: the trained checkpoint and participation, or UNWORKABLE
        when the job's dataset or start model is unavailable or fails its hash."""
        self._enter("START", format_epoch(job.state.epoch, job.spec.total_epochs))
        trainer = EpochTrainer(self._epoch_env(job.id), job, self._faults(job.state))
        try:
            trainer.prepare()
        except UNWORKABLE_ERRORS as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.warning("job %s epoch %s cannot be done: %s", job.id, job.state.epoch, reason)
            self._metric("unworkable", job=job.id, epoch=job.state.epoch, reason=reason)
            return Vote.unworkable(len(job.members))
        self._enter("TRAIN", f"{self.status.rounds} sync rounds")
        digest, participation = trainer.train()
        for proof in trainer.equivocations:
            self._report_equivocation(job, proof)
        file = evidence.path(self.job_dir(job.id), job.state.attempt)
        shun = self._faults(job.state).shun
        if shun is not None and file.is_file() and job.state.epoch == 0:
            digest, participation, file = self._shunned(job, file, shun)
        if self._faults(job.state).stall:
            log.warning("fault: naming a transcript file nobody has")
            return Vote.fresh(digest, participation, os.urandom(32))
        return Vote.fresh(digest, participation, sha256_file(file) if file.is_file() else bytes(32))

    def _shunned(self, job: Job, file: Path, shun: str) -> tuple[bytes, list[int], Path]:
        """Fault `shun`: our transcript without `shun`'s packets, served under its sha256, and
        the vote it re-executes to (a first epoch: from the job's start model)."""
        t = evidence.load(file)
        rounds = tuple(tuple(p for p in packets if p.sender != shun) for packets in t.rounds)
        out = file.with_name(f"shun-{t.attempt}.bin")
        out.write_bytes(dataclasses.replace(t, rounds=rounds).encode())
        digest, participation = recompute(referee.attempt(self.cfg, job), evidence.load(out))
        if self.transport is not None:
            self.transport.serve_file(sha256_file(out).hex(), out)
        log.warning("fault: voting our transcript without the packets of %s", shun)
        return digest, participation, out

    def _report_equivocation(self, job: Job, proof: Equivocation) -> None:
        """Posts a member's two signed packets of one round; the chain slashes it when the
        epoch settles. Someone else may have posted it first: that is fine."""
        try:
            self.bsm.report_equivocation(job.id, proof.first, proof.second)
        except (ContractError, TransactionFailed) as exc:
            self._metric(
                "equivocation_not_reported", job=job.id, sender=proof.sender, reason=str(exc)
            )
            return
        self._metric("equivocation_reported", job=job.id, round=proof.round, sender=proof.sender)

    def reveal(self, job: Job) -> None:
        """REVEAL our committed vote once reveals open (every member committed, or the commit
        deadline passed), before the reveal deadline; nothing when we committed nothing or
        revealed already (restart)."""
        st = job.state
        if not self._faults(st).reveals:
            self._metric("fault_no_reveal", job=job.id, epoch=st.epoch, attempt=st.attempt)
            return
        mine = vote.load(vote.path(self.job_dir(job.id), st.attempt))
        self._serve_transcript(job, mine)
        self._enter("REVEAL", "once every member committed or the commit deadline passed")
        while True:
            self._check_stop()
            now = self.bsm.job(job.id)
            if now.state.status != JobStatus.RUNNING or now.state.attempt != st.attempt:
                return
            self._leave_if_asked(now)
            sub = self.bsm.submission_of(job.id, self.me, now.block)
            if not any(sub.commitment) or any(sub.checkpoint):
                return
            if mine is None or mine.commitment(job.id, st.epoch, self.me) != bytes(sub.commitment):
                self._metric("reveal_impossible", job=job.id, epoch=st.epoch)
                return
            # A chain that mines only on transactions (anvil) has a stale latest block; the
            # reveal itself gets a fresh timestamp, so go by the wall clock too.
            block_ts = self.bsm.latest_block_timestamp()
            t = max(block_ts, int(time.time()))
            if t > now.reveal_deadline:
                self._metric("reveal_missed", job=job.id, epoch=st.epoch)
                return
            everyone = now.committed == len(now.members)
            if everyone or t > now.deadline:
                # Open by the wall clock only: skip gas estimation at the stale block time.
                gas = None if everyone or block_ts > now.deadline else REVEAL_GAS
                if self._send_reveal(now, mine, gas):
                    return
            self._sleep()

    def _serve_transcript(self, job: Job, mine: Vote | None) -> None:
        """Serves the transcript file our vote names and the attempt's private states we
        kept, also after a restart: a challenge's referees fetch the file by that sha256 to
        judge our vote against it, and a state by the digest we signed when a replay claim
        names it (a state not served to them in time catches us)."""
        if self.transport is None:
            return
        if (job.id, job.state.attempt) not in self._states_served:
            self._states_served.add((job.id, job.state.attempt))
            spotcheck.StateRing(self.job_dir(job.id), job.state.attempt, self.transport.serve_file)
        file = evidence.path(self.job_dir(job.id), job.state.attempt)
        if mine is None or not any(mine.transcript) or not file.is_file():
            return
        if sha256_file(file) == mine.transcript:
            self.transport.serve_file(mine.transcript.hex(), file)

    def _send_reveal(self, job: Job, mine: Vote, gas: int | None) -> bool:
        epoch = job.state.epoch
        try:
            self.bsm.reveal_checkpoint(
                job.id,
                epoch,
                mine.checkpoint,
                list(mine.participation),
                mine.transcript,
                mine.salt,
                gas=gas,
            )
        except (ContractError, TransactionFailed) as exc:
            log.info("reveal not taken yet: %s", exc)  # reveals not open on chain yet
            return False
        self.status.revealed = True
        self._metric("revealed", job=job.id, epoch=epoch, checkpoint=mine.checkpoint.hex())
        return True

    def _epoch_env(self, job_id: int) -> EpochEnv:
        return EpochEnv(
            cfg=self.cfg,
            me=self.me,
            transport=self.transport,
            checkpoints=self.checkpoints(job_id),
            job_dir=self.job_dir(job_id),
            metric=self._metric,
            between_rounds=self._between_rounds,
            give_up=self._give_up,
            connect=self._connect,
            chain_id=self.bsm.chain_id,
            sync_threshold_bps=self._params().sync_threshold_bps,
        )

    def _between_rounds(self, job: Job) -> None:
        self._check_stop()
        self._leave_if_asked(job)

    def _give_up(self, job: Job, why: str) -> None:
        """The epoch is lost to us (our vote would be late, or our packets missed too many
        rounds): say why, and announce our leave while the deadline is ahead, so our silence
        is no dropout (docs/contract.md). We still follow the rounds, serve our states and see
        the epoch settle."""
        st = job.state
        log.warning(
            "job %s epoch %s lost: %s; training stopped, leaving the job at the boundary "
            "(this epoch unpaid, our stake kept)",
            job.id,
            st.epoch,
            why,
        )
        self.status.lost = why
        self._lost.add((job.id, st.attempt))
        if self.status.leaving:
            return
        try:
            if not self.bsm.is_leaving(job.id, self.me):
                self.bsm.leave_job(job.id)
            self.status.leaving = True
            self._metric("leaving", job=job.id, epoch=st.epoch, attempt=st.attempt, why=why)
        except (ContractError, TransactionFailed) as exc:
            log.warning("leave not announced: %s", exc)

    def _leave_if_asked(self, job: Job) -> None:
        """Ctrl-C once: announce the leave now; it applies at the next boundary."""
        if not self.leave_requested.is_set() or self.status.leaving:
            return
        if not self.bsm.is_leaving(job.id, self.me):
            self.bsm.leave_job(job.id)
            self._metric("leaving", job=job.id, epoch=job.state.epoch)
        self.status.leaving = True

    def _fail_if_abandoned(self, job: Job) -> None:
        """A job that ran and then lost members waits Open, unpaid, with our seat bond held;
        once it has waited the open timeout anyone may fail it (the caller gets the escrow
        back, our bond is released)."""
        st = job.state
        if st.status != JobStatus.OPEN or st.attempt == 0 or self.me not in job.members:
            return
        if time.time() <= st.epoch_start + self._params().open_timeout:
            return
        try:
            self.bsm.cancel_job(job.id)
            self._metric("failed_open_job", job=job.id, epoch=st.epoch)
        except (ContractError, TransactionFailed):
            pass  # failed by someone else, or the chain's clock is not there yet

    def _draw_if_due(self, job: Job) -> None:
        """Seats by stake: we applied to an Open job whose draw is scheduled; once it is due,
        any applicant seals the draw, and once the next block is mined draws the seats (which
        starts the epoch): one call per poll, each sent with fixed gas (a call that lands in
        the seed block itself reverts and mines it, on a chain that mines on transactions)."""
        if job.state.status != JobStatus.OPEN or self.me not in job.members:
            return
        self._applied = True
        at = self.bsm.seat_draw_at(job.id)
        if at == 0 or time.time() < at:
            return
        try:
            # fixed gas: an estimate against a block stamped before `at` would revert
            self.bsm.draw_seats(job.id, gas=DRAW_SEATS_GAS)
            drawn = self.bsm.job(job.id).state.status != JobStatus.OPEN
            self._metric("seats_drawn" if drawn else "seat_draw_sealed", job=job.id)
        except (ContractError, TransactionFailed):
            pass  # drawn by another applicant, or the chain's clock is not there yet

    def _window(self) -> int:
        return self._params().challenge_window

    def finalize(self, job_id: int, attempt: int, since: int = 0, epoch: int | None = None) -> None:
        """FINALIZE once every member revealed or the reveal deadline passed, and the
        certified vote is past its challenge window (or its challenge resolved): a certified
        vote that is not ours is challenged first (operator/challenger.py). Settled by someone
        else, the settlement of `epoch` (the attempt's; and our slash, if any) is read from the
        chain from block `since`: read now, the job may already be past that epoch."""
        self._enter("FINALIZE", "once every member revealed or the reveal deadline passed")
        state = self.bsm.job(job_id).state
        epoch = state.epoch if epoch is None else epoch
        f = self._faults(state)
        tamper = "doctor" if f.doctor else "inject" if f.inject else ""
        serve = self.transport.serve_file if self.transport is not None else None
        challenger = Challenger(
            self.bsm,
            self.job_dir(job_id),
            self._metric,
            self._window(),
            serve,
            tamper,
            # a colluder never disputes the coalition's quorum, not even with a replay claim
            # on a fellow colluder that stalled its check
            quiet=not f.reveals or f.collude,
        )
        mine = False  # we sent the settlement: its line is logged from our receipt
        while True:
            self._check_stop()
            job = self.bsm.job(job_id)
            if job.state.status != JobStatus.RUNNING or job.state.attempt != attempt:
                return None if mine else self._settled_elsewhere(job_id, epoch, since)
            self._leave_if_asked(job)
            # As in `reveal`: the finalize transaction gets a fresh timestamp.
            block_ts = self.bsm.latest_block_timestamp()
            all_in = job.revealed == len(job.members)
            if all_in or max(block_ts, int(time.time())) > job.reveal_deadline:
                if not challenger.ready(job, attempt):
                    self._sleep()
                    continue
                # a challenge window passes on the wall clock before a block shows it
                stale = challenger.window > 0 or (not all_in and block_ts <= job.reveal_deadline)
                gas = FINALIZE_GAS if stale else None
                try:
                    rc = self.bsm.finalize_epoch(job_id, job.state.epoch, gas=gas)
                    self._metric(
                        "finalized",
                        job=job_id,
                        epoch=job.state.epoch,
                        events=[e.name for e in rc.events if e.name in SETTLE_EVENTS],
                        slashed=slashes(rc.events),
                    )
                    mine = True
                except (ContractError, TransactionFailed):
                    # Someone else finalized first, or the chain's clock is not there yet.
                    self._sleep()
                continue
            self._sleep()

    def _settled_elsewhere(self, job_id: int, epoch: int, since: int) -> None:
        """The `finalized` record (and line) of an epoch another account settled: every
        member hears what it was paid or slashed, not only the one that sent the finalize."""
        got = settled_by_other(self.bsm, job_id, epoch, since)
        if got is not None:
            events, slashed = got
            self._metric(
                "finalized", job=job_id, epoch=epoch, events=events, slashed=slashed, by="other"
            )

    # ------------------------------------------------------------------ checkpoints

    def checkpoints(self, job_id: int) -> Checkpoints:
        return Checkpoints(self.job_dir(job_id), self.me, self.transport, self._peers, self._metric)

    def _peers(self, members: Sequence[str]) -> list[PeerSpec]:
        return peer_specs(self.bsm, members)

    def _connect(self, members: list[str]) -> None:
        others = [m for m in members if m != self.me]
        self.transport.connect(self._peers(others))

    # ------------------------------------------------------------------ the end

    def done(self, job: Job) -> dict[str, Any]:
        """DONE: the job ended; serve (and export) the final checkpoint when we hold it, and
        every finalized epoch's we hold: a cancelled or failed job's paid epochs stay
        fetchable, its last one kept for its caller as a completed job's final one is."""
        self._enter("DONE", f"job {job.id} {job.state.status.name.lower()}")
        result: dict[str, Any] = {
            "job": job.id,
            "status": job.state.status.name.lower(),
            "checkpoint": job.state.checkpoint.hex(),
        }
        ckpts = self.checkpoints(job.id)
        if job.final_epoch is not None:
            result["serving"] = ckpts.serve_final(job, self.cfg.source_cache()) is not None
            out = (
                ckpts.export(job, self.cfg.source_cache())
                if self.cfg.export and result["serving"]
                else None
            )
            if out is not None:
                result["export"] = str(out)
        finalized = self.bsm.events(names=["EpochFinalized"], job_id=job.id)
        hashes = {int(e.args["epoch"]): bytes(e.args["checkpoint"]) for e in finalized}
        result["epochs_served"] = ckpts.serve_epochs(hashes)  # final: adopted
        self._metric("job_done", **result)
        return result

    def collect_earnings(self, job_id: int | None = None) -> None:
        """Claims this operator's pool rewards (ether and every token at once) and withdraws
        its ether credit and, for a job escrowed in a token, its credit in that token."""
        token = self.bsm.job_token(job_id) if job_id is not None else None
        pending = self.bsm.pending_rewards(self.me, self.me)
        if token:
            pending += self.bsm.pending_token_rewards(token, self.me, self.me)
        if pending:
            self.bsm.claim_rewards(self.me)
        credit = self.bsm.credit_of(self.me)
        if credit:
            self.bsm.withdraw()
            self._metric("withdrew", amount=credit)
        if token and (owed := self.bsm.token_credit_of(token, self.me)):
            self.bsm.withdraw_token(token)
            t = erc20.contract(self.bsm.w3, token)
            decimals, symbol = t.functions.decimals().call(), t.functions.symbol().call()
            text = erc20.format_units(owed, int(decimals), str(symbol))
            self._metric("withdrew", amount=owed, token=token, text=text)

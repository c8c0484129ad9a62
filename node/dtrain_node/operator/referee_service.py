"""`dtrain node referee`: a registered operator outside a job re-executes its challenged epochs.

Nobody applies to judge: when a challenge opens, the contract fixes every registered operator's
weight, and the hash of the next block draws the referees among the outsiders
(`drawReferees`, which any referee sends once that block exists). For every `Challenged`
event it sees, the referee draws (or reads the draw) and, if drawn, fetches the transcript
files the challenger and the attempt's voters named (each vote names the file it was made
from, `CheckpointRevealed`; voters may name more, `TranscriptPosted`), from the challenger
and the epoch's members over
the same p2p file protocol that serves checkpoints, and, for an epoch after the first, its
start checkpoint by hash; it checks every packet of every file against its sender's signed
commitment (a file that fails is left out) and re-executes by aggregation alone
(`referee.check`):
- each voter's own file: a voter whose file leads to its vote is consistent, and is paid
  whatever the verdict (which packets reached whom in time cannot be proven after the epoch);
- the verdict: the certified vote when one of its voters is consistent, else the union of
  every file (`evidence.union`): a challenger that leaves packets out of its file is outvoted
  by the files of the members that saw them.
It commits the (checkpoint, participation, consistent voters) it got, reveals it once every
referee committed or the commit phase ended, and resolves the challenge once every referee
revealed or the reveal phase ended. A referee not drawn does no work for the challenge.

Every phase boundary is on the chain's clock; on a chain that mines only on transactions the
latest block can be older than the wall clock, so phase transactions are sent without
estimation (`GAS`) once the wall clock says the phase is open.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eth_account import Account

from dtrain import UNWORKABLE, commitment_hash, findings, new_salt, vote_key
from dtrain.errors import ContractError, DtrainError, RpcUnavailable, TransactionFailed
from dtrain_node.errors import CheckpointUnavailable, NodeError, TranscriptInvalid
from dtrain_node.operator import referee
from dtrain_node.operator.transport import peer_specs
from dtrain_node.optim import codec
from dtrain_node.verify import claims, evidence, fraudcheck

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from dtrain.client import BSM
    from dtrain_node.operator.config import NodeConfig

log = logging.getLogger(__name__)

GAS = 5_000_000  # above a draw's 64 tries per seat at 31 referees and a 31-referee resolve
POLL_S = 0.5
STALL_S = 2.0  # a head that has not moved this long: the chain mines only on transactions
SEND_TRIES = 10  # a phase's transaction, sent POLL_S apart: the chain's clock lags by a second
FETCH_TIMEOUT_S = 60.0
FETCH_WORKERS = 16  # named files fetched at once, the votes' and the challenge's first


@dataclass(frozen=True)
class Case:
    """One challenge: what the `Challenged` event and the chain at its block say."""

    job_id: int
    epoch: int
    attempt: int
    challenger: str
    transcript: bytes
    members: tuple[str, ...]
    start: bytes  # the epoch's start checkpoint hash


@dataclass
class Memo:
    """What one challenge's passes found: each delivered file read once, each voter's file and
    each union re-executed once (the early pass's work is the final pass's)."""

    read: dict[bytes, Any] = field(default_factory=dict)
    done: dict[Any, Any] = field(default_factory=dict)
    files: int = 0  # voters' files re-executed
    unions: int = 0  # unions re-executed
    claims: dict[str, str] = field(default_factory=dict)  # "member/round/checker" -> finding

    def once(self, key: Any, work: Callable[[], Any], count: str = "") -> Any:
        """`work()`'s result, computed on the first call with `key`, counted in the counter
        named `count` (if any); an exception is not kept."""
        if key not in self.done:
            self.done[key] = work()
            if count:
                setattr(self, count, getattr(self, count) + 1)
        return self.done[key]


class RefereeService:
    def __init__(self, bsm: BSM, cfg: NodeConfig, metric: Callable[..., None]) -> None:
        self.bsm, self.cfg, self.metric = bsm, cfg, metric
        self.me = bsm.sender
        self.window = bsm.params().challenge_window
        self.done: set[tuple[int, int]] = set()
        # (job, attempt) -> (checkpoint, participation, findings, salt) we commit to; committed
        self._sealed: dict[tuple[int, int], tuple[bytes, tuple[int, ...], int, bytes]] = {}
        self._committed: set[tuple[int, int]] = set()
        self._memos: dict[tuple[int, int], Memo] = {}

    def run(self, stop: threading.Event, from_block: int = 0) -> None:
        """Referees every challenge from `from_block` on until `stop` is set, each in a thread
        of its own (a challenge's phases take three windows; another may open meanwhile)."""
        threads: list[threading.Thread] = []
        while not stop.is_set():
            try:
                head = self.bsm.w3.eth.block_number
                new = [] if head < from_block else self._challenged(from_block, head)
                cases = [self._case(e) for e in new]
            except RpcUnavailable as exc:  # a drawn referee that exits is slashed for dropout
                log.warning("%s: polling the chain again in %.1f s", exc, POLL_S)
                stop.wait(POLL_S)
                continue
            for case in cases:
                if (case.job_id, case.attempt) not in self.done:
                    self.done.add((case.job_id, case.attempt))
                    t = threading.Thread(target=self._judge_safely, args=(case, stop), daemon=True)
                    t.start()
                    threads.append(t)
            from_block = max(from_block, head + 1)
            stop.wait(POLL_S)
        for t in threads:
            t.join(timeout=5)

    def _challenged(self, first: int, last: int) -> list[Any]:
        return self.bsm.events(names=["Challenged"], from_block=first, to_block=last)

    def _case(self, e: Any) -> Case:
        job = self.bsm.job(e.args["jobId"], block=e.block)
        return Case(
            job.id,
            e.args["epoch"],
            job.state.attempt,
            e.args["challenger"],
            bytes(e.args["transcript"]),
            tuple(job.members),
            job.state.checkpoint,
        )

    def _judge_safely(self, case: Case, stop: threading.Event) -> None:
        """`judge`, taken up again when the RPC fails on the way (a drawn referee that gives
        up is slashed as a no-show): the verdict it committed to is revealed as committed."""
        while True:
            try:
                self.judge(case, stop)
                return
            except RpcUnavailable as exc:
                log.warning("job %d attempt %d: %s; judging on", case.job_id, case.attempt, exc)
                if stop.wait(POLL_S):
                    return
            except (DtrainError, NodeError) as exc:  # unreadable file, unavailable data
                log.warning("job %d attempt %d: not refereed: %s", case.job_id, case.attempt, exc)
                self.metric("referee_failed", job=case.job_id, attempt=case.attempt, error=str(exc))
                return

    def judge(self, case: Case, stop: threading.Event) -> None:
        ch = self.bsm.challenge_of(case.attempt)
        if ch.resolved or not self._drawn(case, stop):
            return
        key = (case.job_id, case.attempt)
        # taken up again after an RPC failure: the work done is kept, and we reveal what we
        # committed to
        opened, memo, began = ch.opened_at, self._memos.setdefault(key, Memo()), time.monotonic()
        fetch_by = opened + 1.5 * self.window  # the commit phase's second half re-executes
        self._prepare(case, memo, fetch_by, began)
        self._until(stop, lambda: self._now() >= opened + self.window)
        checkpoint, participation, consistent, caught = self._verdict(case, memo, fetch_by)
        judged = findings(consistent, caught)
        judged_s = round(time.monotonic() - began, 3)
        if self._now() >= opened + 2 * self.window:
            self.metric("referee_late", job=case.job_id, attempt=case.attempt, judged_s=judged_s)
        sealed = self._sealed.setdefault(key, (checkpoint, participation, judged, new_salt()))
        checkpoint, participation, judged, salt = sealed
        if key not in self._committed:
            bits = judged.to_bytes(32, "big")
            c = commitment_hash(*(case.job_id, case.epoch, self.me), *sealed[:2], bits, salt)
            commit = functools.partial(self.bsm.commit_verdict, *key[:1], case.epoch, c, gas=GAS)
            if not self._sent(stop, case, commit, opened + 2 * self.window):
                self.metric("referee_not_drawn", job=case.job_id, attempt=case.attempt)
                return
            self._committed.add(key)
        self._until(stop, lambda: self._phase_done(case, opened, "committed", 2))
        reveal = functools.partial(
            self.bsm.reveal_verdict,
            *(case.job_id, case.epoch, checkpoint, participation, judged, salt),
            gas=GAS,
        )
        if not self._sent(stop, case, reveal, opened + 3 * self.window):
            self.metric("referee_late", job=case.job_id, attempt=case.attempt, judged_s=judged_s)
            return
        self.metric(
            "verdict",
            job=case.job_id,
            epoch=case.epoch,
            attempt=case.attempt,
            checkpoint=checkpoint.hex(),
            participation=list(participation),
            consistent=[case.members[i] for i in consistent],
            caught=[case.members[i] for i in caught],
            judged_s=judged_s,
            reexecuted=memo.files,
            unions=memo.unions,
            claims=dict(memo.claims),
        )
        self._until(stop, lambda: self._phase_done(case, opened, "revealed", 3))
        with contextlib.suppress(ContractError, TransactionFailed):  # resolved by another
            self.bsm.resolve_challenge(case.job_id, case.epoch, gas=GAS)

    def _prepare(self, case: Case, memo: Memo, fetch_by: float, began: float) -> None:
        """The votes' and the challenge's files are known when we are drawn: fetched and
        re-executed while the first phase runs, a slow machine has two windows for them, not
        one. Members may name more until the phase ends; after it, only those cost anything
        (`memo`)."""
        try:
            self._verdict(case, memo, fetch_by)
        except (DtrainError, NodeError) as exc:
            log.info(
                "job %d: early re-execution failed, again after the phase: %s", case.job_id, exc
            )
            return
        judged_s = round(time.monotonic() - began, 3)
        self.metric("verdict_prepared", job=case.job_id, attempt=case.attempt, judged_s=judged_s)

    def _sent(
        self, stop: threading.Event, case: Case, send: Callable[[], Any], closes: float
    ) -> bool:
        """`send()` a phase's transaction until the chain takes it: the wall clock said the
        phase opened, and a block the chain dates a second earlier refuses it. False when we
        were not drawn, the phase closed or SEND_TRIES reverted (a refusal that is not the
        clock's costs a few reverted transactions, not one per poll until the phase closes)."""
        for tries in range(1, SEND_TRIES + 1):
            try:
                send()
                return True
            except (ContractError, TransactionFailed) as exc:
                refs = self.bsm.challenge_of(case.attempt).referees
                late = self._now() >= closes or tries == SEND_TRIES
                if (refs and self.me not in refs) or late:
                    log.info("job %d: not drawn as a referee, or late (%s)", case.job_id, exc)
                    return False
            if stop.wait(POLL_S):
                raise DtrainError("stopped while refereeing")
        return False

    def _verdict(
        self, case: Case, memo: Memo, fetch_by: float
    ) -> tuple[bytes, tuple[int, ...], list[int], list[int]]:
        """UNWORKABLE when the job's own files prove that nobody can train it (nobody is then
        consistent or caught). Else the verdict, the voters whose own files lead to their
        votes, and the members a named replay claim proves false (`fraudcheck`). The verdict:
        the certified vote when one of its voters is consistent (a file holding a packet nobody
        applied, signed after the fact, cannot turn an honest quorum into fabricators); else
        the (checkpoint, participation) the union of the delivered files leads to (a packet
        nobody delivered counts as absent: with no file, every round is empty). Only the
        voters' own files and the union are re-executed: a file only posted adds its packets to
        the union, so naming many files costs a referee one more file to read, not an epoch."""
        job = self.bsm.job(case.job_id)
        why = memo.once("unworkable", lambda: referee.unworkable(job, self.cfg))
        if why is not None:
            log.info("job %d epoch %d: unworkable, proven: %s", case.job_id, case.epoch, why)
            return UNWORKABLE, tuple(0 for _ in case.members), [], []
        votes = self._votes(case)
        named: dict[bytes, set[str]] = {case.transcript: {case.challenger}}
        for who, sha in [*self._posted(case), *((m, v[1]) for m, v in votes.items())]:
            named.setdefault(sha, set()).add(who)
        own = {sha for _, sha in votes.values()}
        with self._host(case, fetch_by) as (fetch, work):
            first = {case.transcript, *own}
            files, found, start = self._evidence(case, named, first, fetch, work, memo)
            led = {
                sha: v
                for sha, (_, t) in files.items()
                if sha in own
                and (v := memo.once(sha, lambda t=t: self._leads_to(t, start), "files"))
            }
            consistent = [
                i
                for i, m in enumerate(case.members)
                if m in votes and votes[m][1] in led and led[votes[m][1]][0] == votes[m][0]
            ]
            key, checkpoint, participation, union = self._decide(
                case, votes, files, led, start, memo
            )
            agreed = [(sha, files[sha][1]) for sha, v in led.items() if v[0] == key]
            agreed += [(frozenset(files), u) for u in union]
            caught = self._caught(case, job, found, agreed, start, (fetch, work), memo)
        return checkpoint, participation, consistent, caught

    def _decide(
        self,
        case: Case,
        votes: dict[str, tuple[bytes, bytes]],
        files: dict[bytes, tuple[set[str], evidence.EpochTranscript]],
        led: dict[bytes, tuple[bytes, bytes, tuple[int, ...]]],
        start: Path | None,
        memo: Memo,
    ) -> tuple[bytes, bytes, tuple[int, ...], list[evidence.EpochTranscript]]:
        """(vote key, checkpoint, participation) of the verdict (see `_verdict`), and the union
        it was re-executed from, if it was."""
        certified = self.bsm.challenge_of(case.attempt).certified_key
        for key, sha in votes.values():
            if key == certified and sha in led and led[sha][0] == key:
                log.info("job %d: a certified voter's own file leads to its vote", case.job_id)
                return (*led[sha], [])
        ts = [t for _, t in files.values()]
        if ts:
            u = evidence.union(ts)
        else:
            job = self.bsm.job(case.job_id)
            u = referee.empty(job, case.epoch, case.attempt, *self._chain())
        v = memo.once(
            frozenset(files), lambda: referee.check(self.bsm, self.cfg, u, start), "unions"
        )
        log.info(
            "job %d epoch %d: the transcripts lead to 0x%s",
            case.job_id,
            case.epoch,
            v.recomputed.hex()[:16],
        )
        return vote_key(v.recomputed, v.participation), v.recomputed, v.participation, [u]

    def _caught(
        self,
        case: Case,
        job: Any,
        found: list[claims.Claim],
        agreed: list[tuple[Any, evidence.EpochTranscript]],
        start: Path | None,
        host: tuple[Any, Path],
        memo: Memo,
    ) -> list[int]:
        """Indices of the members a named claim proves false, re-run on a file that leads to
        the verdict (the shared state the members trained from), each (claim, file) once.
        The member's private state is fetched for half a phase (`fraudcheck`), with no
        regard to `fetch_by`: a state the referee ran out of time for would count as
        withheld."""
        fetch, work = host
        out: set[int] = set()
        tensors = None if start is None else referee.start_tensors(start, case.start)

        def state(sha: str, who: str, dest: Path, within_s: float, most: int) -> Path:
            return fetch(sha, who, dest, within_s=within_s, max_bytes=most)

        for c in found:
            key, t = next(((k, t) for k, t in agreed if fraudcheck.applies(c, t)), (None, None))
            if t is None or c.member not in case.members:
                continue
            i = case.members.index(c.member)
            if i in out:
                continue
            finding = memo.once(
                (c, key),
                # half a phase for the state: the files and the re-execution need the rest
                lambda c=c, t=t: fraudcheck.caught(
                    referee.attempt(self.cfg, job, tensors), c, t, state, work, self.window / 2
                ),
            )
            memo.claims[f"{c.member}/{c.round}/{c.checker}"] = finding
            if finding == fraudcheck.CAUGHT:
                out.add(i)
        return sorted(out)

    def _leads_to(
        self, t: evidence.EpochTranscript, start: Path | None
    ) -> tuple[bytes, bytes, tuple[int, ...]] | None:
        """(vote key, checkpoint, participation) that transcript `t` re-executes to; None for
        a file of another job, attempt or epoch (it leads to no vote of this one)."""
        try:
            v = referee.check(self.bsm, self.cfg, t, start)
        except TranscriptInvalid as exc:
            log.info("transcript left out: %s", exc)
            return None
        return vote_key(v.recomputed, v.participation), v.recomputed, v.participation

    def _votes(self, case: Case) -> dict[str, tuple[bytes, bytes]]:
        """member -> (vote key, sha256 of the transcript file its vote names) of every
        checkpoint vote revealed in the attempt (UNWORKABLE names no file)."""
        out = {}
        for e in self.bsm.events(names=["CheckpointRevealed"], job_id=case.job_id):
            key, sha = bytes(e.args["voteKey"]), bytes(e.args["transcript"])
            if e.args["epoch"] != case.epoch or key == UNWORKABLE or not any(sha):
                continue
            if self.bsm.job(case.job_id, block=e.block).state.attempt == case.attempt:
                out[e.args["operator"]] = (key, sha)
        return out

    def _drawn(self, case: Case, stop: threading.Event) -> bool:
        """Whether we are a referee of the challenge, drawing them first if nobody did, within
        the first phase. The draw needs a block after the seed block (the one after the
        challenge's): sent once the chain's head is the seed block, or when the head has not
        moved for `STALL_S` (a chain that mines only on transactions: our try lands in the
        seed block, reverts and mines it, and the next one draws)."""
        ends = time.monotonic() + self.window
        head, moved = -1, time.monotonic()
        while time.monotonic() < ends:
            ch = self.bsm.challenge_of(case.attempt)
            if ch.seed_block == 0 or ch.resolved:
                break
            now_head = self.bsm.w3.eth.block_number
            if now_head != head:
                head, moved = now_head, time.monotonic()
            if head >= ch.seed_block or time.monotonic() - moved >= STALL_S:
                with contextlib.suppress(ContractError, TransactionFailed):  # too early, or drawn
                    self.bsm.draw_referees(case.job_id, case.epoch, gas=GAS)
                    continue
            if stop.wait(POLL_S):
                raise DtrainError("stopped while drawing referees")
        ch = self.bsm.challenge_of(case.attempt)
        drawn = self.me in ch.referees
        self.metric(
            "referee_drawn" if drawn else "referee_not_drawn", job=case.job_id, attempt=case.attempt
        )
        return drawn and not ch.resolved

    def _posted(self, case: Case) -> list[tuple[str, bytes]]:
        """(member, sha256) of every transcript file the attempt's voters posted."""
        return [
            (e.args["member"], bytes(e.args["transcript"]))
            for e in self.bsm.events(names=["TranscriptPosted"], job_id=case.job_id)
            if e.args["epoch"] == case.epoch
            and self.bsm.job(case.job_id, block=e.block).state.attempt == case.attempt
        ]

    @contextlib.contextmanager
    def _host(self, case: Case, fetch_by: float) -> Iterator[tuple[Callable[..., Path], Path]]:
        """A p2p host of our own for the challenge's files: yields fetch(sha256 hex, who,
        dest, within_s=None, max_bytes=None), which asks the challenger and the members at once
        (the first intact copy wins: a member that answers and then sends nothing holds up
        nobody) within `within_s`, else within half a window and by chain time `fetch_by`; and
        the challenge's work folder."""
        from dtrain_node.p2p.host import GossipConfig, GossipNode

        work = self.cfg.data_dir / "referee" / f"job-{case.job_id}" / f"attempt-{case.attempt}"
        work.mkdir(parents=True, exist_ok=True)
        holders = [case.challenger, *[m for m in case.members if m != case.challenger]]
        peers = [p for p in peer_specs(self.bsm, holders) if p[1]]
        end = time.monotonic() + (fetch_by - self._now())  # the chain read once, not per file

        def fetch(
            sha: str,
            _who: str,
            dest: Path,
            within_s: float | None = None,
            max_bytes: int | None = None,
        ) -> Path:
            left = min(self.window / 2, end - time.monotonic()) if within_s is None else within_s
            return g.fetch_file(sha, peers, dest, left, race=True, max_bytes=max_bytes)

        g = GossipNode(
            GossipConfig(
                data_dir=work,
                chain_id=self.bsm.chain_id,
                contract=self.bsm.address,
                job_id=case.job_id,
                file_timeout_s=FETCH_TIMEOUT_S,
            ),
            Account.create(),
        )
        g.start()
        try:
            yield fetch, work
        finally:
            g.stop()

    def _evidence(
        self,
        case: Case,
        named: dict[bytes, set[str]],
        first: set[bytes],
        fetch: Callable[[str, str, Path, float | None, int | None], Path],
        work: Path,
        memo: Memo,
    ) -> tuple[
        dict[bytes, tuple[set[str], evidence.EpochTranscript]], list[claims.Claim], Path | None
    ]:
        """sha256 -> (who named it, transcript) of each named transcript file that was
        delivered and checks against the members' signed commitments (a file nobody delivers,
        or that holds a packet its sender never committed, is left out); the replay claims
        named; and, after the first epoch, the epoch's start checkpoint, fetched by hash."""

        spec = self.bsm.job(case.job_id).spec
        rounds = spec.steps_per_epoch // spec.sync_interval
        # a transcript of this epoch, or a claim: nothing larger is read
        cap = max(evidence.size_bound(rounds, len(case.members), codec.MAX_BYTES), claims.MAX_SIZE)

        def get(sha: bytes) -> tuple[bytes, Any]:
            dest = work / f"named-{sha.hex()}.bin"
            try:
                return sha, self._read(case, fetch(sha.hex(), "", dest, None, cap))
            except CheckpointUnavailable as exc:  # not kept: asked again in the next pass
                log.info("file %s not delivered: %s", sha.hex()[:16], exc)
                return sha, None

        todo = [sha for sha in named if sha not in memo.read]
        # at once, the votes' and the challenge's files first in the queue; one queue, not two
        # stages: a file that stalls until the pass's deadline must not leave a file queued
        # behind it (a replay claim, posted) no time at all
        todo.sort(key=lambda sha: sha not in first)
        if todo:
            with ThreadPoolExecutor(min(FETCH_WORKERS, len(todo)), "referee-fetch") as pool:
                memo.read.update((sha, r) for sha, r in pool.map(get, todo) if r is not None)
        out, found = {}, []
        for sha, who in named.items():
            read = memo.read.get(sha)
            if isinstance(read, evidence.EpochTranscript):
                out[sha] = (who, read)
            elif isinstance(read, claims.Claim):
                found.append(read)
        start = None
        if case.epoch > 0:  # a file at `dest` was renamed there only once its hash checked
            dest = work / "start.stream"
            start = dest if dest.exists() else fetch(case.start.hex(), "", dest)
        return out, found, start

    @staticmethod
    def _read(case: Case, path: Path) -> evidence.EpochTranscript | claims.Claim | str:
        """A delivered file as a checked transcript, a replay claim, or why it is left out."""
        data = path.read_bytes()
        try:
            t = evidence.decode(data)
            evidence.verify(t, case.members)
            return t
        except TranscriptInvalid as exc:
            try:
                return claims.decode(data)
            except claims.ClaimInvalid:
                log.info("file %s left out: %s", path.name, exc)
                return str(exc)

    def _chain(self) -> tuple[int, str]:
        return self.bsm.chain_id, self.bsm.address

    def _phase_done(self, case: Case, opened: int, count: str, phases: int) -> bool:
        ch = self.bsm.challenge_of(case.attempt)
        everyone = len(ch.referees) > 0 and getattr(ch, count) == len(ch.referees)
        return ch.resolved or everyone or self._now() >= opened + phases * self.window

    def _now(self) -> float:
        return max(self.bsm.latest_block_timestamp(), time.time())

    def _until(self, stop: threading.Event, cond: Callable[[], bool]) -> None:
        while not cond():
            if stop.wait(POLL_S):
                raise DtrainError("stopped while refereeing")

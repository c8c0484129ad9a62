"""Replay spot checks in the node (docs/protocol.md 4.6): every round each member commits to
its private state, keeps it (`spotcheck.StateRing`) and serves it; the round's shared state
assigns checks (`spotcheck.assign`); a checker fetches the member's state by the digest the
member signed, replays the member's round (`dtrain_node.optim.reproduce`) on its own thread
and compares the packet byte for byte.

Each check ends in a `replay_checked` metric (match or not, bytes fetched, seconds). A check
that fails (another packet, the state withheld, unusable or not named) becomes a `claims.Claim`
only once the epoch's transcript is agreed and says that the checker's shared state of that
round was the canonical one and the member's packet is the transcript's: a checker whose live
rounds differed from the transcript replayed from another state, and accuses nobody. Confirmed
claims are signed, saved to `<job_dir>/claims/`, served by their sha256 and reported
(`replay_claim`); the challenge game takes them from there.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from eth_account.signers.local import LocalAccount

from dtrain_node.errors import EnvelopeError
from dtrain_node.optim import reproduce, statefile
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.p2p import envelope as envmod
from dtrain_node.verify import claims

log = logging.getLogger(__name__)

FETCH_TRIES = 3
FETCH_BACKOFF_S = 1.0

# (member, round, shared state at the round's start, the member's decoded private state) ->
# the packet the member should have sent
Replay = Callable[[str, int, Sequence[torch.Tensor], reproduce.PrivateState], bytes]
# (sha256 hex, member, destination, seconds it may take) -> the verified file; raises when the
# member does not serve it in that time
Fetch = Callable[[str, str, Path, float], Path]


@dataclass(frozen=True)
class Check:
    round: int
    member: str
    packet: bytes  # the member's packet of the round, as applied
    commitment: bytes  # the member's signed commitment to it (encoded envelope)
    shared: Sequence[torch.Tensor]  # the shared state at the round's start


@dataclass(frozen=True)
class Outcome:
    check: Check
    reason: int | None  # None: the replay matched; else a claims reason
    state: bytes  # the committed state digest (zeros: none)
    replayed: bytes  # sha256 of the replayed packet (zeros: no replay)
    bytes: int  # state bytes fetched
    fetch_s: float
    replay_s: float


class Replica:
    """The job's model and optimizer a second time, for replays: built on first use (on the
    checker's thread) by `build`, which returns (DeMo over its model, run(opt, batches), batches of
    (member, round))."""

    def __init__(self, build: Callable[[], tuple[DeMo, Any, Any]]) -> None:
        self._build = build
        self._parts: tuple[DeMo, Any, Any] | None = None

    def __call__(self, member: str, rnd: int, shared: Sequence[torch.Tensor], state: Any) -> bytes:
        if self._parts is None:
            self._parts = self._build()
        opt, run, batches = self._parts
        statefile.load(opt, shared, state)
        run(opt, batches(member, rnd))
        return opt.prepare()


def _sha(b: bytes) -> bytes:
    return hashlib.sha256(b).digest()


def run_check(c: Check, replay: Replay, fetch: Fetch, work: Path, within_s: float) -> Outcome:
    """One check: the committed state fetched from the member (asked for again until
    `within_s` has passed), verified, replayed, compared."""
    zero = bytes(32)
    try:
        state = envmod.decode(c.commitment).state_digest
    except EnvelopeError:
        state = None  # the transcript's commitments decode: not reached
    if state is None:
        return Outcome(c, claims.NO_STATE, zero, zero, 0, 0.0, 0.0)
    t0 = time.perf_counter()
    dest = state_path(work, c, state)
    data = _fetch(fetch, state.hex(), c.member, dest, within_s)
    fetch_s = time.perf_counter() - t0
    if data is None:
        return Outcome(c, claims.WITHHELD, state, zero, 0, fetch_s, 0.0)
    t1 = time.perf_counter()
    try:
        if _sha(data) != state:
            raise statefile.StateInvalid("not the committed state")
        packet = replay(c.member, c.round, c.shared, statefile.decode(data))
    except statefile.StateInvalid as e:
        log.info("round %d state of %s: %s", c.round, c.member, e)
        return Outcome(c, claims.INVALID_STATE, state, zero, len(data), fetch_s, 0.0)
    replay_s = time.perf_counter() - t1
    reason = None if packet == c.packet else claims.MISMATCH
    if reason is None:
        dest.unlink(missing_ok=True)  # a failed check keeps the state: the referees need it
    return Outcome(c, reason, state, _sha(packet), len(data), fetch_s, replay_s)


def state_path(work: Path, c: Check, state: bytes) -> Path:
    """Where a check keeps the member's state it fetched (verified by its sha256)."""
    return work / f"check-{c.round}-{c.member}-{state.hex()[:16]}.dtps"


STATE_FETCH_BASE_S = 10.0  # a state fetch's time to connect and start, whatever its size
STATE_MIN_BANDWIDTH = 1 << 20  # bytes/s a member must serve its committed state at


def state_deadline(size: int) -> float:
    """Seconds a member has to hand over a private state of `size` bytes (the size every
    member's state has: the job's model and recipe fix it)."""
    return STATE_FETCH_BASE_S + size / STATE_MIN_BANDWIDTH


def _fetch(fetch: Fetch, sha: str, member: str, dest: Path, within_s: float) -> bytes | None:
    """The state, asked for again (the member may be restarting) until `within_s` has passed:
    one deadline for every try, so a member that serves slowly holds up no later check."""
    end = time.monotonic() + within_s
    for attempt in range(FETCH_TRIES):
        left = end - time.monotonic()
        if left <= 0:
            break
        try:
            return fetch(sha, member, dest, left).read_bytes()
        except Exception as e:  # CheckpointUnavailable, a dead peer, a closed host
            log.info("state %s.. of %s not fetched (try %d): %s", sha[:16], member, attempt, e)
            pause = min(FETCH_BACKOFF_S * 2**attempt, end - time.monotonic())
            if attempt + 1 < FETCH_TRIES and pause > 0:
                time.sleep(pause)
    return None


class Checker:
    """Runs checks one at a time on its own thread; `drain` waits for the queue to empty. Each
    fetch may take `within()` seconds. A member that withheld a state once is not asked again
    in the attempt: one withheld state is the claim, and later checks of others run at once."""

    def __init__(
        self,
        replay: Replay,
        fetch: Fetch,
        work: Path,
        report: Callable[[Outcome], None],
        within: Callable[[], float],
    ) -> None:
        self._replay, self._fetch, self._report, self._within = replay, fetch, report, within
        self.withheld: set[str] = set()
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.outcomes: list[Outcome] = []
        self._q: queue.Queue[Check | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._abandoned = False
        self._thread = threading.Thread(target=self._loop, name="replay-checker", daemon=True)
        self._thread.start()

    def submit(self, c: Check) -> None:
        with self._idle:
            self._pending += 1
        self._q.put(c)

    def again(self, o: Outcome) -> Outcome:
        """A withheld state asked for once more, on the caller's thread (the checker's has
        stopped); any other outcome as it is."""
        if o.reason != claims.WITHHELD:
            return o
        again = run_check(o.check, self._replay, self._fetch, self.work, self._within())
        if again.reason != claims.WITHHELD:
            self._report(again)
        return again

    def drain(self, timeout_s: float) -> bool:
        """Wait until every submitted check ran (True) or `timeout_s` passed (False)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout_s)

    def stop(self) -> None:
        self._q.put(None)

    def abandon(self) -> None:
        """Stop after the check running now: the queued ones are dropped, never claimed."""
        self._abandoned = True
        self.stop()

    def _loop(self) -> None:
        while (c := self._q.get()) is not None:
            try:
                if self._abandoned:
                    continue
                if c.member in self.withheld:
                    log.info("round %d of %s not checked: it withheld a state", c.round, c.member)
                    continue
                out = run_check(c, self._replay, self._fetch, self.work, self._within())
                if out.reason == claims.WITHHELD:
                    self.withheld.add(c.member)
                self.outcomes.append(out)
                self._report(out)
            except Exception:  # a bug of ours is no evidence against the member
                log.exception("replay check of %s round %d failed", c.member, c.round)
            finally:
                with self._idle:
                    self._pending -= 1
                    self._idle.notify_all()


@dataclass(frozen=True)
class ClaimHead:
    """What every claim of an epoch attempt names."""

    chain_id: int
    contract: str
    job_id: int
    attempt: int


def confirmed(
    outcomes: Sequence[Outcome],
    first_diverged: int | None,
    canonical: Sequence[Sequence[tuple[str, str]]],
) -> list[Outcome]:
    """The failed checks that stand once the transcript is agreed: the checker's live rounds
    before the checked one were the transcript's (`first_diverged`: the first that was not,
    None: none), so it replayed from the canonical shared state, and the member's packet is
    the one the transcript holds for it in that round (`canonical`: per round, (sender,
    payload sha256 hex))."""
    out = []
    for o in outcomes:
        c = o.check
        if o.reason is None:
            continue
        if first_diverged is not None and c.round > first_diverged:
            continue  # rounds before the checked one differed: not the canonical start
        held = dict(canonical[c.round]) if c.round < len(canonical) else {}
        if held.get(c.member) == _sha(c.packet).hex():
            out.append(o)
    return out


def claim(o: Outcome, head: ClaimHead, account: LocalAccount) -> claims.Claim:
    """The signed claim of a failed check."""
    c = o.check
    return claims.Claim(
        chain_id=head.chain_id,
        contract=head.contract,
        job_id=head.job_id,
        attempt=head.attempt,
        round=c.round,
        member=c.member,
        checker=account.address,
        reason=o.reason if o.reason is not None else claims.MISMATCH,
        state=o.state,
        packet=_sha(c.packet),
        replayed=o.replayed,
        commitment=c.commitment,
    ).sign(account)


def demo_replica(
    build: Callable[[], tuple[Any, Callable[[Any, Sequence[Any]], None], Callable[[str], Any]]],
    cfg: DeMoConfig,
    k: int,
    reach: int = 0,
) -> Replica:
    """A `Replica` over `build()` -> (model, run(opt, batches): the round's inner steps as the
    trainer takes them, stream(member): the member's endless
    batch stream of the attempt, as it trains it), with DeMo `cfg` and K = `k`: round r's
    batches are the stream's r x K-th to (r + 1) x K-th (epoch.from_round)."""

    def parts() -> tuple[DeMo, Any, Any]:
        model, loss, stream = build()
        model.train()

        def batches(member: str, rnd: int) -> list[Any]:
            return list(itertools.islice(stream(member), rnd * k, (rnd + 1) * k))

        return DeMo.of_model(model, cfg, "replica", reach), loss, batches

    return Replica(parts)

"""Job progress for the payer, from the members' signed gossip alone (docs/protocol.md 4.8).

Each member of a running epoch signs and publishes one progress note per sync round (step,
loss, tokens, the method's own metric: mean reward and accuracy for GRPO, preference accuracy
for DPO) on the job's progress topic. `ProgressFeed` joins that topic as a read-only libp2p
peer, dialing the members at the addresses they registered on chain, checks every note's
signature against the job's members, and turns the notes into one `RoundLine` per round, with
an ETA for the whole job. `refusals` asks every registered operator why it passed a job by.

The libp2p peer lives in the node package (dtrain_node.p2p.watch), imported when used.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from .client import BSM
from .errors import ConfigError
from .units import format_epoch, format_span

METRICS = ("reward", "accuracy", "preference_accuracy")
RECENT_ROUNDS = 5  # the ETA's round time: the mean of the last few rounds


def _watch_module() -> Any:
    try:
        from dtrain_node.p2p import watch
    except ImportError as exc:
        raise ConfigError(
            f"following a job's progress needs the node package (libp2p): "
            f"pip install 'dtrain[node]' ({exc})"
        ) from None
    lib = logging.getLogger("libp2p")  # it does not propagate: Python would print each failed
    if not lib.handlers and not lib.propagate:  # dial to a member that left on stderr
        lib.addHandler(logging.NullHandler())
    return watch


@dataclass
class RoundLine:
    """One round of the job as its members reported it."""

    epoch: int  # 0-based
    epochs: int
    round: int  # 0-based
    rounds: int
    attempt: int
    step: int
    loss: float  # mean over the members that reported
    tokens: int  # trained in this round, all members
    tokens_seen: int  # trained in every round reported so far
    reported: int  # members whose note arrived
    members: int
    metrics: dict[str, float] = field(default_factory=dict)
    eta_s: float | None = None  # until the whole job ends

    def text(self) -> str:
        parts = [
            f"{format_epoch(self.epoch, self.epochs)} round {self.round + 1}/{self.rounds}",
            f"step {self.step}",
            f"loss {self.loss:.4f}",
            f"tokens {self.tokens_seen:,}",
        ]
        parts += [f"{k.replace('_', ' ')} {v:.4f}" for k, v in self.metrics.items()]
        parts.append(f"{self.reported}/{self.members} members")
        if self.eta_s is not None:
            parts.append(f"ETA {format_span(round(self.eta_s))}")
        return "progress: " + " | ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"progress": asdict(self)}


@dataclass
class _Round:
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)  # sender -> body


class RoundBook:
    """Progress notes in, one `RoundLine` per round out: a round is shown once every member
    reported it, once a later round is whole, or once a note two rounds later (or of a later
    epoch) comes. Gossip may lose a note; it may also bring a slow member's note after a
    faster member's note of the next round, and that note still counts."""

    def __init__(self, epochs: int, rounds: int, boundary_s: float) -> None:
        self.epochs, self.rounds = epochs, max(1, rounds)
        self.boundary_s = boundary_s  # between two epochs, until one is measured
        self._open: dict[tuple[int, int, int], _Round] = {}
        self._shown: set[tuple[int, int, int]] = set()
        self._round_s: list[float] = []
        self._tokens = 0
        self._last: tuple[int, float] | None = None  # (epoch, time of its last note)

    def add(self, body: dict[str, Any], members: int) -> list[RoundLine]:
        key = (int(body["epoch"]), int(body["attempt"]), int(body["round"]))
        if key in self._shown:
            return []
        self._measure_boundary(key[0], float(body.get("t", 0.0)))
        self._open.setdefault(key, _Round()).notes[str(body["sender"])] = body
        whole = len(self._open[key].notes) >= members
        ready = [k for k in sorted(self._open) if k < key and (whole or _far(k, key))]
        if whole:
            ready.append(key)
        return [self._show(k, members) for k in ready]

    def flush(self, members: int) -> list[RoundLine]:
        return [self._show(k, members) for k in sorted(self._open)]

    def _measure_boundary(self, epoch: int, t: float) -> None:
        if self._last is not None and epoch > self._last[0] and t > self._last[1]:
            self.boundary_s = (t - self._last[1]) / (epoch - self._last[0])
        if self._last is None or epoch >= self._last[0]:
            self._last = (epoch, max(t, self._last[1] if self._last else 0.0))

    def _show(self, key: tuple[int, int, int], members: int) -> RoundLine:
        notes = list(self._open.pop(key).notes.values())
        self._shown.add(key)
        tokens = sum(int(n.get("tokens", 0)) for n in notes)
        self._tokens += tokens
        self._round_s.append(max(float(n.get("round_s", 0.0)) for n in notes))
        metrics = {
            m: sum(vals) / len(vals)
            for m in METRICS
            if (vals := [float(n[m]) for n in notes if m in n])
        }
        epoch, attempt, rnd = key
        return RoundLine(
            epoch=epoch,
            epochs=self.epochs,
            round=rnd,
            rounds=self.rounds,
            attempt=attempt,
            step=max(int(n.get("step", 0)) for n in notes),
            loss=sum(float(n.get("loss", 0.0)) for n in notes) / len(notes),
            tokens=tokens,
            tokens_seen=self._tokens,
            reported=len(notes),
            members=members,
            metrics=metrics,
            eta_s=self.eta(epoch, rnd),
        )

    def eta(self, epoch: int, rnd: int) -> float | None:
        """Seconds until the job ends after round `rnd` of `epoch`: the rounds left at the
        recent round time, and each epoch boundary left at the measured (or expected) gap."""
        if not self._round_s:
            return None
        recent = self._round_s[-RECENT_ROUNDS:]
        left = (self.epochs - epoch - 1) * self.rounds + (self.rounds - rnd - 1)
        return left * sum(recent) / len(recent) + (self.epochs - epoch) * self.boundary_s


class ProgressFeed:
    """Follows job `job_id`'s progress on a thread of its own until `stop()`; `on_line` gets
    each `RoundLine` (on that thread), `on_note` each member's note body. Members are re-read
    from the chain every `poll_s`."""

    def __init__(
        self,
        bsm: BSM,
        job_id: int,
        on_line: Callable[[RoundLine], None],
        poll_s: float = 2.0,
        on_note: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        watch = _watch_module()
        self.bsm, self.job_id, self.on_line, self.poll_s = bsm, job_id, on_line, poll_s
        self.on_note = on_note  # each member's checked note body, as it comes
        job = bsm.job(job_id)
        p = bsm.params()
        self.book = RoundBook(
            job.spec.total_epochs,
            job.spec.steps_per_epoch // job.spec.sync_interval,
            p.start_grace + p.challenge_window,
        )
        self._notes: queue.Queue[dict[str, Any]] = queue.Queue()
        self.peer = watch.WatchPeer(
            bsm.chain_id, bsm.address, job_id, lambda n: self._notes.put(n.body)
        )
        self._members: tuple[str, ...] = ()  # the latest epoch's: what "2/2 members" counts
        # (epoch, attempt) -> members it started with (EpochStarted): a round of it is whole
        # when that many reported, whoever the feed knew of when a note came
        self._seats: dict[tuple[int, int], int] = {}
        self._held: list[dict[str, Any]] = []  # notes of an epoch whose start was not read yet
        self._known: tuple[str, ...] = ()  # a member of any epoch so far: whose notes count
        self._next_block = 0  # of the EpochStarted events not read yet
        self._specs: list[tuple[bytes, list[str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="progress", daemon=True)

    def start(self) -> ProgressFeed:
        self.peer.start()
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> dict[str, dict[str, int]]:
        """Stop following; the notes taken (by how they came: gossip, asked) and dropped."""
        self._stop.set()
        self._thread.join(timeout)
        try:
            counts = self.peer.counts()
        finally:
            self.peer.stop()
        return counts

    def _main(self) -> None:
        next_poll = 0.0
        while not self._stop.is_set():
            if time.monotonic() >= next_poll:
                self._refresh()
                self._release()  # notes that waited for their epoch's start
                next_poll = time.monotonic() + self.poll_s
            self._drain(0.2)
        self._refresh()  # what gossip lost of the last rounds
        self._drain(0.0)
        self._release(final=True)
        for line in self.book.flush(max(1, len(self._members))):
            self.on_line(line)

    def _drain(self, wait_s: float) -> None:
        while True:
            try:
                body = self._notes.get(timeout=wait_s) if wait_s else self._notes.get_nowait()
            except queue.Empty:
                return
            self._held.append(body)
            self._release()
            wait_s = 0.0

    def _release(self, final: bool = False) -> None:
        """Hand the held notes to the book in order, each counted against the members its
        epoch started with. A note of an epoch whose start was not read yet (the feed's last
        poll came before it, or was held up by a slow dial) first has the chain read again,
        and waits if the RPC node has not seen that start either; the last release counts it
        against the latest members. Without the wait a round would show as whole on the notes
        of the members the feed happened to know ("1/1 members")."""
        if not final and any(_epoch_of(b) not in self._seats for b in self._held):
            with contextlib.suppress(Exception):  # an RPC hiccup: they wait for the next poll
                self._learn_members()
        for i, body in enumerate(self._held):
            seats = self._seats.get(_epoch_of(body))
            if seats is None and not final:
                del self._held[:i]
                return
            # the round's line before its last point: whoever sees the point sees the line
            for line in self.book.add(body, seats or max(1, len(self._members))):
                self.on_line(line)
            if self.on_note is not None:
                self.on_note(body)
        self._held.clear()

    def _refresh(self) -> None:
        """Who the members are; ask them for the notes they hold (gossip is the fast path: a
        note it lost, or dropped before its sender was known as a member, arrives this way)."""
        try:
            self._learn_members()
            if self._specs:
                self.peer.follow(self._specs)
        except Exception:  # an RPC hiccup or a member's bad address: try again next poll
            # the members known so far still count: forgetting them would show the next round
            # as complete on its first note ("1/1 members")
            pass

    def _learn_members(self) -> None:
        """The current epoch's members, and everyone who was a member of one of the job's
        epochs. The chain lists only the current members (none once the job ended), so each
        started epoch's members are read at its block too: a feed whose polls were held up for
        a whole epoch (a slow dial, a loaded machine) still learns who sent that epoch's notes."""
        head = self.bsm.w3.eth.block_number
        started = (
            self.bsm.events(self._next_block, head, ["EpochStarted"], self.job_id)
            if head >= self._next_block
            else []
        )
        epochs = [self._members_at(e.block) for e in started]
        for e in started:
            self._seats[(int(e.args["epoch"]), int(e.args["attempt"]))] = int(e.args["memberCount"])
        current = tuple(self.bsm.members(self.job_id, head))
        known = tuple(dict.fromkeys([*self._known, *(a for ms in epochs for a in ms), *current]))
        if known != self._known:
            specs = peer_specs(self.bsm, list(known))
            self.peer.set_members(known)
            self._known, self._specs = known, specs
        self._next_block = head + 1
        self._members = current or next((m for m in reversed(epochs) if m), self._members)

    def _members_at(self, block: int) -> tuple[str, ...]:
        """The members at `block`; none when the RPC node keeps no state that old (a pruned
        node: the current members still count)."""
        try:
            return tuple(self.bsm.members(self.job_id, block))
        except Exception:
            return ()


def _far(k: tuple[int, int, int], later: tuple[int, int, int]) -> bool:
    """Whether a note of round `later` means round `k`'s missing notes are lost, not late:
    it is two rounds on, or of a later epoch or attempt."""
    return k[:2] != later[:2] or later[2] - k[2] >= 2


def _epoch_of(body: dict[str, Any]) -> tuple[int, int]:
    return int(body["epoch"]), int(body["attempt"])


def summary(counts: dict[str, dict[str, int]]) -> str:
    """ "6 signed progress notes (4 by gossip, 2 asked of members), 1 dropped (not_member)"."""
    got, dropped = counts.get("received", {}), counts.get("dropped", {})
    ways = {"gossip": "by gossip", "asked": "asked of members", "held": "held for a new member"}
    order = [*ways, *sorted(set(got) - set(ways))]
    how = ", ".join(f"{got[k]} {ways.get(k, k)}" for k in order if got.get(k))
    out = f"{sum(got.values())} signed progress notes" + (f" ({how})" if how else "")
    if dropped:
        out += f", {sum(dropped.values())} dropped ({', '.join(sorted(dropped))})"
    return out


def registered(bsm: BSM) -> list[str]:
    """Every operator registered now, in the order they first registered."""
    seen = dict.fromkeys(
        str(e.args["operator"]) for e in bsm.events(0, "latest", ["OperatorRegistered"])
    )
    return [a for a in seen if bsm.operator(a).registered]


def peer_specs(bsm: BSM, operators: list[str]) -> list[tuple[bytes, list[str]]]:
    """The operators' (peer key, multiaddrs) as registered on chain (no address: left out)."""
    out = []
    for address in operators:
        op = bsm.operator(address)
        if op.multiaddrs:
            out.append((op.peer_key, list(op.multiaddrs)))
    return out


@dataclass(frozen=True)
class Refusal:
    operator: str
    reason: str  # a key of REASONS
    detail: str

    @property
    def why(self) -> str:
        return REASONS.get(self.reason, self.reason)


REASONS = {
    "ask": "ask above price",
    "preflight": "failed pre-flight",
    "capacity": "not enough capacity",
    "tee": "no TEE attestation",
}


def declines(bsm: BSM, job_id: int) -> dict[str, Refusal]:
    """The operators' refusals of job `job_id` kept on chain (`JobDeclined`, the latest of
    each operator), by operator."""
    found: dict[str, Refusal] = {}
    for e in bsm.events(names=["JobDeclined"], job_id=job_id):
        code = bytes(e.args["reason"]).rstrip(b"\0").decode(errors="replace")
        found[e.args["operator"]] = Refusal(e.args["operator"], code, str(e.args["detail"]))
    return found


def refusals(bsm: BSM, job_id: int, timeout: float = 5.0) -> list[Refusal]:
    """Every operator's refusal of job `job_id`: kept on chain (`declines`), or signed and
    served by its node (one per operator, not a member; the chain's first)."""
    members = set(bsm.job(job_id).members)
    kept = {a: r for a, r in declines(bsm, job_id).items() if a not in members}
    try:
        served = served_refusals(bsm, job_id, timeout)
    except ConfigError:  # without the node package (libp2p): the chain's only
        served = {}
    return list({**served, **kept}.values())


def served_refusals(bsm: BSM, job_id: int, timeout: float = 5.0) -> dict[str, Refusal]:
    """Every registered operator's signed refusal of job `job_id` that its node serves (one
    per operator; operators that cannot be reached say nothing)."""
    watch = _watch_module()
    from dtrain_node.errors import NoteError
    from dtrain_node.p2p import notes

    members = set(bsm.job(job_id).members)
    operators = [o for o in registered(bsm) if o not in members]
    if not operators:
        return {}
    peer = watch.WatchPeer(bsm.chain_id, bsm.address, job_id, lambda _n: None).start()
    try:
        raw = peer.ask(peer_specs(bsm, operators), job_id, timeout)
    finally:
        peer.stop()
    found: dict[str, Refusal] = {}
    for data in raw:
        try:
            note = notes.decode(data)
            notes.check_about(note, bsm.chain_id, bsm.address, job_id, notes.REFUSAL)
        except NoteError:
            continue
        if note.sender in operators:
            b = note.body
            found[note.sender] = Refusal(note.sender, str(b.get("reason")), str(b.get("detail")))
    return found


def refusal_summary(found: list[Refusal]) -> str:
    """ "2 operators refused: ask above price (1), failed pre-flight (1)" (or "")."""
    if not found:
        return ""
    counts: dict[str, int] = {}
    for r in found:
        counts[r.why] = counts.get(r.why, 0) + 1
    n = len(found)
    whys = ", ".join(f"{w} ({c})" if len(counts) > 1 else w for w, c in counts.items())
    return f"{n} operator{'s' if n != 1 else ''} refused: {whys}"

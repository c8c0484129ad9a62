"""Round bookkeeping for gossip sync, with no networking: validation rules, commitments and
packet assembly, have-lists for re-requests, equivocation detection and participation.

Everything here runs on the host's trio thread only, so it needs no locks.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from eth_utils import to_checksum_address

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.envelope import Envelope, EnvelopeError

VERIFIED_CACHE = 8192  # envelope ids whose signature was checked (about 50 rounds of 40 members)

PayloadValidator = Callable[[bytes], None]  # raises on a payload that must not be relayed


class Phase(IntEnum):
    """Where this node is in a round. Reported to peers in sync replies (docs/protocol.md)."""

    NOT_STARTED = 0  # round not begun; may hold commitments and packets that arrived early
    COMMIT = 1  # own commitment published, collecting the members' commitments
    COMMIT_CLOSED = 2  # commit deadline passed: agreeing on commitments with the peers
    OPEN = 3  # own packet revealed: collecting packets (no new commitments)
    CLOSED = 4  # deadline passed: accepts packets only from relays (sync replies)
    FINISHED = 5  # result returned to the caller: the set is frozen, only served


@dataclass
class _Packet:
    count: int
    length: int
    chunks: dict[int, Envelope] = field(default_factory=dict)
    payload: bytes | None = None  # set once all chunks arrived and the payload validated


@dataclass
class _Round:
    phase: Phase = Phase.NOT_STARTED
    # sender -> payload sha256 -> packet; two digests from one sender is equivocation
    packets: dict[str, dict[bytes, _Packet]] = field(default_factory=dict)
    applied: list[str] | None = None
    first_seen: dict[str, float] = field(default_factory=dict)
    # sender -> payload sha256 -> signed commitment; a second one is equivocation evidence
    commits: dict[str, dict[bytes, Envelope]] = field(default_factory=dict)
    # when the first commitment of this round arrived, if that was before we began it
    early_commit_at: float | None = None
    # members whose committed packet will not come (ourselves after withdrawing, step 3a)
    withdrawn: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class StoreLimits:
    max_payload_bytes: int
    window_back: int  # finished rounds kept for relay
    window_ahead: int  # future rounds accepted (fast peers publish before we start)

    def __post_init__(self) -> None:
        if self.max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be >= 1, got {self.max_payload_bytes}")
        if self.window_back < 0 or self.window_ahead < 0:
            raise ValueError(f"windows must be >= 0, got {self.window_back}, {self.window_ahead}")


class RoundStore:
    def __init__(self, chain_id: int, contract: str, job_id: int, limits: StoreLimits) -> None:
        self.chain_id, self.contract, self.job_id = chain_id, to_checksum_address(contract), job_id
        self.limits = limits
        self._validate: PayloadValidator | None = None
        self.epoch: int | None = None
        self.members: tuple[str, ...] = ()
        self._member_set: frozenset[str] = frozenset()
        self.current: int | None = None
        self.rounds: dict[int, _Round] = {}
        self.participation: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self.equivocations: list[tuple[int, str]] = []
        self.signatures: Counter[str] = Counter()  # "checked" (recovered) and "cached"
        self._verified: OrderedDict[bytes, None] = OrderedDict()  # ids of authentic envelopes

    # -- epoch and rounds ---------------------------------------------------------------------
    def set_epoch(
        self, epoch: int, members: Sequence[str], validate: PayloadValidator | None
    ) -> None:
        """Accept packets of this epoch attempt from these members only; forget older rounds.

        validate: raises on a payload that must not be stored or relayed (None: no check).
        """
        checked = [to_checksum_address(m) for m in members]
        if len(set(checked)) != len(checked):
            raise ValueError(f"duplicate members in epoch {epoch}: {checked}")
        self.epoch, self.members = epoch, tuple(sorted(checked))
        self._member_set = frozenset(checked)
        self._validate = validate
        self.current, self.rounds = None, {}
        self.reconciling = False
        self.participation = Counter({m: 0 for m in self.members})

    def begin(self, rnd: int) -> _Round:
        if self.epoch is None:
            raise RuntimeError("set_epoch() before collecting rounds")
        if self.current is not None and rnd <= self.current:
            raise ValueError(f"round {rnd} <= current round {self.current}: rounds only go up")
        self.current = rnd
        # every round of the epoch is kept: the epoch's transcript is reconciled at its end
        st = self.rounds.setdefault(rnd, _Round())
        st.phase = Phase.COMMIT
        return st

    def revealed_by_quorum(self, rnd: int, me: str) -> bool:
        """Members other than `me` holding at least 2/3 of the seats revealed this round (a
        chunk of each is held): a coalition of fewer than a third cannot make this true."""
        st = self.rounds.get(rnd)
        others = 0 if st is None else sum(1 for s in st.packets if s != me)
        return 3 * others >= 2 * len(self.members)

    def began_behind_by(self, rnd: int, now: float) -> float:
        """How long before `now` a commitment of this round reached us before we began it (0.0
        if none did): how far behind the earliest peer we may have started."""
        st = self.rounds.get(rnd)
        if st is None or st.early_commit_at is None:
            return 0.0
        return max(0.0, now - st.early_commit_at)

    def withdraw(self, rnd: int, sender: str) -> None:
        """`sender` (this node) will not reveal its committed packet: nobody waits for it here."""
        self.rounds.setdefault(rnd, _Round()).withdrawn.add(to_checksum_address(sender))

    def close_commits(self, rnd: int) -> None:
        """Commit deadline passed: first commitments now only by relay from a third member."""
        st = self.rounds.setdefault(rnd, _Round())
        st.phase = max(st.phase, Phase.COMMIT_CLOSED)

    def reveal(self, rnd: int) -> None:
        """Our packet goes out: the set of commitments of this round is frozen here."""
        st = self.rounds.setdefault(rnd, _Round())
        st.phase = max(st.phase, Phase.OPEN)

    def begin_reconcile(self, rounds: int) -> None:
        """Every round below `rounds` is finished here (created finished when this process
        never ran it, e.g. after a restart): from now on, signed sync replies may add the
        evidence other members hold for any of them (docs/protocol.md 4.5)."""
        if self.epoch is None:
            raise RuntimeError("set_epoch() before reconciling")
        for r in range(rounds):
            self.finish(r)
        self.current = max(rounds - 1, -1 if self.current is None else self.current)
        self.reconciling = True

    def in_window(self, rnd: int) -> bool:
        if self.reconciling:
            return 0 <= rnd <= (self.current or 0)
        lo = 0 if self.current is None else self.current - self.limits.window_back
        hi = (0 if self.current is None else self.current) + self.limits.window_ahead
        return lo <= rnd <= hi

    def phase(self, rnd: int) -> Phase:
        st = self.rounds.get(rnd)
        return Phase.NOT_STARTED if st is None else st.phase

    # -- accepting envelopes ------------------------------------------------------------------
    def check_header(self, env: Envelope) -> None:
        """Cheap checks first (no crypto), so junk costs little. Raises EnvelopeError."""
        if env.chain_id != self.chain_id or env.contract != self.contract:
            raise EnvelopeError("wrong_job", f"chain {env.chain_id} contract {env.contract}")
        if env.job_id != self.job_id:
            raise EnvelopeError("wrong_job", f"job {env.job_id} != {self.job_id}")
        if env.epoch != self.epoch:
            raise EnvelopeError("wrong_epoch", f"epoch {env.epoch} != {self.epoch}")
        if not self.in_window(env.round):
            raise EnvelopeError("round_window", f"round {env.round}, current {self.current}")
        if env.sender not in self._member_set:
            raise EnvelopeError("not_member", f"{env.sender} not in epoch {self.epoch}")
        if env.payload_len > self.limits.max_payload_bytes:
            raise EnvelopeError(
                "oversized", f"payload {env.payload_len} > {self.limits.max_payload_bytes} bytes"
            )
        # every chunk carries >= 1 byte and <= MAX_CHUNK bytes
        if env.chunk_count > max(1, env.payload_len) or (
            env.chunk_count * envmod.MAX_CHUNK < env.payload_len
        ):
            raise EnvelopeError(
                "malformed", f"{env.chunk_count} chunks for a {env.payload_len}-byte payload"
            )

    def authenticate(self, env: Envelope) -> None:
        """Membership (cheap) and then the signature; raises EnvelopeError.

        Verified envelopes are remembered by id, so a duplicate costs a sha256, not a second
        signature recovery.
        """
        self.check_header(env)
        key = env.auth_id()
        if key in self._verified:
            self._verified.move_to_end(key)
            self.signatures["cached"] += 1
            return
        self.signatures["checked"] += 1
        if env.recover_signer() != env.sender:
            raise EnvelopeError("bad_signature", f"not signed by {env.sender}")
        self._verified[key] = None
        if len(self._verified) > VERIFIED_CACHE:
            self._verified.popitem(last=False)

    def offer(
        self, env: Envelope, relayed: bool, now: float | None = None, relayer: str | None = None
    ) -> bool:
        """Validate and store one chunk or commitment. True if new and valid (worth forwarding).

        relayed: it came from a sync reply (allowed after the deadline) rather than gossip;
        relayer: the member who signed that reply, if known. Raises EnvelopeError with the drop
        reason; the caller counts it. Header, membership and signature come first, whatever the
        round's state: every reason raised after them (finished, late, duplicate, ...) is about
        an authentic envelope.
        """
        self.authenticate(env)
        st = self.rounds.setdefault(env.round, _Round())
        if st.phase == Phase.FINISHED and self.reconciling and relayed:
            return self._offer_evidence(st, env, relayer)
        if st.phase == Phase.FINISHED:
            if env.kind == envmod.COMMIT and env.sender not in st.commits:
                raise EnvelopeError("late_commit", f"round {env.round} {env.sender} (finished)")
            raise EnvelopeError("finished", f"round {env.round} already finished")
        if env.kind == envmod.COMMIT:
            return self._offer_commit(st, env, relayed, relayer)
        if st.phase == Phase.CLOSED and not relayed:
            raise EnvelopeError("late", f"round {env.round} closed; only relays accepted")
        return self._offer_chunk(st, env, now)

    def _offer_chunk(self, st: _Round, env: Envelope, now: float | None) -> bool:
        by_digest = st.packets.get(env.sender, {})
        pkt = by_digest.get(env.payload_sha256)
        if pkt is not None and env.chunk_index in pkt.chunks:
            raise EnvelopeError("duplicate", f"round {env.round} {env.sender} #{env.chunk_index}")
        if pkt is None and len(by_digest) >= 2:
            # two digests already prove equivocation; more would only cost memory
            raise EnvelopeError("equivocation", f"round {env.round} {env.sender}")
        if pkt is not None and (pkt.count, pkt.length) != (env.chunk_count, env.payload_len):
            raise EnvelopeError("malformed", "chunk header disagrees with earlier chunks")
        _check_committed(st, env)
        if pkt is None:
            pkt = _Packet(env.chunk_count, env.payload_len)
        pkt.chunks[env.chunk_index] = env
        if len(pkt.chunks) == pkt.count:
            self._complete(st, env, pkt, now)
        new_sender = env.sender not in st.packets
        st.packets.setdefault(env.sender, {})[env.payload_sha256] = pkt
        if not new_sender and len(st.packets[env.sender]) == 2 and len(pkt.chunks) == 1:
            self._equivocated(env)
        return True

    def _offer_evidence(self, st: _Round, env: Envelope, relayer: str | None) -> bool:
        """A finished round, reconciling: a first commitment counts only when a member other
        than its sender vouches for it (it took the commitment in time, or got it from one
        that did); a second one is equivocation evidence; a packet needs its commitment."""
        if env.kind == envmod.COMMIT:
            held = st.commits.get(env.sender, {})
            if env.payload_sha256 in held:
                raise EnvelopeError("duplicate", f"round {env.round} commitment of {env.sender}")
            if len(held) >= 2:
                raise EnvelopeError("equivocation", f"round {env.round} {env.sender}")
            vouched = relayer is not None and relayer != env.sender and relayer in self.members
            if not held and not vouched:
                raise EnvelopeError("late_commit", f"round {env.round} {env.sender} (unvouched)")
            st.commits.setdefault(env.sender, {})[env.payload_sha256] = env
            if held:
                self._equivocated(env)
            return True
        return self._offer_chunk(st, env, None)

    def _equivocated(self, env: Envelope) -> None:
        if (env.round, env.sender) not in self.equivocations:
            self.equivocations.append((env.round, env.sender))

    def _offer_commit(self, st: _Round, env: Envelope, relayed: bool, relayer: str | None) -> bool:
        held = st.commits.get(env.sender, {})
        if env.payload_sha256 in held:
            raise EnvelopeError("duplicate", f"round {env.round} commitment of {env.sender}")
        if len(held) >= 2:
            raise EnvelopeError("equivocation", f"round {env.round} {env.sender}")
        if held:
            # a second commitment proves equivocation whenever it comes: kept and served, so
            # every node excludes the sender (it can only remove a member, never add one)
            held[env.payload_sha256] = env
            self._equivocated(env)
            return True
        third_party = relayer is not None and relayer != env.sender and relayer in self.members
        timely = st.phase <= Phase.COMMIT
        if not (timely or (relayed and third_party and st.phase <= Phase.COMMIT_CLOSED)):
            raise EnvelopeError("late_commit", f"round {env.round} {env.sender}")
        st.commits[env.sender] = {env.payload_sha256: env}
        if st.phase == Phase.NOT_STARTED and st.early_commit_at is None:
            st.early_commit_at = time.monotonic()
        return True

    def _complete(self, st: _Round, env: Envelope, pkt: _Packet, now: float | None) -> None:
        """The last chunk arrived: assemble and validate, or discard the whole packet."""
        by_digest = st.packets.get(env.sender, {})
        try:
            payload = envmod.assemble(list(pkt.chunks.values()))
            if self._validate is not None:
                self._validate(payload)
        except Exception as e:
            # the whole packet is bad (signed by a member, so it is that member's fault)
            by_digest.pop(env.payload_sha256, None)
            if not by_digest:
                st.packets.pop(env.sender, None)
            raise EnvelopeError("invalid_payload", f"{env.sender} round {env.round}: {e}") from None
        pkt.payload = payload
        st.first_seen.setdefault(env.sender, time.monotonic() if now is None else now)

    # -- what we hold ---------------------------------------------------------------------------
    def have(self, rnd: int) -> list[tuple[str, bytes]]:
        """Complete, valid packets held for a round: (sender, payload sha256)."""
        st = self.rounds.get(rnd)
        if st is None:
            return []
        return sorted(
            (s, d) for s, by in st.packets.items() for d, p in by.items() if p.payload is not None
        )

    def commitments(self, rnd: int) -> list[tuple[str, bytes]]:
        """Commitments held for a round (two for an equivocating sender): (sender, sha256)."""
        st = self.rounds.get(rnd)
        return [] if st is None else sorted((s, d) for s, by in st.commits.items() for d in by)

    def commitment(self, rnd: int, sender: str, digest: bytes) -> Envelope | None:
        """`sender`'s signed commitment to the packet with this sha256 in round `rnd`."""
        st = self.rounds.get(rnd)
        return None if st is None else st.commits.get(sender, {}).get(digest)

    def commits_for(self, rnd: int, exclude: set[tuple[str, bytes]]) -> list[Envelope]:
        """The commitment envelopes of a round that the asker does not hold."""
        st = self.rounds.get(rnd)
        if st is None:
            return []
        return [
            e
            for s, by in sorted(st.commits.items())
            for d, e in by.items()
            if (s, d) not in exclude
        ]

    def uncommitted(self, rnd: int) -> list[str]:
        """Members without a commitment for this round."""
        st = self.rounds.get(rnd)
        return [m for m in self.members if st is None or m not in st.commits]

    def awaited(self, rnd: int) -> list[str]:
        """Members with one commitment and no usable packet yet: the packets still to come."""
        st = self.rounds.get(rnd)
        if st is None:
            return []
        got = self.usable(rnd)
        return [
            m
            for m in self.members
            if len(st.commits.get(m, ())) == 1 and m not in got and m not in st.withdrawn
        ]

    def envelopes_for(self, rnd: int, exclude: set[tuple[str, bytes]]) -> list[Envelope]:
        """All chunks of complete packets of a round that the asker does not hold."""
        st = self.rounds.get(rnd)
        if st is None:
            return []
        out = []
        for s, by in sorted(st.packets.items()):
            for d, p in by.items():
                if p.payload is not None and (s, d) not in exclude:
                    out.extend(p.chunks[i] for i in sorted(p.chunks))
        return out

    def usable(self, rnd: int) -> dict[str, bytes]:
        """sender -> payload for senders with exactly one commitment and one complete packet
        (no equivocation)."""
        st = self.rounds.get(rnd)
        if st is None:
            return {}
        out = {}
        for s, by in st.packets.items():
            done = [p for p in by.values() if p.payload is not None]
            one_commit = len(st.commits.get(s, ())) == 1
            if one_commit and len(by) == 1 and len(done) == 1 and done[0].payload is not None:
                out[s] = done[0].payload
        return out

    def proof(self, rnd: int, sender: str) -> tuple[Envelope, Envelope] | None:
        """Two envelopes signed by `sender` for round `rnd` that commit to (or carry) two
        different packets: the evidence of its equivocation, or None if we hold none."""
        st = self.rounds.get(rnd)
        if st is None:
            return None
        commits = list(st.commits.get(sender, {}).values())
        if len(commits) >= 2:
            return commits[0], commits[1]
        firsts = [next(iter(p.chunks.values())) for p in st.packets.get(sender, {}).values()]
        return (firsts[0], firsts[1]) if len(firsts) >= 2 else None

    def missing(self, rnd: int) -> list[str]:
        got = self.usable(rnd)
        return [m for m in self.members if m not in got]

    def close(self, rnd: int) -> None:
        st = self.rounds.setdefault(rnd, _Round())
        if st.phase < Phase.CLOSED:
            st.phase = Phase.CLOSED

    def finish(self, rnd: int) -> list[tuple[str, bytes]]:
        """Freeze the round and record participation; packets in canonical order (by sender
        address)."""
        st = self.rounds.setdefault(rnd, _Round())
        got = self.usable(rnd)
        if st.phase != Phase.FINISHED:
            st.phase = Phase.FINISHED
            st.applied = sorted(got, key=str.lower)  # by address, as files and the chain
            for s in st.applied:
                self.participation[s] += 1
        assert st.applied is not None
        return [(s, got[s]) for s in st.applied]


def _check_committed(st: _Round, env: Envelope) -> None:
    """A packet chunk needs its sender's commitment to exactly this packet."""
    held = st.commits.get(env.sender)
    if not held:
        raise EnvelopeError("no_commit", f"round {env.round} {env.sender}: no commitment")
    c = held.get(env.payload_sha256)
    if c is None or (c.chunk_count, c.payload_len) != (env.chunk_count, env.payload_len):
        raise EnvelopeError("commit_mismatch", f"round {env.round} {env.sender}")

"""The epoch's transcript, agreed at its end (docs/protocol.md 4.5).

Each round is decided live from what a node received by its deadline, which a slow node, a
lost message or a member that reveals late to some peers can make differ between honest
nodes. Before voting, every node therefore pulls every round's signed evidence (commitments
and packets) from every member until each live peer has finished all rounds and holds nothing
it lacks. The canonical set of a round is then a function of that evidence alone:

- a member's packet is in when exactly one commitment of it is held, a member other than the
  sender vouches for that commitment (took it in time, or relays it), and the packet matching
  it is held;
- two signed commitments (or packets) of one member for one round exclude it, and are a proof
  anyone can check.

Honest nodes that all reach each other end with the same evidence, so with the same sets, late
or not; a node whose live rounds differed replays the transcript (aggregation only).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import trio
from libp2p.peer.id import ID

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.rounds import Phase
from dtrain_node.p2p.state import HostState
from dtrain_node.p2p.sync import PeerView, SyncClient


@dataclass(frozen=True)
class Equivocation:
    """Two envelopes one member signed for one round, committing to two different packets."""

    round: int
    sender: str
    first: bytes  # encoded envelopes
    second: bytes


@dataclass(frozen=True)
class Transcript:
    rounds: list[list[tuple[str, bytes]]]  # per round: (sender, payload), sorted by sender
    settled: bool  # every live peer agreed before the deadline
    equivocations: list[Equivocation]
    waited_s: float
    peers_agreed: int  # live peers that finished every round holding nothing we lacked
    peers_gone: int  # peers that were unreachable
    # per round, the encoded signed commitment of each packet in `rounds` (same order): what
    # lets anyone check the transcript's packets without trusting its holder
    commitments: list[list[bytes]] = field(default_factory=list)


class Reconciler:
    def __init__(self, state: HostState, sync: SyncClient) -> None:
        self._state = state
        self._sync = sync

    async def reconcile(self, rounds: int, deadline_s: float) -> Transcript:
        st, store = self._state, self._state.store
        t0 = time.monotonic()
        end = t0 + deadline_s
        store.begin_reconcile(rounds)
        st.notify()
        me = st.account.address
        # (peer, round) pairs confirmed; our own commitments some peer holds
        agreed: dict[ID, set[int]] = {}
        vouched: set[tuple[int, bytes]] = set()
        gone: set[ID] = set()
        settled = False
        while True:
            behind: set[ID] = set()  # peers that have not finished a round: not asked further
            for r in range(rounds):
                ask = {
                    p
                    for p in st.peers
                    if p not in gone and p not in behind and r not in agreed.get(p, set())
                }
                if not ask:
                    continue
                views = await self._sync.ask_all(r, ask, by=end)
                for pid in ask:
                    v = views.get(pid)
                    if v is None:
                        behind.add(pid)  # no answer in time: slow is not gone
                        continue
                    if not v.reachable:
                        gone.add(pid)
                        continue
                    vouched |= {(r, d) for s, d in v.commits if s == me}
                    if self._agrees(r, v):
                        agreed.setdefault(pid, set()).add(r)
                    elif v.phase < Phase.FINISHED:
                        behind.add(pid)  # rounds only go up: its later ones are not done
            live = [p for p in st.peers if p not in gone]
            if all(len(agreed.get(p, ())) == rounds for p in live):
                settled = True
                break
            if time.monotonic() >= end:
                break
            with trio.move_on_at(min(end, time.monotonic() + 4 * st.config.re_request_s)):
                await st.changed.wait()
        out = [self._canonical(r, vouched) for r in range(rounds)]
        commitments = [
            [self._commitment(r, sender, payload) for sender, payload in packets]
            for r, packets in enumerate(out)
        ]
        st.metrics.reconcile_timeouts += not settled
        return Transcript(
            rounds=out,
            settled=settled,
            equivocations=self._proofs(rounds),
            waited_s=time.monotonic() - t0,
            peers_agreed=sum(len(agreed.get(p, ())) == rounds for p in st.peers),
            peers_gone=len(gone),
            commitments=commitments,
        )

    def _agrees(self, r: int, v: PeerView) -> bool:
        """The peer finished round r and holds no evidence we lack (its own commitment aside:
        nobody may vouch for their own, so we could not take it from that peer)."""
        store = self._state.store
        commits = set(store.commitments(r))
        own = {c for c in v.commits | v.have if c[0] == v.signer and c not in commits}
        return (
            v.phase >= Phase.FINISHED
            and v.have - own <= set(store.have(r))
            and v.commits - own <= commits
        )

    def _canonical(self, r: int, vouched: set[tuple[int, bytes]]) -> list[tuple[str, bytes]]:
        store, me = self._state.store, self._state.account.address
        usable = store.usable(r)
        own = [d for s, d in store.commitments(r) if s == me]
        if me in usable and not (own and (r, own[0]) in vouched):
            del usable[me]  # no other member holds our commitment: nobody applies our packet
        return sorted(usable.items(), key=lambda item: item[0].lower())  # by address

    def _commitment(self, r: int, sender: str, payload: bytes) -> bytes:
        env = self._state.store.commitment(r, sender, hashlib.sha256(payload).digest())
        return b"" if env is None else env.encode()  # usable packets always have one

    def _proofs(self, rounds: int) -> list[Equivocation]:
        store = self._state.store
        out = []
        for r, sender in sorted(store.equivocations):
            if r >= rounds:
                continue
            pair = store.proof(r, sender)
            if pair is not None:
                out.append(Equivocation(r, sender, pair[0].encode(), pair[1].encode()))
        return out


def check_equivocation(proof: Equivocation) -> None:
    """Raises EnvelopeError unless the proof's envelopes are two valid signatures of its
    sender for its round that commit to different packets."""
    a, b = envmod.decode(proof.first), envmod.decode(proof.second)
    for e in (a, b):
        if e.sender != proof.sender or e.round != proof.round:
            raise envmod.EnvelopeError("malformed", "proof envelope of another sender or round")
        if e.recover_signer() != e.sender:
            raise envmod.EnvelopeError("bad_signature", f"not signed by {e.sender}")
    if (a.chain_id, a.contract, a.job_id, a.epoch) != (b.chain_id, b.contract, b.job_id, b.epoch):
        raise envmod.EnvelopeError("malformed", "proof envelopes of different epochs")
    if a.payload_sha256 == b.payload_sha256:
        raise envmod.EnvelopeError("malformed", "both envelopes name the same packet")

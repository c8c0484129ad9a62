"""Two-phase rounds, in process: commitments, what a packet needs to be accepted, what a late
commitment is, equivocation evidence; and codec fuzzing of both envelope kinds."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID, account
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain_node.p2p import envelope, wire
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.host import GossipConfig
from dtrain_node.p2p.intake import Intake
from dtrain_node.p2p.rounds import Phase, RoundStore, StoreLimits
from dtrain_node.p2p.state import HostState

MEMBERS = [account(i).address for i in range(4)]
ARGS = {"chain_id": CHAIN_ID, "contract": CONTRACT, "job_id": JOB_ID, "epoch": 0}


def packet(i: int, rnd: int, payload: bytes | None = None, chunk: int = 1000) -> tuple:
    data = payload if payload is not None else bytes([i, rnd]) * 1500
    kw = {**ARGS, "round": rnd, "payload": data, "chunk_size": chunk}
    chunks = envelope.seal(account(i), **kw)
    return envelope.commitment(account(i), chunks), chunks


def store() -> RoundStore:
    s = RoundStore(CHAIN_ID, CONTRACT, JOB_ID, StoreLimits(1 << 20, 4, 2))
    s.set_epoch(0, MEMBERS, None)
    return s


def reason(s: RoundStore, env: envelope.Envelope, relayed: bool = False, **kw: object) -> str:
    with pytest.raises(EnvelopeError) as e:
        s.offer(env, relayed, **kw)  # type: ignore[arg-type]
    return e.value.reason


def test_packet_needs_its_senders_matching_commitment() -> None:
    s = store()
    s.begin(0)
    c1, p1 = packet(1, 0)
    assert reason(s, p1[0]) == "no_commit"
    assert s.offer(c1, relayed=False)
    _, p_other = packet(1, 0, payload=b"another packet")
    assert reason(s, p_other[0]) == "commit_mismatch"
    _, p_rechunked = packet(1, 0, chunk=500)  # same payload, other chunking
    assert reason(s, p_rechunked[0]) == "commit_mismatch"
    for e in p1:
        assert s.offer(e, relayed=False)
    assert list(s.usable(0)) == [MEMBERS[1]]
    assert s.awaited(0) == [] and s.uncommitted(0) == sorted(MEMBERS[:1] + MEMBERS[2:])


def test_commitments_are_taken_until_the_commit_phase_closes_then_late() -> None:
    s = store()
    s.begin(0)
    c1, p1 = packet(1, 0)
    c2, _ = packet(2, 0)
    c3, _ = packet(3, 0)
    s.offer(c1, relayed=False)
    s.offer(p1[0], relayed=False)  # someone revealed: our commit phase still runs to its end
    assert not s.revealed_by_quorum(0, MEMBERS[0]) and s.phase(0) == Phase.COMMIT
    # commit deadline: first commitments now only from a third member's signed sync reply
    s.close_commits(0)
    assert s.phase(0) == Phase.COMMIT_CLOSED
    assert reason(s, c2) == "late_commit"
    assert reason(s, c2, relayed=True, relayer=MEMBERS[2]) == "late_commit"  # from itself
    assert reason(s, c2, relayed=True, relayer=None) == "late_commit"  # unsigned reply
    assert s.offer(c2, relayed=True, relayer=MEMBERS[1])  # that member took it in time
    s.reveal(0)
    assert reason(s, c3, relayed=True, relayer=MEMBERS[1]) == "late_commit"
    held = [(MEMBERS[1], c1.payload_sha256), (MEMBERS[2], c2.payload_sha256)]
    assert s.commitments(0) == sorted(held)
    assert s.awaited(0) == sorted(MEMBERS[1:3])  # committed, packets not (all) in yet


def test_future_round_commitments_buffered_and_early_reveals_counted() -> None:
    s = store()
    s.begin(0)
    c1, p1 = packet(1, 1)
    c2, _ = packet(2, 1)
    assert s.offer(c1, relayed=False) and s.offer(p1[0], relayed=False)
    assert s.offer(c2, relayed=False)  # round 1 not begun here: its commit phase is open
    s.finish(0)
    s.begin(1)
    # one member revealed round 1 before we began it: it may run ahead, we still commit
    assert not s.revealed_by_quorum(1, MEMBERS[0])
    assert s.uncommitted(1) == sorted([MEMBERS[0], MEMBERS[3]])
    c3, p3 = packet(3, 1)
    _, p2 = packet(2, 1)
    assert s.offer(c3, relayed=False) and s.offer(p3[0], relayed=False)
    assert not s.revealed_by_quorum(1, MEMBERS[0])  # 2 of 4 seats: a third could be one party
    assert s.offer(p2[0], relayed=False)
    assert s.revealed_by_quorum(1, MEMBERS[0])  # 3 of 4: our commitment would be late there
    assert not s.revealed_by_quorum(1, MEMBERS[1])  # for member 1 only 2 others revealed


def test_second_commitment_is_evidence_and_excludes_the_sender() -> None:
    s = store()
    s.begin(0)
    c1, p1 = packet(1, 0)
    c1b, p1b = packet(1, 0, payload=b"the other version")
    s.offer(c1, relayed=False)
    for e in p1:
        s.offer(e, relayed=False)
    s.reveal(0)
    assert list(s.usable(0)) == [MEMBERS[1]]
    assert s.offer(c1b, relayed=False)  # after the reveal too: it can only remove a member
    assert s.usable(0) == {} and s.equivocations == [(0, MEMBERS[1])]
    assert s.offer(p1b[0], relayed=True)  # its packet is evidence too, kept and served
    assert reason(s, packet(1, 0, payload=b"third")[0]) == "equivocation"
    assert len(s.commits_for(0, set())) == 2
    assert s.commits_for(0, {(MEMBERS[1], c1.payload_sha256)}) == [c1b]


def test_late_commitment_and_unmatched_packets_are_not_relayed(tmp_path: Path) -> None:
    s = store()
    key = ident.peer_key_of(ident.key_pair(b"\2" * 32))
    cfg = GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID)
    intake = Intake(HostState(cfg, account(0), key, ident.peer_id_from_key(key), "t", s))
    s.begin(0)
    c1, p1 = packet(1, 0)
    c2, p2 = packet(2, 0)
    assert not intake.accept(p1[0].encode(), relayed=False)  # no commitment: not relayed
    assert intake.accept(c1.encode(), relayed=False)
    s.reveal(0)
    assert not intake.accept(c2.encode(), relayed=False)  # late commitment: not relayed
    assert not intake.accept(p2[0].encode(), relayed=False)
    assert intake.accept(p1[0].encode(), relayed=False)
    assert intake.accept(c1.encode(), relayed=False)  # duplicate: authentic, relayed
    assert dict(s.dropped) == {"no_commit": 2, "late_commit": 1, "duplicate": 1}


def test_commitment_layout_and_signature() -> None:
    c, chunks = packet(2, 7)
    raw = c.encode()
    assert raw[:6] == b"DTGE\x02\x01" and len(raw) == envelope.OVERHEAD
    assert envelope.decode(raw) == c and c.recover_signer() == MEMBERS[2]
    assert (c.payload_sha256, c.chunk_count, c.payload_len) == (
        chunks[0].payload_sha256,
        len(chunks),
        3000,
    )
    # the kind is signed: a chunk cannot pass as a commitment or the other way round
    as_chunk = dataclasses.replace(c, kind=envelope.CHUNK)
    assert as_chunk.recover_signer() != MEMBERS[2]
    with pytest.raises(EnvelopeError):
        dataclasses.replace(c, chunk=b"x")
    bad = bytearray(raw)
    bad[5] = 2
    with pytest.raises(EnvelopeError, match="malformed"):
        envelope.decode(bytes(bad))


u64 = st.integers(0, (1 << 64) - 1)


@settings(max_examples=150, deadline=None)
@given(
    u64, st.integers(0, (1 << 256) - 1), u64, u64, st.binary(max_size=3000), st.integers(1, 4000)
)
def test_commitment_roundtrip_any_fields(
    chain: int, job: int, epoch: int, rnd: int, payload: bytes, chunk: int
) -> None:
    kw = {"chain_id": chain, "contract": CONTRACT, "job_id": job, "epoch": epoch, "round": rnd}
    chunks = envelope.seal(account(1), payload=payload, chunk_size=chunk, **kw)
    c = envelope.commitment(account(1), chunks)
    back = envelope.decode(c.encode())
    assert back == c and back.kind == envelope.COMMIT and back.recover_signer() == MEMBERS[1]
    assert (back.chunk_count, back.payload_len) == (len(chunks), len(payload))
    assert back.payload_sha256 == hashlib.sha256(payload).digest()


_SAMPLES = [packet(1, 3)[0].encode(), packet(1, 3)[1][0].encode()]
# byte overwrites (position, value) and a cut (< 0) or zero padding (> 0)
_FLIPS = st.lists(st.tuples(st.integers(0, 4000), st.integers(0, 255)), max_size=4)
_CUT = st.integers(-3, 3)


def mutated(raw: bytes, flips: list[tuple[int, int]], cut: int) -> bytes:
    data = bytearray(raw)
    for pos, val in flips:
        data[pos % len(data)] = val
    return bytes(data[:cut] if cut < 0 else data + bytes(cut))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_SAMPLES), _FLIPS, _CUT)
def test_mutated_envelopes_raise_only_envelope_error(raw: bytes, flips: list, cut: int) -> None:
    data = mutated(raw, flips, cut)
    try:
        env = envelope.decode(data)
    except EnvelopeError:
        return
    assert env.encode() == data  # whatever decodes re-encodes to the same bytes
    assert env.kind in (envelope.CHUNK, envelope.COMMIT)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(MEMBERS), st.binary(min_size=32, max_size=32)), max_size=5),
    st.lists(st.tuples(st.sampled_from(MEMBERS), st.binary(min_size=32, max_size=32)), max_size=5),
    st.binary(min_size=16, max_size=16),
    st.integers(0, 5),
)
def test_sync_messages_with_commitments_roundtrip(
    have: list, commits: list, nonce: bytes, phase: int
) -> None:
    req = wire.SyncRequest(JOB_ID, 1, 2, tuple(have), tuple(commits), nonce)
    assert wire.decode_sync_request(req.encode()) == req
    rep = wire.SyncReply(wire.SYNC_OK, phase, tuple(have), 3, tuple(commits))
    sig = account(2).unsafe_sign_hash(rep.signing_digest(nonce)).signature
    back = wire.decode_sync_reply(dataclasses.replace(rep, signature=bytes(sig)).encode())
    assert back.signer(nonce) == MEMBERS[2] and back.signer(bytes(16 - 1) + b"x") != MEMBERS[2]
    assert dataclasses.replace(back, signature=b"") == rep


_REPLY = wire.SyncReply(
    wire.SYNC_OK, 2, ((MEMBERS[0], b"\1" * 32),), 2, ((MEMBERS[1], b"\2" * 32),)
)
_REQUEST = wire.SyncRequest(JOB_ID, 1, 2, ((MEMBERS[0], b"\1" * 32),), ((MEMBERS[1], b"\2" * 32),))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([_REPLY.encode(), _REQUEST.encode()]), _FLIPS, _CUT)
def test_mutated_sync_messages_raise_only_wire_error(raw: bytes, flips: list, cut: int) -> None:
    data = mutated(raw, flips, cut)
    decode = wire.decode_sync_reply if raw[:4] == b"DTSR" else wire.decode_sync_request
    try:
        msg = decode(data)
    except wire.WireError:
        return
    assert msg.encode() == data  # whatever decodes re-encodes to the same bytes


def test_reconciling_takes_vouched_evidence_for_every_round_and_nothing_else() -> None:
    """At the epoch's end a finished round (or one this process never ran, after a restart)
    takes a first commitment only when a member other than its sender relays it, a second one
    as equivocation evidence, packets that match a held commitment, and nothing by gossip."""
    s = store()
    s.begin(0)
    c1, p1 = packet(1, 0)
    s.offer(c1, relayed=False)
    s.finish(0)
    s.begin(1)
    s.finish(1)
    c2, p2 = packet(2, 0)
    assert reason(s, c2, relayed=True, relayer=MEMBERS[1]) == "late_commit"  # not reconciling
    s.begin_reconcile(9)  # rounds 2..8 never ran here: finished, empty
    assert s.phase(8) == Phase.FINISHED and s.in_window(0) and not s.in_window(9)
    assert reason(s, c2) == "late_commit"  # gossip: no
    assert reason(s, c2, relayed=True, relayer=MEMBERS[2]) == "late_commit"  # its own word
    assert reason(s, c2, relayed=True, relayer=None) == "late_commit"  # unsigned reply
    outsider = account(9).address
    assert reason(s, c2, relayed=True, relayer=outsider) == "late_commit"
    assert s.offer(c2, relayed=True, relayer=MEMBERS[3])  # another member vouches
    for e in p1 + p2:
        assert s.offer(e, relayed=True, relayer=MEMBERS[3])
    assert sorted(s.usable(0)) == sorted([MEMBERS[1], MEMBERS[2]])
    c7, p7 = packet(3, 7)
    assert reason(s, p7[0], relayed=True, relayer=MEMBERS[0]) == "no_commit"
    assert s.offer(c7, relayed=True, relayer=MEMBERS[0])
    assert all(s.offer(e, relayed=True, relayer=MEMBERS[0]) for e in p7)
    assert list(s.usable(7)) == [MEMBERS[3]]
    # a second commitment needs no voucher: it can only remove its signer
    c2b, _ = packet(2, 0, payload=b"other")
    assert s.offer(c2b, relayed=True, relayer=MEMBERS[2])
    assert list(s.usable(0)) == [MEMBERS[1]] and (0, MEMBERS[2]) in s.equivocations
    proof = s.proof(0, MEMBERS[2])
    assert proof is not None and {e.payload_sha256 for e in proof} == {
        c2.payload_sha256,
        c2b.payload_sha256,
    }
    assert s.proof(0, MEMBERS[1]) is None

"""The epoch's evidence file: a transcript of real DeMo packets, each with its sender's signed
commitment, survives the file byte for byte, replays to the very shared state the members
reached live, and any packet its sender did not commit is refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from eth_utils import keccak, to_checksum_address
from harness.spelling import spelled_apart
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain_node.errors import TranscriptInvalid
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.p2p import envelope as envmod
from dtrain_node.train.start import start_model
from dtrain_node.verify import evidence as ev

K, ROUNDS, CHAIN, JOB, EPOCH, ATTEMPT = 2, 2, 31337, 7, 0, 3
CONTRACT = to_checksum_address("0x" + "cc" * 20)
CFG = DeMoConfig(
    mode="local", sync_interval=K, lr=1.0, compress=CompressConfig(k2d=4, k1d=1, bits=1)
)


ACCOUNTS = spelled_apart(3)


def _fresh(sender: str) -> tuple[torch.nn.Module, DeMo]:
    torch.manual_seed(0)
    model = start_model("builtin:tiny").fresh()
    return model, DeMo(model.named_parameters(), CFG, sender=sender)


def _signed(account, rnd: int, payload: bytes, attempt: int = ATTEMPT) -> bytes:
    chunks = envmod.seal(
        account,
        chain_id=CHAIN,
        contract=CONTRACT,
        job_id=JOB,
        epoch=attempt,
        round=rnd,
        payload=payload,
        chunk_size=envmod.MAX_CHUNK,
    )
    return envmod.commitment(account, chunks).encode()


@pytest.fixture(scope="module")
def trained():
    """Three members train ROUNDS rounds together, each applying all three packets: the
    transcript they signed, the start state and the shared state every member reached."""
    torch.set_num_threads(1)
    members = [_fresh(a.address) for a in ACCOUNTS]
    start = [t.clone() for t in members[0][1].theta_sync]
    rounds = []
    for r in range(ROUNDS):
        packets = []
        for i, (model, opt) in enumerate(members):
            g = torch.Generator().manual_seed(100 * r + i)
            for _ in range(K):
                ids = torch.randint(0, 256, (2, 16), generator=g)
                model(input_ids=ids, labels=ids).loss.backward()
                opt.inner_step()
            packets.append((opt.sender, opt.prepare()))
        for _, opt in members:
            opt.apply(packets)
        signed = zip(ACCOUNTS, packets, strict=True)
        rounds.append(tuple(ev.Packet(s, p, _signed(a, r, p)) for a, (s, p) in signed))
    t = ev.EpochTranscript(CHAIN, CONTRACT, JOB, EPOCH, ATTEMPT, tuple(rounds))
    return t, start, [x.clone() for x in members[0][1].theta_sync]


def _members() -> list[str]:
    return [a.address for a in ACCOUNTS]


def test_a_transcript_file_replays_to_the_shared_state_the_members_reached(trained) -> None:
    t, start, reached = trained
    assert any(not torch.equal(a, b) for a, b in zip(start, reached, strict=True))  # trained
    back = ev.decode(t.encode())
    assert back == t and back.encode() == t.encode()
    ev.verify(back, _members())
    _, referee = _fresh("0x" + "00" * 20)  # an outsider: holds no private state of anyone
    stats = referee.replay(start, back.packets())
    assert [len(s.applied) for s in stats] == [3] * ROUNDS
    for a, b in zip(referee.theta_sync, reached, strict=True):
        assert torch.equal(a, b)


def test_a_packet_its_sender_did_not_commit_is_refused(trained) -> None:
    t = trained[0]
    first = t.rounds[0][0]
    other = ACCOUNTS[1]

    def with_first(p: ev.Packet, **kw) -> ev.EpochTranscript:
        return dataclasses.replace(t, rounds=((p, *t.rounds[0][1:]), *t.rounds[1:]), **kw)

    changed = first.payload[:-1] + bytes([first.payload[-1] ^ 1])
    cases = {
        "payload": with_first(dataclasses.replace(first, payload=changed)),
        "signature": with_first(  # signed by another member, under the first one's name
            dataclasses.replace(first, commitment=_forged(other, first.sender, 0, first.payload))
        ),
        "unsigned": with_first(dataclasses.replace(first, commitment=b"")),
        "commitment": with_first(  # committed in another attempt
            dataclasses.replace(first, commitment=_signed(ACCOUNTS[0], 0, first.payload, 9))
        ),
    }
    for reason, bad in cases.items():
        with pytest.raises(TranscriptInvalid, match=reason):
            ev.verify(ev.decode(bad.encode()), _members())
    with pytest.raises(TranscriptInvalid, match="member"):
        ev.verify(t, _members()[1:])
    # the same signature in other bytes (v = 59 recovers the same signer in eth-keys)
    sig_v = first.commitment[:-1] + bytes([first.commitment[-1] ^ 32])
    with pytest.raises(TranscriptInvalid, match="not canonical"):
        ev.verify(with_first(dataclasses.replace(first, commitment=sig_v)), _members())
    # a packet committed in round 0 replayed as round 1's
    moved = dataclasses.replace(t, rounds=(t.rounds[0], (first, *t.rounds[1][1:])))
    with pytest.raises(TranscriptInvalid, match="commitment"):
        ev.verify(moved, _members())


def _forged(signer, sender: str, rnd: int, payload: bytes) -> bytes:
    env = envmod.decode(_signed(signer, rnd, payload))
    env = dataclasses.replace(env, sender=sender, signature=b"")
    sig = signer.unsafe_sign_hash(env.signing_digest()).signature
    return dataclasses.replace(env, signature=bytes(sig)).encode()


def test_the_root_commits_to_every_packet_and_its_round(trained) -> None:
    t = trained[0]
    root = t.root()
    assert root == ev.decode(t.encode()).root()
    first = t.rounds[0][0]
    dropped = dataclasses.replace(t, rounds=(t.rounds[0][1:], *t.rounds[1:]))
    changed = dataclasses.replace(
        t, rounds=((dataclasses.replace(first, payload=first.payload + b"\0"), *t.rounds[0][1:]),)
    )
    swapped = dataclasses.replace(t, rounds=t.rounds[::-1])
    roots = {root, dropped.root(), changed.root(), swapped.root()}
    assert len(roots) == 4
    # the commitments are evidence of origin, not part of what the root commits to
    unsigned = dataclasses.replace(
        t, rounds=tuple(tuple(dataclasses.replace(p, commitment=b"") for p in r) for r in t.rounds)
    )
    assert unsigned.root() == root


def test_merkle_root_layout() -> None:
    a, b, c = (keccak(bytes([i])) for i in range(3))
    assert ev.merkle_root([]) == bytes(32)
    assert ev.merkle_root([a]) == a
    assert ev.merkle_root([a, b]) == keccak(a + b)
    assert ev.merkle_root([a, b, c]) == keccak(keccak(a + b) + c)


def test_decode_refuses_malformed_files(trained, tmp_path) -> None:
    data = trained[0].encode()
    for n in range(len(data)):
        with pytest.raises(TranscriptInvalid):
            ev.decode(data[:n])
    with pytest.raises(TranscriptInvalid, match="trailing"):
        ev.decode(data + b"\0")
    with pytest.raises(TranscriptInvalid, match="version"):
        ev.decode(data[:4] + b"\x02" + data[5:])
    t = trained[0]
    unsorted = dataclasses.replace(t, rounds=(t.rounds[0][::-1], *t.rounds[1:]))
    with pytest.raises(TranscriptInvalid, match="order"):
        ev.decode(unsorted.encode())
    with pytest.raises(TranscriptInvalid, match="order"):  # nor written
        ev.save(tmp_path, unsorted)
    assert not list(tmp_path.iterdir())
    twice = dataclasses.replace(t, rounds=((t.rounds[0][0], t.rounds[0][0]),))
    with pytest.raises(TranscriptInvalid, match="order"):
        ev.decode(twice.encode())
    with pytest.raises(TranscriptInvalid, match="type"):
        ev.decode("not bytes")  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=600))
def testFuzz_decode_raises_only_transcript_invalid(data: bytes) -> None:
    for blob in (data, ev.MAGIC + bytes([ev.VERSION]) + data):
        try:
            t = ev.decode(blob)
        except TranscriptInvalid:
            continue
        assert t.encode() == blob


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def testFuzz_a_changed_byte_is_refused_or_no_longer_verifies(trained, data) -> None:
    raw = bytearray(trained[0].encode())
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    try:
        t = ev.decode(bytes(raw))
    except TranscriptInvalid:
        return
    assert t.encode() == bytes(raw)
    if t.rounds != trained[0].rounds:  # a packet changed: its commitment no longer fits
        with pytest.raises(TranscriptInvalid):
            ev.verify(t, _members())


def _without(t: ev.EpochTranscript, rnd: int, sender: str) -> ev.EpochTranscript:
    rounds = list(t.rounds)
    rounds[rnd] = tuple(p for p in rounds[rnd] if p.sender != sender)
    return dataclasses.replace(t, rounds=tuple(rounds))


def test_union_puts_back_what_a_doctored_file_left_out(trained) -> None:
    """A challenger's file without a member's packets, united with that member's own file, is
    the members' transcript again: it replays to the shared state they reached."""
    t, start, reached = trained
    honest = ACCOUNTS[2].address
    doctored = _without(_without(t, 0, honest), 1, honest)
    _, referee = _fresh("0x" + "00" * 20)
    referee.replay([x.clone() for x in start], doctored.packets())
    assert any(not torch.equal(a, b) for a, b in zip(referee.theta_sync, reached, strict=True))
    merged = ev.union([doctored, t])
    assert merged == t and ev.union([t, doctored]) == t
    _, referee = _fresh("0x" + "00" * 20)
    referee.replay([x.clone() for x in start], merged.packets())
    for a, b in zip(referee.theta_sync, reached, strict=True):
        assert torch.equal(a, b)


def test_a_packet_signed_after_the_epoch_moves_the_union_not_the_voters_own_file(
    trained,
) -> None:
    """The attack the referees' certified-first rule answers (fault `inject`): a member
    re-signs its round-0 packet with its round-1 payload after the epoch and names a file
    holding it. United with the honest file, the sender has two packets in round 0 and none
    counts: the union replays away from the state every member reached, so a referee that
    only unites would turn the honest quorum into fabricators. The honest voters' own file
    still replays to that state, which is what the referee checks first."""
    t, start, reached = trained
    cheat = ACCOUNTS[1]
    (later,) = [p for p in t.rounds[1] if p.sender == cheat.address]
    rounds = list(t.rounds)
    rounds[0] = tuple(
        ev.Packet(p.sender, later.payload, _signed(cheat, 0, later.payload))
        if p.sender == cheat.address
        else p
        for p in rounds[0]
    )
    injected = dataclasses.replace(t, rounds=tuple(rounds))
    ev.verify(injected, _members())  # valid by its signatures
    merged = ev.union([injected, t])
    assert cheat.address not in {p.sender for p in merged.rounds[0]}
    _, referee = _fresh("0x" + "00" * 20)
    referee.replay([x.clone() for x in start], merged.packets())
    assert any(not torch.equal(a, b) for a, b in zip(referee.theta_sync, reached, strict=True))
    _, referee = _fresh("0x" + "00" * 20)
    referee.replay([x.clone() for x in start], t.packets())
    for a, b in zip(referee.theta_sync, reached, strict=True):
        assert torch.equal(a, b)


def test_union_drops_a_sender_that_signed_two_packets_for_a_round(trained) -> None:
    t, _, _ = trained
    cheat = ACCOUNTS[1]
    other = b"another packet"
    rounds = list(t.rounds)
    rounds[1] = tuple(
        ev.Packet(p.sender, other, _signed(cheat, 1, other)) if p.sender == cheat.address else p
        for p in rounds[1]
    )
    twin = dataclasses.replace(t, rounds=tuple(rounds))
    ev.verify(twin, _members())
    merged = ev.union([t, twin])
    assert [p.sender for p in merged.rounds[1]] == [
        p.sender for p in t.rounds[1] if p.sender != cheat.address
    ]
    assert merged.rounds[0] == t.rounds[0]


def test_union_refuses_files_of_another_attempt(trained) -> None:
    t, _, _ = trained
    with pytest.raises(TranscriptInvalid, match="another attempt"):
        ev.union([t, dataclasses.replace(t, attempt=t.attempt + 1)])
    with pytest.raises(TranscriptInvalid, match="no transcript"):
        ev.union([])


def test_a_live_transcript_is_saved_in_the_files_order() -> None:
    """The members' transcript lists each round's senders by their checksum spelling (the
    gossip store's keys, sorted as strings); the file orders them by address. Saved as the
    store lists them, a file of members whose spellings sort apart would not decode: every
    referee would refuse the honest challenger's evidence."""
    from types import SimpleNamespace

    from dtrain_node.operator.epoch import EpochTrainer
    from dtrain_node.p2p.reconcile import Transcript

    store_order = sorted(a.address for a in ACCOUNTS)  # as reconcile lists a round
    assert store_order != _members()
    rounds = [[(s, f"packet {i}".encode()) for i, s in enumerate(store_order)]]
    commits = [[f"commit {i}".encode() for i in range(len(store_order))]]
    t = Transcript(rounds, True, [], 0.0, 2, 0, commits)
    job = SimpleNamespace(id=JOB, state=SimpleNamespace(epoch=EPOCH, attempt=ATTEMPT))
    env = SimpleNamespace(cfg=SimpleNamespace(contract=CONTRACT), chain_id=CHAIN)
    saved = EpochTrainer._evidence(SimpleNamespace(job=job, env=env), t)  # type: ignore[arg-type]
    back = ev.decode(saved.encode())
    assert [p.sender for p in back.rounds[0]] == _members()
    for p in back.rounds[0]:
        i = store_order.index(p.sender)
        assert (p.payload, p.commitment) == (rounds[0][i][1], commits[0][i])


def test_no_transcript_of_an_epoch_exceeds_its_size_bound(trained) -> None:
    """A referee caps a named file's download at the bound of the job's rounds and members:
    the members' real file fits, and one with the largest packets and commitments every round
    lands exactly on it."""
    t = trained[0]
    members = len(_members())
    packet = max(len(p.payload) for packets in t.rounds for p in packets)
    assert len(t.encode()) <= ev.size_bound(len(t.rounds), members, packet)
    full = ev.Packet(to_checksum_address(b"\x01" * 20), b"\x00" * 100, b"\x00" * ev.MAX_COMMITMENT)
    senders = [to_checksum_address(bytes([i + 1]) * 20) for i in range(members)]
    rounds = tuple(tuple(dataclasses.replace(full, sender=s) for s in senders) for _ in range(3))
    big = ev.EpochTranscript(CHAIN, CONTRACT, JOB, EPOCH, ATTEMPT, rounds)
    assert len(big.encode()) == ev.size_bound(3, members, 100)

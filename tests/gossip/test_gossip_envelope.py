"""Envelope signing, chunking, validation rules and identity: pure logic, no network."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from pathlib import Path

import pytest
from eth_account import Account
from harness.commit_store import AutoCommitStore
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID, account
from harness.gossip_worker import synthetic_packet, synthetic_spec
from harness.spelling import spelled_apart
from hypothesis import given, settings
from hypothesis import strategies as st
from libp2p.peer.id import ID

from dtrain_node.optim import codec
from dtrain_node.p2p import envelope
from dtrain_node.p2p import identity as p2p_identity
from dtrain_node.p2p import wire as p2p_wire
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.host import GossipConfig
from dtrain_node.p2p.rounds import Phase, RoundStore, StoreLimits

MEMBERS = [account(i).address for i in range(3)]
SPEC = synthetic_spec(300_000)


def seal(i: int = 0, rnd: int = 0, payload: bytes | None = None, **kw: object) -> list:
    args = {"chain_id": CHAIN_ID, "contract": CONTRACT, "job_id": JOB_ID, "epoch": 0}
    args.update(kw)  # type: ignore[arg-type]
    data = synthetic_packet(SPEC, i * 100 + rnd) if payload is None else payload
    return envelope.seal(account(i), round=rnd, payload=data, **args)  # type: ignore[arg-type]


def store(validate: bool = True, max_payload: int = 1 << 20) -> RoundStore:
    limits = StoreLimits(max_payload, window_back=2, window_ahead=1)
    s = AutoCommitStore(CHAIN_ID, CONTRACT, JOB_ID, limits)
    s.set_epoch(0, MEMBERS, (lambda p: codec.decode(SPEC, p) and None) if validate else None)
    return s


def reason(s: RoundStore, env: envelope.Envelope, relayed: bool = False) -> str:
    with pytest.raises(EnvelopeError) as e:
        s.offer(env, relayed)
    return e.value.reason


def test_seal_decode_roundtrip_and_signer() -> None:
    (env,) = seal(1, 3)
    back = envelope.decode(env.encode())
    assert back == env
    assert back.recover_signer() == MEMBERS[1]
    assert envelope.assemble([back]) == synthetic_packet(SPEC, 103)


@pytest.mark.parametrize(
    "field,value",
    [("round", 4), ("epoch", 1), ("job_id", JOB_ID + 1), ("chain_id", 1), ("chunk_index", 0)],
)
def test_any_changed_field_breaks_the_signature(field: str, value: int) -> None:
    env = seal(0, 3, payload=os.urandom(1000), chunk_size=500)[1]
    changed = dataclasses.replace(env, **{field: value})
    assert changed.recover_signer() != env.sender
    flipped = dataclasses.replace(env, chunk=bytes([env.chunk[0] ^ 1]) + env.chunk[1:])
    assert flipped.recover_signer() != env.sender


_N = 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFEBAAEDCE6AF48A03BBFD25E8CD0364141  # secp256k1 order


def test_a_signature_has_one_encoding() -> None:
    """The same signature re-encoded (v = 0, 35, 59 instead of 27; or s -> n - s with v
    flipped, which ECDSA also recovers) is refused: a relayer cannot mint other bytes that
    authenticate as a member's envelope (the contract's ECDSA.tryRecover refuses them too)."""
    env = seal(0, 3)[0]
    r, s_, v = env.signature[:32], int.from_bytes(env.signature[32:64]), env.signature[64]
    assert v in (27, 28) and s_ <= _N // 2 and env.recover_signer() == env.sender
    variants = [r + s_.to_bytes(32) + bytes([w]) for w in (v - 27, v + 8, v + 32)]
    variants.append(r + (_N - s_).to_bytes(32) + bytes([55 - v]))  # the high-s twin
    s = store()
    s.begin(3)
    for sig in variants:
        other = dataclasses.replace(env, signature=sig)
        with pytest.raises(EnvelopeError, match="not canonical"):
            other.recover_signer()
        assert reason(s, envelope.decode(other.encode())) == "bad_signature"


def test_chunks_stay_under_one_mebibyte_and_reassemble() -> None:
    payload = os.urandom(1_300_000)
    envs = seal(0, 0, payload=payload, chunk_size=envelope.MAX_CHUNK)
    assert len(envs) == 3
    assert all(len(e.encode()) < 600 * 1024 for e in envs)
    assert envelope.assemble(envs[::-1]) == payload
    bad = dataclasses.replace(envs[1], chunk=b"x" * len(envs[1].chunk))
    with pytest.raises(EnvelopeError, match="sha256"):
        envelope.assemble([envs[0], bad, envs[2]])


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_decode_random_bytes_raises_only_envelope_error(data: bytes) -> None:
    with pytest.raises(EnvelopeError):
        envelope.decode(data)


def test_decode_truncated_and_trailing() -> None:
    raw = seal()[0].encode()
    for bad in (raw[:-1], raw + b"\0", b"XXXX" + raw[4:]):
        with pytest.raises(EnvelopeError, match="malformed"):
            envelope.decode(bad)


def test_store_rejects_each_bad_kind_with_its_reason() -> None:
    s = store()
    s.begin(5)
    assert reason(s, seal(0, 5, job_id=JOB_ID + 1)[0]) == "wrong_job"
    assert reason(s, seal(0, 5, contract="0x" + "11" * 20)[0]) == "wrong_job"
    assert reason(s, seal(0, 5, epoch=1)[0]) == "wrong_epoch"
    assert reason(s, seal(0, 2)[0]) == "round_window"  # replay of an old round
    assert reason(s, seal(0, 7)[0]) == "round_window"  # too far ahead
    outsider = envelope.seal(
        Account.create(), chain_id=CHAIN_ID, contract=CONTRACT, job_id=JOB_ID, epoch=0, round=5,
        payload=b"x",
    )[0]  # fmt: skip
    assert reason(s, outsider) == "not_member"
    forged = dataclasses.replace(seal(0, 5)[0], sender=MEMBERS[1])
    assert reason(s, forged) == "bad_signature"
    assert reason(s, seal(1, 5, payload=b"DMoP" + b"\0" * 50)[0]) == "invalid_payload"
    big = seal(2, 5, payload=os.urandom(1_200_000))
    assert reason(s, big[0]) == "oversized"
    good = seal(0, 5)[0]
    assert s.offer(good, relayed=False)
    assert reason(s, good) == "duplicate"
    assert s.missing(5) == sorted(MEMBERS[1:])


def test_store_future_round_buffered_then_used() -> None:
    s = store()
    s.begin(0)
    assert s.offer(seal(1, 1)[0], relayed=False)  # a fast peer is one round ahead
    s.finish(0)
    s.begin(1)
    assert list(s.usable(1)) == [MEMBERS[1]]


def test_store_closed_round_takes_relays_only_and_finished_is_frozen() -> None:
    s = store()
    s.begin(0)
    s.close(0)
    assert s.phase(0) == Phase.CLOSED
    assert reason(s, seal(1, 0)[0]) == "late"
    assert s.offer(seal(1, 0)[0], relayed=True)
    got = s.finish(0)
    assert [a for a, _ in got] == [MEMBERS[1]]
    assert reason(s, seal(2, 0)[0], relayed=True) == "finished"
    assert s.participation == {MEMBERS[0]: 0, MEMBERS[1]: 1, MEMBERS[2]: 0}


def test_a_finished_round_lists_its_senders_by_address() -> None:
    """Members whose checksum spellings sort otherwise than their addresses: the round's
    canonical order (what evidence files, the aggregate and the chain use) is by address."""
    apart = spelled_apart(3)
    members = [a.address for a in apart]
    s = AutoCommitStore(CHAIN_ID, CONTRACT, JOB_ID, StoreLimits(1 << 20, 2, 1))
    s.set_epoch(0, list(reversed(members)), None)
    s.begin(0)
    for i, a in enumerate(reversed(apart)):
        env = envelope.seal(
            a, chain_id=CHAIN_ID, contract=CONTRACT, job_id=JOB_ID, epoch=0, round=0,
            payload=synthetic_packet(SPEC, i),
        )[0]  # fmt: skip
        assert s.offer(env, relayed=False)
    assert members != sorted(members)  # as strings they sort apart
    assert [sender for sender, _ in s.finish(0)] == members


def test_equivocation_excludes_the_sender() -> None:
    s = store()
    s.begin(0)
    a, b = seal(1, 0)[0], seal(1, 0, payload=synthetic_packet(SPEC, 4242))[0]
    assert s.offer(a, relayed=False) and s.offer(b, relayed=True)
    assert MEMBERS[1] not in s.usable(0)
    assert s.equivocations == [(0, MEMBERS[1])]
    # both versions are served, so every peer learns of the equivocation
    assert len(s.envelopes_for(0, set())) == 2
    assert reason(s, seal(1, 0, payload=synthetic_packet(SPEC, 7))[0]) == "equivocation"


def test_multi_chunk_packet_validated_when_complete() -> None:
    s = store(validate=False, max_payload=4 << 20)
    s.begin(0)
    envs = seal(0, 0, payload=os.urandom(1_500_000))
    for e in envs[:-1]:
        s.offer(e, relayed=False)
    assert s.have(0) == []
    s.offer(envs[-1], relayed=False)
    assert s.have(0) == [(MEMBERS[0], hashlib.sha256(envelope.assemble(envs)).digest())]
    assert len(s.envelopes_for(0, set())) == 3 and s.envelopes_for(0, set(s.have(0))) == []


def test_store_takes_members_and_validator_from_each_set_epoch() -> None:
    limits = StoreLimits(1 << 20, window_back=2, window_ahead=1)
    s = AutoCommitStore(CHAIN_ID, CONTRACT, JOB_ID, limits)
    assert reason(s, seal(0, 0)[0]) == "wrong_epoch"  # no epoch yet: everything is dropped
    with pytest.raises(ValueError, match="duplicate members"):
        s.set_epoch(0, [MEMBERS[0], MEMBERS[0].lower()], None)
    assert s.epoch is None and s.members == ()

    def refuse(payload: bytes) -> None:
        raise ValueError("not a packet")

    s.set_epoch(0, [m.lower() for m in MEMBERS[:2]], refuse)
    assert s.members == tuple(sorted(MEMBERS[:2]))
    s.begin(0)
    assert reason(s, seal(2, 0)[0]) == "not_member"
    assert reason(s, seal(1, 0)[0]) == "invalid_payload"
    s.set_epoch(1, MEMBERS, None)  # the next attempt: new members, no payload check
    s.begin(0)
    assert s.offer(seal(2, 0, epoch=1, payload=b"anything")[0], relayed=False)
    assert s.missing(0) == sorted(MEMBERS[:2])


def test_identity_key_file_is_private_and_stable(tmp_path: Path) -> None:
    seed = p2p_identity.load_or_create_seed(tmp_path / "d")
    path = tmp_path / "d" / p2p_identity.KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert p2p_identity.load_or_create_seed(tmp_path / "d") == seed
    kp = p2p_identity.key_pair(seed)
    key = p2p_identity.peer_key_of(kp)
    pid = p2p_identity.peer_id_from_key(key)
    assert pid == ID.from_pubkey(kp.public_key)
    assert pid.to_bytes() == bytes.fromhex("002408011220") + key
    info = p2p_identity.peer_info(key, ["/ip4/127.0.0.1/tcp/4001"])
    assert info.peer_id == pid
    other = p2p_identity.peer_id_from_key(b"\1" * 32).to_base58()
    with pytest.raises(ValueError, match="another peer"):
        p2p_identity.peer_info(key, [f"/ip4/127.0.0.1/tcp/4001/p2p/{other}"])


def test_config_validation_names_the_numbers(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"drop_incoming_fraction 1\.5"):
        GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID, drop_incoming_fraction=1.5)
    with pytest.raises(ValueError, match="chunk_bytes 2000000"):
        GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID, chunk_bytes=2_000_000)
    with pytest.raises(ValueError, match="round_deadline_s"):
        GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID, round_deadline_s=0)


def test_sync_messages_roundtrip_and_reject_junk() -> None:
    have = ((MEMBERS[0], b"\1" * 32), (MEMBERS[2], b"\2" * 32))
    req = p2p_wire.SyncRequest(JOB_ID, 3, 9, have)
    assert p2p_wire.decode_sync_request(req.encode()) == req
    rep = p2p_wire.SyncReply(p2p_wire.SYNC_OK, 2, have, 5)
    assert p2p_wire.decode_sync_reply(rep.encode()) == rep
    for bad in (b"", os.urandom(60), req.encode()[:-1]):
        with pytest.raises(p2p_wire.WireError):
            p2p_wire.decode_sync_request(bad)

"""Nothing unauthenticated is relayed: membership and signature come before any round-state
decision (past, current and future rounds), in the store and in the gossip validator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from eth_account import Account
from harness.commit_store import AutoCommitStore
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID, account

from dtrain_node.p2p import envelope
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.host import GossipConfig
from dtrain_node.p2p.intake import Intake
from dtrain_node.p2p.rounds import StoreLimits
from dtrain_node.p2p.state import HostState

MEMBERS = [account(i).address for i in range(3)]
OUTSIDER = Account.from_key(b"\x17" * 32)


def sealed(
    i: int, rnd: int, payload: bytes = b"packet", signer: object = None
) -> envelope.Envelope:
    args = {"chain_id": CHAIN_ID, "contract": CONTRACT, "job_id": JOB_ID, "epoch": 0}
    env = envelope.seal(account(i), round=rnd, payload=payload + bytes([i, rnd]), **args)[0]
    if signer is None:
        return env
    # names member i, signed by someone else: what an outsider can make
    sig = signer.unsafe_sign_hash(env.signing_digest()).signature  # type: ignore[attr-defined]
    return dataclasses.replace(env, signature=bytes(sig))


def tampered(env: envelope.Envelope) -> envelope.Envelope:
    """Same header (so the same duplicate key), other bytes, the original signature."""
    return dataclasses.replace(env, chunk=b"X" * len(env.chunk))


def intake(tmp_path: Path) -> Intake:
    """An Intake over a store in round 5 (rounds 2-4 finished, 6-7 accepted ahead)."""
    cfg = GossipConfig(tmp_path, CHAIN_ID, CONTRACT, JOB_ID)
    store = AutoCommitStore(CHAIN_ID, CONTRACT, JOB_ID, StoreLimits(1 << 20, 4, 2))
    store.set_epoch(0, MEMBERS, None)
    for r in range(5):
        store.begin(r)
        store.offer(sealed(1, r), relayed=False)
        store.finish(r)
    store.begin(5)
    store.offer(sealed(1, 5), relayed=False)
    key = ident.peer_key_of(ident.key_pair(b"\1" * 32))
    state = HostState(cfg, account(0), key, ident.peer_id_from_key(key), "t", store)
    return Intake(state)


def drops(i: Intake) -> dict[str, int]:
    return dict(i._state.store.dropped)


@pytest.mark.parametrize(
    "rnd,state", [(3, "finished"), (4, "finished"), (5, "open"), (6, "ahead"), (7, "ahead")]
)
def test_forged_envelopes_are_not_forwarded_in_any_round_state(
    tmp_path: Path, rnd: int, state: str
) -> None:
    i = intake(tmp_path)
    assert not i.accept(sealed(2, rnd, signer=OUTSIDER).encode(), relayed=False)
    assert not i.accept(sealed(2, rnd, signer=OUTSIDER).encode(), relayed=True)
    assert drops(i) == {"bad_signature": 2}, state


@pytest.mark.parametrize("rnd", [3, 5])
def test_tampered_copy_of_a_held_chunk_is_not_a_duplicate(tmp_path: Path, rnd: int) -> None:
    i = intake(tmp_path)
    held = sealed(1, rnd)
    assert not i.accept(tampered(held).encode(), relayed=False)
    assert drops(i) == {"bad_signature": 1}
    assert i.accept(held.encode(), relayed=False)  # the real one: authentic, forwarded
    assert drops(i) == {"bad_signature": 1, "finished" if rnd == 3 else "duplicate": 1}


def test_closed_round_forged_dropped_genuine_late_forwarded(tmp_path: Path) -> None:
    i = intake(tmp_path)
    i._state.store.close(5)
    assert not i.accept(sealed(2, 5, signer=OUTSIDER).encode(), relayed=False)
    assert i.accept(sealed(2, 5).encode(), relayed=False)  # late but genuine: forwarded
    assert drops(i) == {"bad_signature": 1, "late": 1}


def test_non_member_dropped_before_any_signature_work(tmp_path: Path) -> None:
    i = intake(tmp_path)
    env = envelope.seal(
        OUTSIDER, chain_id=CHAIN_ID, contract=CONTRACT, job_id=JOB_ID, epoch=0, round=3,
        payload=b"x",
    )[0]  # fmt: skip
    before = dict(i._state.store.signatures)
    assert not i.accept(env.encode(), relayed=False)
    assert drops(i) == {"not_member": 1}
    assert dict(i._state.store.signatures) == before


def test_genuine_past_and_future_envelopes_forwarded_once_verified(tmp_path: Path) -> None:
    i = intake(tmp_path)
    sigs = i._state.store.signatures
    checked = sigs["checked"]
    late, ahead = sealed(2, 4), sealed(2, 6)
    assert i.accept(late.encode(), relayed=False)  # finished round: authentic, forwarded
    assert i.accept(ahead.encode(), relayed=False)  # buffered for a future round
    assert sigs["checked"] == checked + 2
    for _ in range(3):  # duplicates: the cached verdict, no second signature recovery
        assert i.accept(late.encode(), relayed=False)
        assert i.accept(ahead.encode(), relayed=True)
    assert sigs["checked"] == checked + 2 and sigs["cached"] >= 6
    assert drops(i) == {"finished": 4, "duplicate": 3}


def test_fault_hook_forwards_only_authentic_envelopes(tmp_path: Path) -> None:
    i = intake(tmp_path)
    i._state.config = dataclasses.replace(i._state.config, drop_incoming_fraction=0.999999)
    assert not i.accept(sealed(2, 5, signer=OUTSIDER).encode(), relayed=False)
    assert not i.accept(b"junk", relayed=False)
    assert i.accept(sealed(2, 5).encode(), relayed=False)
    assert drops(i) == {"fault_injected": 3}
    assert i._state.store.usable(5).keys() == {MEMBERS[1]}  # the lost one was not stored


def test_store_checks_signature_before_round_state() -> None:
    s = AutoCommitStore(CHAIN_ID, CONTRACT, JOB_ID, StoreLimits(1 << 20, 4, 2))
    s.set_epoch(0, MEMBERS, None)
    s.begin(0)
    s.finish(0)
    s.begin(1)
    for env in (
        sealed(2, 0, signer=OUTSIDER),
        tampered(sealed(1, 1)),
        sealed(0, 2, signer=OUTSIDER),
    ):
        with pytest.raises(EnvelopeError) as e:
            s.offer(env, relayed=True)
        assert e.value.reason == "bad_signature"

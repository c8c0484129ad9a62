"""Stable libp2p identity: an Ed25519 seed in the node's data dir, and peer ids from chain keys.

The contract stores an operator's 32-byte Ed25519 public key (`peerKey`) and multiaddrs without
a /p2p suffix. The libp2p peer id of an Ed25519 key is the identity multihash of its protobuf
encoding, i.e. PEER_ID_PREFIX || peerKey, so a dialer needs nothing else from the chain.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from multiaddr import Multiaddr

# identity multihash (0x00, length 0x24) of protobuf PublicKey{Type: Ed25519 (1), Data: 32 bytes}
PEER_ID_PREFIX = bytes.fromhex("002408011220")
KEY_FILE = "p2p_key"


def load_or_create_seed(data_dir: Path) -> bytes:
    """The node's 32-byte Ed25519 seed, created with mode 0600 on first start."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / KEY_FILE
    if path.exists():
        seed = path.read_bytes()
        if len(seed) != 32:
            raise ValueError(f"{path}: expected a 32-byte seed, found {len(seed)} bytes")
        return seed
    seed = secrets.token_bytes(32)
    # O_EXCL: two processes racing on one data dir must not end up with different identities
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, seed)
    finally:
        os.close(fd)
    return seed


def key_pair(seed: bytes) -> KeyPair:
    if len(seed) != 32:
        raise ValueError(f"seed must be 32 bytes, got {len(seed)}")
    return create_new_key_pair(seed)


def peer_key_of(kp: KeyPair) -> bytes:
    """The 32-byte Ed25519 public key the contract stores as bytes32 peerKey."""
    return kp.public_key.to_bytes()


def peer_id_from_key(peer_key: bytes) -> ID:
    if len(peer_key) != 32:
        raise ValueError(f"peer key must be 32 bytes, got {len(peer_key)}")
    return ID(PEER_ID_PREFIX + peer_key)


def peer_info(peer_key: bytes, addrs: list[str]) -> PeerInfo:
    """PeerInfo for dialing a peer from its on-chain key and multiaddrs (with or without /p2p)."""
    pid = peer_id_from_key(peer_key)
    out = []
    for a in addrs:
        ma = Multiaddr(a)
        if "/p2p/" in a:
            if not a.endswith("/p2p/" + pid.to_base58()):
                raise ValueError(f"address {a} names another peer than key {peer_key.hex()}")
            ma = ma.decapsulate(Multiaddr("/p2p/" + pid.to_base58()))
        out.append(ma)
    if not out:
        raise ValueError(f"no addresses for peer {pid.to_base58()}")
    return PeerInfo(pid, out)

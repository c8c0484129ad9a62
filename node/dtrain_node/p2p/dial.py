"""Dialing members from the peer keys and multiaddrs they registered on chain."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio
from libp2p.peer.peerinfo import PeerInfo

from dtrain_node.p2p import identity as ident
from dtrain_node.p2p.state import HostState

if TYPE_CHECKING:
    from dtrain_node.p2p.config import PeerSpec

log = logging.getLogger(__name__)

ADDR_TTL_S = 24 * 3600


async def connect(state: HostState, peers: list[PeerSpec], timeout: float) -> list[bytes]:
    """Dial every peer but ourselves (see GossipNode.connect); the keys now connected."""
    infos = _remember(state, peers)
    async with trio.open_nursery() as nursery:
        for key, info in infos:
            nursery.start_soon(_dial, state, key, info, timeout)
    net = state.host.get_network()
    ok = [key for key, info in infos if net.get_connections(info.peer_id)]
    await _wait_subscribed(state, ok, timeout)
    return ok


def _remember(state: HostState, peers: list[PeerSpec]) -> list[tuple[bytes, PeerInfo]]:
    infos = []
    for key, addrs in peers:
        if key == state.peer_key:
            continue
        info = ident.peer_info(key, addrs)
        state.peers[info.peer_id] = key
        # remembered so that sync requests can (re)dial the peer on demand later
        state.host.get_peerstore().add_addrs(info.peer_id, info.addrs, ADDR_TTL_S)
        infos.append((key, info))
    return infos


async def _dial(state: HostState, key: bytes, info: PeerInfo, timeout: float) -> None:
    net = state.host.get_network()
    if key < state.peer_key:
        # The larger key dials. When both sides dial at once py-libp2p keeps one
        # connection and resets streams on the other (seen with 8 nodes).
        with trio.move_on_after(timeout / 2):
            while not net.get_connections(info.peer_id):
                await trio.sleep(0.05)
    if net.get_connections(info.peer_id):
        return
    try:
        with trio.fail_after(timeout):
            await state.host.connect(info)
    except Exception as e:
        log.warning("cannot connect to %s: %r", info.peer_id, e)


async def _wait_subscribed(state: HostState, keys: list[bytes], timeout: float) -> None:
    assert state.pubsub is not None
    with trio.move_on_after(timeout):
        want = {ident.peer_id_from_key(k) for k in keys}
        while not want <= set(state.pubsub.peer_topics.get(state.topic, ())):
            await trio.sleep(0.05)

"""What the parts of a gossip host share: its identity, the round store, the counters and, once
the host runs, the libp2p objects.

Everything here is touched on the host's trio thread only, so it needs no locks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from eth_account.signers.local import LocalAccount
from libp2p.peer.id import ID
from libp2p.pubsub.gossipsub import GossipSub

from dtrain_node.p2p.envelope import Envelope
from dtrain_node.p2p.metrics import Metrics
from dtrain_node.p2p.pubsub import SafePubsub
from dtrain_node.p2p.rounds import RoundStore

if TYPE_CHECKING:  # host.py builds this state, so it cannot be imported at run time
    from dtrain_node.p2p.config import GossipConfig


@dataclass
class HostState:
    config: GossipConfig
    account: LocalAccount
    peer_key: bytes
    peer_id: ID
    topic: str
    store: RoundStore
    metrics: Metrics = field(default_factory=Metrics)
    peers: dict[ID, bytes] = field(default_factory=dict)  # peer id -> on-chain peer key
    host: Any = None
    pubsub: SafePubsub | None = None
    gossipsub: GossipSub | None = None
    nursery: trio.Nursery | None = None  # lives as long as the host
    changed: trio.Event = field(default_factory=trio.Event)
    # fault `reveal_to_one_rounds`: round -> our packet's chunks, and the one peer served them
    hidden: dict[int, list[Envelope]] = field(default_factory=dict)
    favored: dict[int, ID] = field(default_factory=dict)

    def notify(self) -> None:
        """Wake every task waiting for a round to make progress."""
        self.changed.set()
        self.changed = trio.Event()

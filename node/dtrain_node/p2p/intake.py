"""Where every incoming envelope enters the round store, from gossip or from a sync reply."""

from __future__ import annotations

import random
from typing import Any

from libp2p.peer.id import ID

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.state import HostState

# valid and authentic, just not stored by this node: gossip still forwards them
_FORWARD_ANYWAY = frozenset({"duplicate", "late", "finished"})


class Intake:
    def __init__(self, state: HostState) -> None:
        self._state = state
        self._rng = random.Random(state.config.fault_seed)

    def accept(self, data: bytes, relayed: bool) -> bool:
        """Store one incoming envelope. True if gossip should forward it.

        Valid envelopes we do not store (already held, round closed or finished, or lost to the
        fault hook) are still forwarded: they are authentic, and peers whose mesh path runs
        through us may need them. Everything that fails a check is dropped and counted.
        """
        st = self._state
        drop = st.config.drop_incoming_fraction
        if drop and self._rng.random() < drop:
            st.store.dropped["fault_injected"] += 1
            return True
        try:
            st.store.offer(envmod.decode(data), relayed=relayed)
        except EnvelopeError as e:
            st.store.dropped[e.reason] += 1
            return e.reason in _FORWARD_ANYWAY
        if relayed:
            st.metrics.recovered += 1
        st.notify()
        return True

    def validate_gossip(self, forwarder: ID, msg: Any) -> bool:
        """Topic validator: runs before py-libp2p forwards a message; False drops it."""
        if forwarder == self._state.peer_id:
            return True  # our own publish (already stored): let it go out
        self._state.metrics.add_in(forwarder.to_base58(), len(msg.data))
        return self.accept(msg.data, relayed=False)

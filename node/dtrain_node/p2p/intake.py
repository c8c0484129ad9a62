"""Where every incoming envelope enters the round store, from gossip or from a sync reply."""

from __future__ import annotations

import random
from typing import Any

from libp2p.peer.id import ID

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.envelope import EnvelopeError
from dtrain_node.p2p.state import HostState

# Authentic (member and signature checked first, whatever the round's state), just not stored
# by this node: gossip still forwards them. Nothing else that fails a check is ever relayed.
_FORWARD_ANYWAY = frozenset({"duplicate", "late", "finished"})


class Intake:
    def __init__(self, state: HostState) -> None:
        self._state = state
        self._rng = random.Random(state.config.fault_seed)

    def accept(self, data: bytes, relayed: bool, relayer: str | None = None) -> bool:
        """Store one incoming envelope. True if gossip should forward it.

        Authentic envelopes we do not store (already held, round closed or finished, or lost to
        the fault hook) are still forwarded: peers whose mesh path runs through us may need
        them. Everything that fails a check, the signature included, is dropped and counted.
        """
        st = self._state
        drop = st.config.drop_incoming_fraction
        if drop and self._rng.random() < drop:
            st.store.dropped["fault_injected"] += 1
            return self._authentic(data)
        try:
            st.store.offer(envmod.decode(data), relayed=relayed, relayer=relayer)
        except EnvelopeError as e:
            st.store.dropped[e.reason] += 1
            return e.reason in _FORWARD_ANYWAY
        if relayed:
            st.metrics.recovered += 1
        st.notify()
        return True

    def _authentic(self, data: bytes) -> bool:
        """Lost to the fault hook: still forwarded, but only if it is authentic."""
        try:
            self._state.store.authenticate(envmod.decode(data))
        except EnvelopeError:
            return False
        return True

    def validate_gossip(self, forwarder: ID, msg: Any) -> bool:
        """Topic validator: runs before py-libp2p forwards a message; False drops it."""
        if forwarder == self._state.peer_id:
            return True  # our own publish (already stored): let it go out
        self._state.metrics.add_in(forwarder.to_base58(), len(msg.data))
        return self.accept(msg.data, relayed=False)

"""A RoundStore for in-process tests of the packet rules: it files the commitment of every packet
chunk it is offered (as if it had arrived in time), so a test can offer chunks directly.

The commitment rules themselves are tested with the real RoundStore (tests/gossip/
test_gossip_commit.py).
"""

from __future__ import annotations

import dataclasses

from dtrain_node.p2p import envelope as envmod
from dtrain_node.p2p.envelope import Envelope
from dtrain_node.p2p.rounds import Phase, RoundStore, _Round


class AutoCommitStore(RoundStore):
    def offer(
        self, env: Envelope, relayed: bool, now: float | None = None, relayer: str | None = None
    ) -> bool:
        if env.kind == envmod.CHUNK and env.sender in self.members:
            st = self.rounds.setdefault(env.round, _Round())
            held = st.commits.setdefault(env.sender, {})
            if st.phase != Phase.FINISHED and len(held) < 2:
                commit = dataclasses.replace(env, kind=envmod.COMMIT, chunk=b"", chunk_index=0)
                held.setdefault(env.payload_sha256, commit)
        return super().offer(env, relayed, now, relayer)

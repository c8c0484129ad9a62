"""Traffic and round counters of one gossip host, and the snapshot `GossipNode.metrics()` returns.

Gossip bytes sent are estimated (py-libp2p does not report them); sync and checkpoint bytes are
counted exactly.
"""

from __future__ import annotations

import resource
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from dtrain_node.p2p.pubsub import SafePubsub
from dtrain_node.p2p.rounds import RoundStore

MAX_ROUND_RECORDS = 1000  # a long job must not grow the host's memory without bound


@dataclass
class Metrics:
    bytes_in: Counter[str] = field(default_factory=Counter)  # per peer id
    bytes_out: Counter[str] = field(default_factory=Counter)
    total_in: int = 0
    total_out: int = 0
    relayed: int = 0  # envelopes we served to peers from sync requests
    recovered: int = 0  # envelopes we got from sync replies
    re_requests: int = 0
    rate_limited: int = 0
    stalled_sync: int = 0  # fault `stall_sync`: sync requests held open and never answered
    settle_timeouts: int = 0
    commit_timeouts: int = 0  # rounds revealed before the peers agreed on the commitments
    waited_for_behind: int = 0  # pulls past the commit deadline for a member not begun yet
    reconcile_timeouts: int = 0  # epochs whose transcript the live peers did not all confirm
    withdrawn: int = 0  # committed, not revealed: every live peer closed without it
    rounds: list[dict[str, Any]] = field(default_factory=list)

    def add_in(self, peer: str, n: int) -> None:
        self.bytes_in[peer] += n
        self.total_in += n

    def add_out(self, peer: str, n: int) -> None:
        self.bytes_out[peer] += n
        self.total_out += n

    def record_round(self, record: dict[str, Any]) -> None:
        self.rounds.append(record)
        del self.rounds[:-MAX_ROUND_RECORDS]

    def snapshot(self, store: RoundStore, pubsub: SafePubsub | None) -> dict[str, Any]:
        lat = sorted(r["latency_s"] for r in self.rounds)
        return {
            "bytes_in_total": self.total_in,
            "bytes_out_total": self.total_out,
            "bytes_in_per_peer": dict(self.bytes_in),
            "bytes_out_per_peer": dict(self.bytes_out),
            "rounds": [dict(r) for r in self.rounds],
            "round_latency_median_s": lat[len(lat) // 2] if lat else None,
            "relayed": self.relayed,
            "recovered": self.recovered,
            "re_requests": self.re_requests,
            "rate_limited": self.rate_limited,
            "stalled_sync": self.stalled_sync,
            "settle_timeouts": self.settle_timeouts,
            "commit_timeouts": self.commit_timeouts,
            "reconcile_timeouts": self.reconcile_timeouts,
            "waited_for_behind": self.waited_for_behind,
            "withdrawn": self.withdrawn,
            "dropped": dict(store.dropped),
            "signatures": dict(store.signatures),
            "pubsub_rpc_errors": dict(pubsub.rpc_errors) if pubsub is not None else {},
            "equivocations": list(store.equivocations),
            "missing_total": sum(len(r["missing"]) for r in self.rounds),
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        }

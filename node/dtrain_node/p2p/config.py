"""What a gossip host is configured with, and how a member's peer is named on chain: the
parts of the host import these, the host itself wires them together."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eth_utils import to_checksum_address
from multiaddr import Multiaddr

from dtrain_node.p2p import envelope as envmod

PeerSpec = tuple[bytes, list[str]]  # (32-byte peer key, multiaddrs) as stored on chain


@dataclass(frozen=True)
class GossipConfig:
    data_dir: Path
    chain_id: int
    contract: str
    job_id: int
    listen: str = "/ip4/127.0.0.1/tcp/0"
    round_deadline_s: float = 10.0  # wait this long for all members' packets
    commit_share: float = 0.75  # the commit phase ends this share of the deadline in, at latest
    settle_s: float = 5.0  # at most this long after the deadline to agree with peers
    re_request_s: float = 0.25  # ask peers for missing packets this often
    relay_rounds: int = 4  # finished rounds kept (and served) for slow peers
    ahead_rounds: int = 2  # future rounds buffered (fast peers publish before we start)
    max_payload_bytes: int = 1 << 20
    chunk_bytes: int = 256 * 1024
    request_timeout_s: float = 3.0
    serve_rate_per_s: float = 40.0  # sync requests served per peer per second (token bucket)
    gossip_degree: int = 6
    gossip_rate_per_s: float = 200.0  # py-libp2p per-forwarder spam gate (its default: 10/s)
    heartbeat_s: int = 1
    max_file_bytes: int = 64 << 30
    file_timeout_s: float = 600.0
    drop_incoming_fraction: float = 0.0  # fault hook for tests: drop incoming packet chunks
    # fault hook for tests: in these rounds, right after revealing, sign and publish a second
    # commitment to another packet (equivocate)
    equivocate_rounds: tuple[int, ...] = ()
    withhold_rounds: tuple[int, ...] = ()  # fault: commit in these rounds, never reveal
    # fault: in these rounds reveal late and to one peer only: by sync, once our deadline
    # passed, to the first peer that asks
    reveal_to_one_rounds: tuple[int, ...] = ()
    stall_files: bool = False  # fault: answer every file request "found", then send nothing
    drip_states: bool = False  # fault: serve private-state files one byte per `files.DRIP_S`
    stall_sync: bool = False  # fault: read every sync request, hold it open, answer nothing
    fault_seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        object.__setattr__(self, "contract", to_checksum_address(self.contract))
        if self.chain_id < 1 or self.job_id < 0:
            raise ValueError(f"chain_id {self.chain_id} must be >= 1, job_id {self.job_id} >= 0")
        Multiaddr(self.listen)  # raises on a malformed address
        for name in ("round_deadline_s", "re_request_s", "request_timeout_s", "file_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.settle_s < 0 or self.relay_rounds < 1 or self.ahead_rounds < 1:
            raise ValueError(
                f"settle_s {self.settle_s} >= 0, relay_rounds {self.relay_rounds} >= 1, "
                f"ahead_rounds {self.ahead_rounds} >= 1 required"
            )
        if not 1 <= self.chunk_bytes <= envmod.MAX_CHUNK:
            raise ValueError(f"chunk_bytes {self.chunk_bytes} not in [1, {envmod.MAX_CHUNK}]")
        if self.max_payload_bytes < 1 or self.max_file_bytes < 1:
            raise ValueError(
                f"max_payload_bytes {self.max_payload_bytes}, max_file_bytes "
                f"{self.max_file_bytes} must be >= 1"
            )
        if not 0.0 < self.commit_share < 1.0:
            raise ValueError(f"commit_share {self.commit_share} not in (0, 1)")
        if not 0.0 <= self.drop_incoming_fraction < 1.0:
            raise ValueError(f"drop_incoming_fraction {self.drop_incoming_fraction} not in [0, 1)")
        if self.serve_rate_per_s <= 0 or self.gossip_rate_per_s <= 0 or self.gossip_degree < 1:
            raise ValueError("serve_rate_per_s, gossip_rate_per_s > 0 and gossip_degree >= 1")

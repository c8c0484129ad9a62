"""What the operator needs from the network: the `Transport` protocol.

The operator pushes everything the transport needs down to it (`set_epoch` with the epoch's
members, read at the job snapshot's block, and the packet validator); the transport never calls
back into the operator or the chain. `dtrain_node.p2p.host.GossipNode` is the libp2p
implementation (`gossip_transport` starts one); tests inject an in-process one through the
node's `transport_factory`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from dtrain_node.operator.faults import AHEAD_WAIT_S
from dtrain_node.p2p.host import GossipConfig, GossipNode, PeerSpec, RoundResult, Transcript

if TYPE_CHECKING:
    from dtrain.client import BSM
    from dtrain_node.operator.config import NodeConfig

__all__ = [
    "PayloadValidator",
    "PeerSpec",
    "RoundResult",
    "Transcript",
    "Transport",
    "TransportFactory",
    "gossip_transport",
    "peer_specs",
]

PayloadValidator = Callable[[bytes], None]  # raises on a payload that must not be relayed


class Transport(Protocol):
    peer_key: bytes  # 32-byte libp2p public key registered on-chain
    listen_addrs: list[str]  # multiaddrs without /p2p, registered on-chain

    @property
    def settle_s(self) -> float:
        """Longest time a round may take after its deadline to agree with peers."""
        ...

    def set_epoch(
        self, epoch: int, members: Sequence[str], validate: PayloadValidator | None
    ) -> None:
        """Start accepting packets of this epoch attempt from these members only."""
        ...

    def connect(self, peers: list[PeerSpec]) -> list[bytes]: ...

    def collect_round(
        self,
        rnd: int,
        payload: bytes,
        deadline_s: float,
        patience_s: float | None = None,
        state: bytes = b"",
    ) -> RoundResult:
        """Publish our packet of round `rnd` and collect the members' packets; a live member
        that has not begun the round is waited for up to `patience_s`. `state`: the digest of
        our private state at the round's start, signed into our commitment (b"": none)."""
        ...

    def reconcile(self, rounds: int, deadline_s: float) -> Transcript:
        """After the last round: agree with the members on every round's packets."""
        ...

    def serve_file(self, sha256_hex: str, path: Path | str) -> None: ...

    def fetch_file(
        self,
        sha256_hex: str,
        peers: list[PeerSpec],
        dest: Path | str,
        timeout_s: float | None = None,
        max_bytes: int | None = None,
    ) -> Path: ...

    def stop(self) -> None: ...


def peer_specs(bsm: BSM, operators: Sequence[str]) -> list[PeerSpec]:
    """The operators' (peer key, multiaddrs) as registered on chain."""
    out = []
    for address in operators:
        op = bsm.operator(address)
        out.append((op.peer_key, list(op.multiaddrs)))
    return out


TransportFactory = Callable[["NodeConfig", "BSM", int], Transport]  # (config, client, job id)


def gossip_transport(cfg: NodeConfig, bsm: BSM, job_id: int) -> Transport:
    """The libp2p gossip host of this operator for `job_id`, started."""
    gcfg = GossipConfig(
        data_dir=cfg.data_dir,
        chain_id=bsm.chain_id,
        contract=bsm.address,
        job_id=job_id,
        listen=cfg.listen,
        round_deadline_s=cfg.round_deadline_s,
        equivocate_rounds=cfg.faults.equivocate_rounds,
        withhold_rounds=cfg.faults.withhold_rounds,
        reveal_to_one_rounds=cfg.faults.late_rounds,
        stall_files=cfg.faults.stall,
        drip_states=cfg.faults.drip,
    )
    if cfg.faults.ahead:  # closes each round at once, agreed or not
        gcfg = dataclasses.replace(gcfg, settle_s=AHEAD_WAIT_S)
    return GossipNode(gcfg, bsm.account).start()

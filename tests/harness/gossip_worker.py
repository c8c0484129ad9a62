"""One gossip node as an OS process, for multi-process tests and the gossip benchmark.

    python -m harness.gossip_worker CONFIG.json

Line protocol (JSON, one object per line): the worker prints {"event": "ready", "peer_key",
"addrs"} on stdout, reads {"peers": [[peer_key_hex, [addr, ...]], ...]} on stdin, connects,
runs the configured rounds printing {"event": "round", "round": r} after each, writes its
results to config["result"], prints {"event": "done"} and waits for "exit" on stdin (so peers
still settling the last round can fetch packets from it). Packets are real DeMo codec packets
of a synthetic model with config["params"] parameters, validated with the codec decoder.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from eth_account import Account

from dtrain_node.p2p.host import GossipConfig, GossipNode

if TYPE_CHECKING:  # torch (via the codec) costs seconds to import: only codec mode loads it
    from dtrain_node.optim import codec
    from dtrain_node.optim.compress import CompressConfig


def synthetic_spec(params: int, cfg: CompressConfig | None = None) -> codec.Spec:
    """A model shape with about `params` parameters: 1024-wide matrices plus one bias vector."""
    from dtrain_node.optim import codec
    from dtrain_node.optim.compress import CompressConfig

    if params < 2048:
        raise ValueError(f"params must be >= 2048, got {params}")
    rows = (params - 1024) // 1024
    shapes: list[tuple[int, ...]] = [(1024, 1024)] * (rows // 1024)
    if rows % 1024:
        shapes.append((rows % 1024, 1024))
    shapes.append((1024,))
    names = tuple(f"w{i}" for i in range(len(shapes)))
    return codec.Spec(names, tuple(shapes), cfg or CompressConfig())


def synthetic_packet(spec: codec.Spec, seed: int) -> bytes:
    """A valid packet with random indices and levels (what a real sync would send)."""
    import torch

    from dtrain_node.optim import codec
    from dtrain_node.optim.compress import LEVELS, Sparse

    rng = np.random.default_rng(seed)
    levels = np.array(LEVELS[spec.cfg.bits], dtype=np.int8)
    tensors = []
    for n, ce, k, _, _ in spec.layout:
        stride = ce // k  # one index per stride keeps them distinct and increasing
        idx = np.arange(k) * stride + rng.integers(0, stride, (n, k))
        lvl = levels[rng.integers(0, len(levels), (n, k))]
        exp = int(rng.integers(-20, 0))
        tensors.append(Sparse(torch.from_numpy(idx), torch.from_numpy(lvl), exp))
    return codec.encode(spec, tensors)


def _reconcile(node: GossipNode, rounds: int, deadline_s: float) -> dict[str, Any]:
    """The epoch's agreed transcript, as the worker's result records it."""
    from dtrain_node.p2p.reconcile import check_equivocation

    t = node.reconcile(rounds, deadline_s)
    for proof in t.equivocations:
        check_equivocation(proof)  # every proof we hand on must convince anyone
    return {
        "rounds": [
            {
                "senders": [s for s, _ in packets],
                "digests": [hashlib.sha256(p).hexdigest() for _, p in packets],
            }
            for packets in t.rounds
        ],
        "settled": t.settled,
        "equivocators": sorted({(e.round, e.sender) for e in t.equivocations}),
        "waited_s": t.waited_s,
    }


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _load_hook(module: str | None) -> Any:
    return importlib.import_module(module) if module else None


def main(argv: list[str]) -> int:
    conf = json.loads(Path(argv[1]).read_text())
    account = Account.from_key(conf["key"])
    members = list(conf["members"])
    rounds = int(conf["rounds"])
    # packets are built before the rounds so that the timing measures the network only
    seed = int(conf["index"]) * 1_000_003
    distinct = min(rounds, int(conf.get("distinct_packets") or rounds))  # benchmarks reuse a few
    validate: Any = None
    spec: Any = None
    if conf.get("payload_bytes"):
        # plain random payloads of a given size: no codec, no torch import (faster start)
        rng = np.random.default_rng(seed)
        size = int(conf["payload_bytes"])
        payloads = [rng.bytes(size) for _ in range(distinct)]
        packet_bytes, params = size, 0
    else:
        from dtrain_node.optim import codec

        spec = synthetic_spec(int(conf["params"]))
        max_bytes = int(conf.get("gossip", {}).get("max_payload_bytes", 1 << 20))

        def validate(payload: bytes) -> None:
            codec.decode(spec, payload, max_bytes=max_bytes)

        payloads = [synthetic_packet(spec, seed + r) for r in range(distinct)]
        packet_bytes, params = spec.packet_bytes, spec.numel

    gcfg = GossipConfig(
        data_dir=Path(conf["data_dir"]),
        chain_id=int(conf["chain_id"]),
        contract=conf["contract"],
        job_id=int(conf["job_id"]),
        **conf.get("gossip", {}),
    )
    hook = _load_hook(conf.get("hook"))
    with GossipNode(gcfg, account) as node:
        emit({"event": "ready", "peer_key": node.peer_key.hex(), "addrs": node.listen_addrs})
        node.set_epoch(int(conf.get("epoch", 0)), members, validate)  # before peers send round 0
        peers = json.loads(sys.stdin.readline())["peers"]
        connected = node.connect([(bytes.fromhex(k), a) for k, a in peers])
        emit({"event": "connected", "n": len(connected)})
        ctx: dict[str, Any] = {"conf": conf, "spec": spec, "members": members}
        ctx["keys"] = {k: members[i] for i, (k, _) in enumerate(peers)}  # peer key -> member
        out = []
        for r in range(rounds):
            if hook is not None:
                hook.before_round(node, r, ctx)
            payload = payloads[r % len(payloads)]
            if hook is not None and hasattr(hook, "collect_round"):
                res = hook.collect_round(node, r, payload, ctx)  # an attacker's own round
            else:
                res = node.collect_round(r, payload)
            out.append(
                {
                    "round": r,
                    "senders": [s for s, _ in res.packets],
                    "digests": [hashlib.sha256(p).hexdigest() for _, p in res.packets],
                    "missing": res.missing,
                    "latency_s": res.latency_s,
                    "settled": res.settled,
                    "re_requests": res.re_requests,
                    "bytes_in": res.bytes_in,
                    "bytes_out": res.bytes_out,
                    "t_end": time.time(),
                }
            )
            emit({"event": "round", "round": r})
        canonical = None
        if conf.get("reconcile"):
            canonical = _reconcile(node, rounds, float(conf["reconcile"]))
            emit({"event": "reconciled"})
        result = {
            "canonical": canonical,
            "address": account.address,
            "packet_bytes": packet_bytes,
            "params": params,
            "rounds": out,
            "participation": node.participation(),
            "metrics": node.metrics(),
        }
        Path(conf["result"]).write_text(json.dumps(result))
        emit({"event": "done"})
        # stay reachable until told to go: peers may still be settling the last round
        sys.stdin.readline()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""A non-member libp2p peer on a job's topic, as an OS process: an injector or an observer.

    python -m harness.gossip_peer CONFIG.json

CONFIG: {"role": "inject" | "observe", "data_dir", "key" (the peer's own Ethereum key, not a
member's), "members", "result"}. Line protocol as harness.gossip_worker: prints {"event":
"ready", "peer_key", "addrs"}, reads {"peers": [...]}, dials them, prints {"event":
"connected"}, then runs until "exit" arrives on stdin, writes its counters to config["result"]
and exits.

- inject: watches the topic and, on the first envelope of each new round `cur`, publishes
  forgeries naming a member (signed with its own key, or a genuine envelope with its bytes
  changed) for rounds cur-2, cur-1 (finished at honest nodes), cur and cur+1, cur+2 (future),
  and replays a genuine envelope of rounds cur-2 and cur-1 byte for byte (authentic, late).
  A forged chunk starts with b"FORGED:" and its kind (a forged commitment has no chunk:
  "other").
- observe: counts what it receives and from which forwarder: envelopes that fail
  authentication (by forgery kind), authentic ones, and authentic envelopes that arrived as
  two or more distinct gossip messages (the injector's replays, relayed by someone).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from eth_account import Account

from dtrain_node.p2p import envelope
from dtrain_node.p2p.envelope import Envelope, EnvelopeError
from dtrain_node.p2p.host import GossipConfig, GossipNode
from harness.gossip_cluster import CHAIN_ID, CONTRACT, JOB_ID
from harness.gossip_worker import emit

TAG = b"FORGED:"


def forged(env: Envelope, kind: str, rnd: int, signer: Any) -> list[Envelope]:
    """Two forgeries of round rnd naming env.sender: re-signed by signer, and env's signature
    over changed bytes (for a held chunk, this keys like a duplicate)."""
    tag = TAG + kind.encode()
    body = env.chunk if env.chunk else b""
    changed = (tag + body[len(tag) :])[: len(body)] if body else body
    copy = dataclasses.replace(env, round=rnd, chunk=changed)
    if not body:
        copy = dataclasses.replace(copy, payload_sha256=bytes(32))
    fresh = dataclasses.replace(
        env, round=rnd, chunk=tag + b"\0" * 64, payload_len=len(tag) + 64, kind=envelope.CHUNK
    )
    sig = signer.unsafe_sign_hash(fresh.signing_digest()).signature
    return [copy, dataclasses.replace(fresh, signature=bytes(sig))]


def kind_of(env: Envelope) -> str:
    if env.chunk.startswith(TAG):
        return env.chunk[len(TAG) :].split(b"\0")[0].decode(errors="replace")
    return "other"


class Injector:
    def __init__(self, node: GossipNode, account: Any) -> None:
        self.node, self.account = node, account
        self.seen: dict[int, bytes] = {}  # round -> one genuine envelope of it, encoded
        self.sent: Counter[str] = Counter()
        self.cur = -1

    def validate(self, forwarder: Any, msg: Any) -> bool:
        if forwarder == self.node.peer_id:
            return True  # our own publish: let it go out
        try:
            env = envelope.decode(msg.data)
        except EnvelopeError:
            return False
        if env.signature and env.round not in self.seen and not env.chunk.startswith(TAG):
            self.seen[env.round] = bytes(msg.data)
        if env.round > self.cur:
            self.cur = env.round
            nursery = self.node._state.nursery
            assert nursery is not None
            nursery.start_soon(self.attack, env)
        return False  # never forward anything

    async def attack(self, env: Envelope) -> None:
        cur, out = env.round, []
        for kind, rnd in (("past", cur - 2), ("past", cur - 1), ("current", cur)):
            if rnd >= 0:
                out += [(kind, e) for e in forged(env, kind, rnd, self.account)]
        for rnd in (cur + 1, cur + 2):
            out += [("future", e) for e in forged(env, "future", rnd, self.account)]
        msgs = [(k, e.encode()) for k, e in out]
        msgs += [("replay", self.seen[r]) for r in (cur - 2, cur - 1) if r in self.seen]
        ps = self.node._state.pubsub
        assert ps is not None
        for kind, data in msgs:
            await ps.publish(self.node.topic, data)
            self.sent[kind] += 1

    def result(self) -> dict[str, Any]:
        return {"sent": dict(self.sent), "rounds_seen": sorted(self.seen)}


class Observer:
    def __init__(self, members: list[str]) -> None:
        self.members = set(members)
        self.forged: Counter[str] = Counter()
        self.authentic = 0
        self.forwarders: Counter[str] = Counter()
        self.msg_ids: defaultdict[bytes, set[bytes]] = defaultdict(set)

    def validate(self, forwarder: Any, msg: Any) -> bool:
        self.forwarders[forwarder.to_base58()] += 1
        try:
            env = envelope.decode(msg.data)
            ok = env.sender in self.members and env.recover_signer() == env.sender
        except EnvelopeError:
            env, ok = None, False
        if not ok:
            self.forged[kind_of(env) if env is not None else "undecodable"] += 1
            return False
        self.authentic += 1
        self.msg_ids[bytes(msg.data)].add(bytes(msg.from_id) + bytes(msg.seqno))
        return False  # an observer forwards nothing

    def result(self) -> dict[str, Any]:
        return {
            "forged": dict(self.forged),
            "authentic": self.authentic,
            "replays_received": sum(len(ids) > 1 for ids in self.msg_ids.values()),
            "forwarders": dict(self.forwarders),
        }


def main(argv: list[str]) -> int:
    conf = json.loads(Path(argv[1]).read_text())
    account = Account.from_key(conf["key"])
    cfg = GossipConfig(Path(conf["data_dir"]), CHAIN_ID, CONTRACT, JOB_ID)
    with GossipNode(cfg, account) as node:
        role: Any = (
            Injector(node, account) if conf["role"] == "inject" else Observer(conf["members"])
        )
        ps = node._state.pubsub
        assert ps is not None
        node._call_sync(ps.set_topic_validator, node.topic, role.validate, False)
        emit({"event": "ready", "peer_key": node.peer_key.hex(), "addrs": node.listen_addrs})
        peers = json.loads(sys.stdin.readline())["peers"]
        node.connect([(bytes.fromhex(k), a) for k, a in peers], timeout=6.0)
        emit({"event": "connected", "peer_id": node.peer_id.to_base58()})
        sys.stdin.readline()
        result = node._call_sync(role.result)
        Path(conf["result"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

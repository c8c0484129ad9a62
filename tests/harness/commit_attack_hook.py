"""Worker hook (loaded by harness.gossip_worker) for a member that attacks the two-phase rounds.

In round NO_COMMIT it publishes its packet without a commitment; in round MISMATCH it commits to
one packet and publishes another; in round LATE it withholds its commitment, waits until it
holds another member's packet, then commits to a copy of it and publishes that packet, by gossip
and from its own store (so that its sync server offers both to every peer that asks). It runs
honest rounds otherwise.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from dtrain_node.p2p import envelope
from dtrain_node.p2p.rounds import _Round

NO_COMMIT, MISMATCH, LATE = 3, 5, 7


def before_round(node: Any, r: int, ctx: dict[str, Any]) -> None:
    pass


def collect_round(node: Any, r: int, payload: bytes, ctx: dict[str, Any]) -> Any:
    if r == NO_COMMIT:
        _publish(node, _seal(node, r, payload)[1])
    elif r == MISMATCH:
        _publish(node, [_seal(node, r, payload)[0], *_seal(node, r, payload[::-1])[1]])
    elif r == LATE:
        t = threading.Thread(target=_late_copy, args=(node, r, ctx), daemon=True)
        t.start()
        res = node.collect_round(r, b"")
        t.join(30)
        return res
    else:
        return node.collect_round(r, payload)
    return node.collect_round(r, b"")  # collect only: the attack was our packet


def _seal(node: Any, r: int, payload: bytes) -> tuple[Any, list[Any]]:
    cfg = node.config
    args = {"chain_id": cfg.chain_id, "contract": cfg.contract, "job_id": cfg.job_id}
    args.update(epoch=node.store.epoch, round=r, payload=payload)
    chunks = envelope.seal(node.account, **args)
    return envelope.commitment(node.account, chunks), chunks


def _publish(node: Any, envs: list[Any]) -> None:
    for e in envs:
        node._call(node._state.pubsub.publish, node.topic, e.encode())


def _late_copy(node: Any, r: int, ctx: dict[str, Any]) -> None:
    me = node.account.address
    end = time.monotonic() + 25
    while time.monotonic() < end:
        got = node._call_sync(lambda: {s: p for s, p in node.store.usable(r).items() if s != me})
        if got:
            break
        time.sleep(0.01)
    else:
        return
    commit, chunks = _seal(node, r, next(iter(got.values())))

    def hold() -> None:  # as if it had committed in time: served to whoever asks
        st = node.store.rounds.setdefault(r, _Round())
        st.commits[me] = {commit.payload_sha256: commit}
        for e in chunks:
            node.store.offer(e, relayed=True)

    node._call_sync(hold)
    _publish(node, [commit, *chunks])
    ctx.setdefault("late_copy", []).append(r)

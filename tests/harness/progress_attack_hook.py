"""Worker hook (loaded by harness.gossip_worker): before round ATTACK_ROUND the member publishes
its genuine progress note and, on the job's progress topic, a note forged in another member's
name, a tampered copy of its own, an outsider's note, a note about another job and random bytes
(docs/protocol.md 4.8)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import trio
from eth_account import Account

from dtrain_node.p2p import notes

ATTACK_ROUND = 3
OUTSIDER = Account.from_key("0x" + "ab" * 32)


def before_round(node: Any, r: int, ctx: dict[str, Any]) -> None:
    if r != ATTACK_ROUND:
        return
    topic = node.notes.topic
    assert node._call(_wait_mesh, node, topic, len(ctx["members"]) - 1, 15.0), "no mesh"
    cfg = node.config
    about = {"chain_id": cfg.chain_id, "contract": cfg.contract, "job": cfg.job_id}
    body = {**about, "epoch": 0, "attempt": 0, "round": r, "loss": 1.5, "tokens": 64}
    node.publish_progress(body)  # genuine: relayed by every member
    other = next(m for m in ctx["members"] if m != node.account.address)
    genuine = notes.sign(node.account, notes.PROGRESS, body)
    forged = notes.sign(OUTSIDER, notes.PROGRESS, {**genuine.body}).signature
    bad = [
        dataclasses.replace(genuine, body={**genuine.body, "sender": other}).encode(),
        dataclasses.replace(genuine, body={**genuine.body, "loss": 0.1}).encode(),
        dataclasses.replace(genuine, signature=forged).encode(),
        notes.sign(OUTSIDER, notes.PROGRESS, body).encode(),
        notes.sign(node.account, notes.PROGRESS, {**body, "job": cfg.job_id + 1}).encode(),
        os.urandom(300),
    ]
    for data in bad:
        node._call(node._state.pubsub.publish, topic, data)


async def _wait_mesh(node: Any, topic: str, n: int, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while len(node._state.gossipsub.mesh.get(topic, ())) < n:
            await trio.sleep(0.05)
        return True
    return False

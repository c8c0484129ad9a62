"""Worker hook (loaded by harness.gossip_worker) that turns a member into an attacker.

The attacker runs honest rounds, and before ATTACK_ROUND it publishes on the job topic: a
non-member's packet, a replay of its own round-0 packet, a forged signature, a packet for
another job, a 10 MiB payload (in 512 KiB chunks) and random bytes, and it sends a 10 MiB
frame and a garbage frame to every peer's sync protocol and a corrupt RPC to every peer's
pubsub protocol. Before its last round it publishes a committed, signed packet that fails codec
validation.
"""

from __future__ import annotations

import dataclasses
import os
import struct
from typing import Any

import trio
from eth_account import Account
from eth_utils import keccak
from libp2p.custom_types import TProtocol
from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11
from libp2p.utils import encode_uvarint

from dtrain_node.p2p import envelope
from dtrain_node.p2p import wire as p2p_wire
from harness.gossip_worker import synthetic_packet

ATTACK_ROUND = 8


def before_round(node: Any, r: int, ctx: dict[str, Any]) -> None:
    if r == 1:
        me = node.account.address
        ctx["old"] = [e.encode() for e in node.store.envelopes_for(0, set()) if e.sender == me]
    if r == int(ctx["conf"]["rounds"]) - 1:
        _invalid_packet(node, r, ctx)
    if r != ATTACK_ROUND:
        return
    assert node._call(_wait_mesh, node, len(ctx["members"]) - 1, 15.0), "mesh never formed"
    conf = ctx["conf"]
    common = {"chain_id": conf["chain_id"], "contract": conf["contract"], "epoch": 0}
    good = synthetic_packet(ctx["spec"], 999)
    outsider = Account.from_key(keccak(b"not a member"))
    msgs: list[bytes] = []
    msgs += [
        e.encode()
        for e in envelope.seal(outsider, job_id=conf["job_id"], round=r, payload=good, **common)
    ]
    msgs += ctx["old"]
    honest = envelope.seal(node.account, job_id=conf["job_id"], round=r, payload=good, **common)[0]
    victim = next(m for m in ctx["members"] if m != node.account.address)
    msgs.append(dataclasses.replace(honest, sender=victim).encode())
    msgs += [
        e.encode()
        for e in envelope.seal(
            node.account, job_id=conf["job_id"] + 1, round=r, payload=good, **common
        )
    ]
    huge = os.urandom(10 << 20)
    msgs += [
        e.encode()
        for e in envelope.seal(node.account, job_id=conf["job_id"], round=r, payload=huge, **common)
    ]
    msgs.append(os.urandom(2000))
    for m in msgs:
        node._call(node._state.pubsub.publish, node.topic, m)
    node._call(_stream_attacks, node)


def _invalid_packet(node: Any, r: int, ctx: dict[str, Any]) -> None:
    """A committed, signed packet that fails codec validation, for round r + 1: a round this
    member never runs (its commitment there would otherwise equivocate with its real one)."""
    conf = ctx["conf"]
    args = {"chain_id": conf["chain_id"], "contract": conf["contract"], "epoch": 0}
    args.update(job_id=conf["job_id"], round=r + 1)
    # Right header, body cut short: always fails decode (a random body of the right length can
    # decode as a valid packet: every 12-bit index and every 1-bit value is legal).
    junk = synthetic_packet(ctx["spec"], 999)[:-7]
    chunks = envelope.seal(node.account, payload=junk, **args)
    envs = [envelope.commitment(node.account, chunks), *chunks]
    for e in envs:
        node._call(node._state.pubsub.publish, node.topic, e.encode())


async def _wait_mesh(node: Any, n: int, timeout: float) -> bool:
    with trio.move_on_after(timeout):
        while len(node._state.gossipsub.mesh.get(node.topic, ())) < n:
            await trio.sleep(0.05)
        return True
    return False


async def _stream_attacks(node: Any) -> None:
    proto = TProtocol(p2p_wire.SYNC_PROTOCOL)
    for pid in list(node._state.peers):
        try:  # a corrupt pubsub RPC: stock py-libp2p 0.8.1 lets this crash the whole host
            s = await node._state.host.new_stream(pid, [PROTOCOL_ID_V11])
            await s.write(encode_uvarint(200) + b"\xff" * 200)
            await s.close()
        except Exception:
            pass
        for frame in (
            struct.pack(">I", 10 << 20) + os.urandom(4096),
            struct.pack(">I", 300) + os.urandom(300),
        ):
            try:
                s = await node._state.host.new_stream(pid, [proto])
                await s.write(frame)
                await s.close()
            except Exception:
                pass

"""Worker hook (loaded by harness.gossip_worker) for a member that tries to split the honest
nodes' view of a round.

Its attack is chosen by config["attack"]:
- "equivocate": in round ATTACK_ROUND it commits to one packet by gossip; once it holds another
  member's packet of that round (the honest nodes revealed), it signs a second commitment to
  another packet and publishes it with both packets, and serves both from its store.
- "late_to_some": in round ATTACK_ROUND it commits by gossip but never reveals by gossip; its
  sync server hands its packet to the first other member only.
- "withhold": in round ATTACK_ROUND it commits and never reveals, to anyone.
Every other round is honest.
"""

from __future__ import annotations

import contextvars
import threading
import time
from typing import Any

from dtrain_node.p2p import envelope
from dtrain_node.p2p.rounds import _Round
from harness.commit_attack_hook import _seal

ATTACK_ROUND = 2

_asker: contextvars.ContextVar[Any] = contextvars.ContextVar("asker", default=None)


def before_round(node: Any, r: int, ctx: dict[str, Any]) -> None:
    if r == 0 and ctx["conf"].get("attack") == "late_to_some":
        _serve_selectively(node, ctx)


def collect_round(node: Any, r: int, payload: bytes, ctx: dict[str, Any]) -> Any:
    attack = ctx["conf"].get("attack")
    if r != ATTACK_ROUND:
        return node.collect_round(r, payload)
    commit, chunks = _seal(node, r, payload)
    if attack == "equivocate":
        # the first packet's chunks go out only with the second commitment: no honest node can
        # close the round (it awaits the first packet) before the second commitment reaches it
        _publish(node, [commit])
        t = threading.Thread(
            target=_second_commitment, args=(node, r, payload, chunks), daemon=True
        )
        t.start()
        res = node.collect_round(r, b"")
        t.join(30)
        return res
    if attack == "late_to_some":
        ctx["hidden"] = {(r, commit.payload_sha256): chunks}
    _publish(node, [commit])
    return node.collect_round(r, b"")


def _publish(node: Any, envs: list[Any]) -> None:
    def hold() -> None:  # as if taken in time: served to whoever asks
        for e in envs:
            if e.kind == envelope.COMMIT:
                st = node.store.rounds.setdefault(e.round, _Round())
                st.commits.setdefault(e.sender, {})[e.payload_sha256] = e
            else:
                node.store.offer(e, relayed=True)

    node._call_sync(hold)
    for e in envs:
        node._call(node._state.pubsub.publish, node.topic, e.encode())


def _second_commitment(node: Any, r: int, payload: bytes, first: list[Any]) -> None:
    me = node.account.address
    end = time.monotonic() + 25
    while time.monotonic() < end:
        if node._call_sync(lambda: any(s != me for s in node.store.usable(r))):
            break
        time.sleep(0.01)
    commit, chunks = _seal(node, r, payload[::-1])
    _publish(node, [commit, *chunks, *first])


def _serve_selectively(node: Any, ctx: dict[str, Any]) -> None:
    """The sync server answers the first other member with the hidden packet, everyone else
    without it."""
    store, server = node.store, node._sync_server
    me = node.account.address
    favored = next(m for m in ctx["members"] if m != me)
    orig_answer, orig_envs, orig_have = server._answer, store.envelopes_for, store.have

    async def answer(stream: Any, pid: Any) -> None:
        _asker.set(node._state.peers.get(pid))
        await orig_answer(stream, pid)

    def favored_asks() -> bool:
        key = _asker.get()
        return key is not None and ctx["keys"].get(key.hex()) == favored

    def envelopes_for(rnd: int, exclude: set) -> list:
        out = orig_envs(rnd, exclude)
        if favored_asks():
            for (hr, d), chunks in ctx.get("hidden", {}).items():
                if hr == rnd and (me, d) not in exclude:
                    out += chunks
        return out

    def have(rnd: int) -> list:
        out = orig_have(rnd)
        if favored_asks():
            out = sorted(out + [(me, d) for (hr, d) in ctx.get("hidden", {}) if hr == rnd])
        return out

    server._answer, store.envelopes_for, store.have = answer, envelopes_for, have

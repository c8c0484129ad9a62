"""py-libp2p 0.8.1 Pubsub with two robustness fixes the gossip layer depends on.

1. Interleaved writes. Pubsub.write_msg does one stream.write per RPC, but yamux splits a write
   into frames and takes its lock per frame, so two tasks writing to the same peer (our publish
   and a forward, say) interleave their bytes once messages exceed the send window. The peer
   then reads a corrupt RPC. Seen with 160 KiB packets and 4 nodes. Fix: one lock per stream
   held for the whole RPC.
2. A corrupt RPC kills the host. continuously_read_stream does not catch protobuf's
   DecodeError, which then tears down the swarm: any peer could crash us with junk bytes.
   Fix: catch it and reset that stream (forgetting the peer if it was its pubsub stream);
   the host stays up.
"""

from __future__ import annotations

import logging
import weakref
from collections import Counter
from typing import Any

import trio
from libp2p.pubsub.pubsub import Pubsub

log = logging.getLogger(__name__)


class SafePubsub(Pubsub):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._write_locks: weakref.WeakKeyDictionary[Any, trio.Lock] = weakref.WeakKeyDictionary()
        self.rpc_errors: Counter[str] = Counter()

    async def write_msg(self, stream: Any, rpc_msg: Any) -> bool:
        lock = self._write_locks.get(stream)
        if lock is None:
            lock = self._write_locks[stream] = trio.Lock()
        async with lock:
            return await super().write_msg(stream, rpc_msg)

    async def continuously_read_stream(self, stream: Any) -> None:
        try:
            await super().continuously_read_stream(stream)
        except Exception as e:  # DecodeError and whatever else a hostile peer can provoke
            peer_id = stream.muxed_conn.peer_id
            self.rpc_errors[type(e).__name__] += 1
            log.warning("dropping peer %s after a bad pubsub RPC: %r", peer_id, e)
            try:
                await stream.reset()
            except Exception:
                log.debug("reset after a bad RPC failed", exc_info=True)
            if self.peers.get(peer_id) is stream:  # its main pubsub stream: forget the peer
                self._handle_dead_peer(peer_id)

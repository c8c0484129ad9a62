"""A caller's receipt for a job's final checkpoint: the signed word that it fetched and verified
it, which lets the members that keep serving it for the caller stop (docs/protocol.md 5.2).

A receipt is a note (notes.py) of kind `receipt` whose body names the chain, contract, job and
the checkpoint's hash, signed by the job's caller. The caller sends it over the receipt stream
protocol to each member that served the checkpoint; a member waiting for it (`expect`) answers
1 when the receipt is the one it waits for (this job, its final checkpoint, signed by the
on-chain caller), else 0, and keeps nothing else: a stranger's receipt costs one answer.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from eth_account.signers.local import LocalAccount
from eth_utils import to_checksum_address
from libp2p.custom_types import TProtocol

from dtrain_node.errors import NoteError
from dtrain_node.p2p import identity as ident
from dtrain_node.p2p import notes, wire

log = logging.getLogger(__name__)

RECEIPT_PROTOCOL = "/dtrain/receipt/1.0.0"
ACCEPTED, REFUSED = b"\x01", b"\x00"
MAX_RECEIPT = 1024


def sign_receipt(
    account: LocalAccount, chain_id: int, contract: str, job_id: int, checkpoint: bytes
) -> bytes:
    """The encoded receipt of `account` (the job's caller) for `checkpoint`."""
    body = {
        "chain_id": chain_id,
        "contract": to_checksum_address(contract),
        "job": job_id,
        "checkpoint": checkpoint.hex(),
    }
    return notes.sign(account, notes.RECEIPT, body).encode()


class ReceiptBox:
    """The receipts a member waits for: per job, the caller and the checkpoint it must name."""

    def __init__(self, chain_id: int, contract: str) -> None:
        self.chain_id, self.contract = chain_id, to_checksum_address(contract)
        self._expected: dict[int, tuple[str, str]] = {}
        self.confirmed: set[int] = set()

    def expect(self, job_id: int, caller: str, checkpoint: bytes) -> None:
        self._expected[job_id] = (to_checksum_address(caller), checkpoint.hex())

    def check(self, data: bytes) -> int:
        """The job a valid, expected receipt confirms (NoteError otherwise)."""
        note = notes.decode(data)
        job = note.body["job"]
        notes.check_about(note, self.chain_id, self.contract, job, notes.RECEIPT)
        if (note.sender, note.body.get("checkpoint")) != self._expected.get(job):
            raise NoteError("unexpected", f"no receipt of {note.sender} expected for job {job}")
        return int(job)

    async def serve(self, stream: Any) -> None:
        """One receipt in, one byte out (1: it confirms a job we wait for)."""
        answer = REFUSED
        try:
            with trio.fail_after(30):
                data = await wire.read_frame(stream, MAX_RECEIPT)
                try:
                    self.confirmed.add(self.check(data))
                    answer = ACCEPTED
                except NoteError as e:
                    log.debug("receipt refused: %s", e)
                await stream.write(answer)
        except Exception as e:  # a peer that hangs up or sends junk costs it the answer
            log.debug("receipt request failed: %r", e)
        finally:
            await wire.close_quietly(stream)


async def send_receipt(
    host: Any, peer: tuple[bytes, list[str]], data: bytes, timeout: float
) -> bool:
    """Hand `data` to one peer over the receipt protocol: whether it accepted it."""
    info = ident.peer_info(*peer)
    try:
        with trio.fail_after(timeout):
            if info.peer_id not in host.get_connected_peers():
                host.peerstore.clear_addrs(info.peer_id)
            await host.connect(info)
            stream = await host.new_stream(info.peer_id, [TProtocol(RECEIPT_PROTOCOL)])
            try:
                await wire.write_frame(stream, data)
                return await wire.read_exactly(stream, 1) == ACCEPTED
            finally:
                await wire.close_quietly(stream)
    except Exception as e:
        log.debug("receipt not delivered to %s: %r", info.peer_id, e)
        return False

"""How long a member keeps serving a completed job's final checkpoint after the job: `--linger`
for anyone, then on for the job's caller until it confirms a verified fetch with its signed
receipt (p2p/receipts.py), `--keep-final` after the job at most. A receipt is remembered in
the job's directory, so a restarted node does not keep the checkpoint again for a caller that
already has it."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECEIPT_FILE = "final-receipt.json"


@dataclass
class Keep:
    job_id: int
    caller: str
    checkpoint: bytes
    job_dir: Path
    transport: Any  # a GossipNode takes receipts; a transport without them never confirms
    linger_until: float
    keep_until: float

    @classmethod
    def after(cls, job: Any, job_dir: Path, transport: Any, linger_s: float, keep_s: float) -> Keep:
        """From now: serve `linger_s`, then until the caller's receipt, `keep_s` at most."""
        now = time.time()
        k = cls(job.id, job.state.caller, bytes(job.state.checkpoint), job_dir, transport,
                now + linger_s, now + max(linger_s, keep_s))  # fmt: skip
        expect = getattr(transport, "expect_receipt", None)
        if expect is not None and keep_s > linger_s:
            expect(k.job_id, k.caller, k.checkpoint)
        return k

    def confirmed(self) -> bool:
        """The caller confirmed its fetch (now, or before a restart)."""
        marker = self.job_dir / RECEIPT_FILE
        if marker.is_file():
            return True
        got = getattr(self.transport, "receipt_confirmed", None)
        if got is None or not got(self.job_id):
            return False
        record = {"caller": self.caller, "checkpoint": self.checkpoint.hex(), "t": time.time()}
        marker.write_text(json.dumps(record) + "\n")
        return True

    def over(self, now: float) -> bool:
        return now >= self.linger_until and (now >= self.keep_until or self.confirmed())

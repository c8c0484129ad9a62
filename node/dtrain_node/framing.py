"""The checks every binary format of the node starts with: type, size, magic and version.

Packets (optim.codec) and envelopes (p2p.envelope) both open with a 4-byte magic and a version
byte; `Frame.open` checks those before a format parses its own fields.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from dtrain_node.errors import RejectedInput

Reject = Callable[[str, str], RejectedInput]  # (reason, message) -> the format's own error


@dataclass(frozen=True)
class Frame:
    magic: bytes
    version: int
    min_bytes: int
    max_bytes: int = sys.maxsize

    def open(self, data: object, reject: Reject) -> bytes:
        """`data` as bytes once its type, size, magic and version hold; else raise `reject`."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise reject("type", f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > self.max_bytes:
            raise reject("oversized", f"{len(data)} bytes > limit {self.max_bytes}")
        if len(data) < self.min_bytes:
            raise reject("truncated", f"{len(data)} bytes < header {self.min_bytes}")
        m = len(self.magic)
        if data[:m] != self.magic:
            raise reject("magic", f"bad magic {data[:m]!r}")
        if data[m] != self.version:
            raise reject("version", f"version {data[m]}, this node speaks {self.version}")
        return data

"""A fake configfs-tsm tree: a thread plays the kernel for one report entry, answering the
read of `outblob` (a FIFO) with a report over what was written to `inblob`."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from dtrain_node.operator import attest

MRTD = bytes(range(48))  # the launch measurement the fake TDX quotes carry
SNP_MEASUREMENT = bytes(range(100, 148))


def tdx_quote(report_data: bytes) -> bytes:
    header = (4).to_bytes(2, "little") + (2).to_bytes(2, "little") + (0x81).to_bytes(4, "little")
    header += b"\x00" * (48 - len(header))
    body = bytearray(b"\x11" * 520)
    at = attest.TDX_MRTD_AT - 48
    body[at : at + 48] = MRTD
    return header + bytes(body) + report_data + b"\x00" * 200  # then the signature data


def snp_report(report_data: bytes) -> bytes:
    raw = bytearray(b"\x22" * attest.SNP_REPORT_BYTES)
    raw[attest.SNP_REPORT_DATA_AT : attest.SNP_REPORT_DATA_AT + 64] = report_data
    raw[attest.SNP_MEASUREMENT_AT : attest.SNP_MEASUREMENT_AT + 48] = SNP_MEASUREMENT
    return bytes(raw)


class FakeKernel:
    """One configfs-tsm entry `root/name`: the kernel thread waits for the reader of `outblob`,
    reads `inblob`, sets `generation` to `bump` and writes the report `make(inblob)`."""

    def __init__(
        self,
        root: Path,
        name: str,
        provider: str,
        make: Callable[[bytes], bytes],
        bump: int = 1,
    ) -> None:
        self.entry = root / name
        self.entry.mkdir(parents=True)
        (self.entry / "provider").write_text(provider + "\n")
        (self.entry / "generation").write_text("0\n")
        os.mkfifo(self.entry / "outblob")
        self.thread = threading.Thread(target=self._answer, args=(make, bump), daemon=True)
        self.thread.start()

    def _answer(self, make: Callable[[bytes], bytes], bump: int) -> None:
        with open(self.entry / "outblob", "wb") as out:  # blocks until the reader opens it
            data = (self.entry / "inblob").read_bytes()
            (self.entry / "generation").write_text(f"{bump}\n")
            out.write(make(data))

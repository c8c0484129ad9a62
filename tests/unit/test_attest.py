"""TEE reports from configfs-tsm, against a fake configfs tree: a thread plays the kernel,
answering the read of `outblob` (a FIFO) with a report over what was written to `inblob`."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from dtrain_node.operator import attest

CONTRACT = "0x" + "ab" * 20
OPERATOR = "0x" + "cd" * 20
PEER, NONCE = b"\x01" * 32, b"\x02" * 32


def tdx_quote(report_data: bytes) -> bytes:
    header = (4).to_bytes(2, "little") + (2).to_bytes(2, "little") + (0x81).to_bytes(4, "little")
    header += b"\x00" * (48 - len(header))
    body = b"\x11" * 520 + report_data
    return header + body + b"\x00" * 200  # the signature data that follows


def snp_report(report_data: bytes) -> bytes:
    raw = bytearray(b"\x22" * attest.SNP_REPORT_BYTES)
    raw[attest.SNP_REPORT_DATA_AT : attest.SNP_REPORT_DATA_AT + 64] = report_data
    return bytes(raw)


class FakeKernel:
    """One configfs-tsm entry: `outblob` is a FIFO; the kernel thread waits for the reader,
    reads `inblob`, bumps `generation` and writes the report `make(inblob)`."""

    def __init__(self, root: Path, name: str, provider: str, make, bump: int = 1) -> None:
        self.entry = root / name
        self.entry.mkdir(parents=True)
        (self.entry / "provider").write_text(provider + "\n")
        (self.entry / "generation").write_text("0\n")
        os.mkfifo(self.entry / "outblob")
        self.thread = threading.Thread(target=self._answer, args=(make, bump), daemon=True)
        self.thread.start()

    def _answer(self, make, bump: int) -> None:
        with open(self.entry / "outblob", "wb") as out:  # blocks until the reader opens it
            data = (self.entry / "inblob").read_bytes()
            (self.entry / "generation").write_text(f"{bump}\n")
            out.write(make(data))


@pytest.mark.parametrize(
    ("provider", "make"), [("tdx_guest", tdx_quote), ("sev_guest", snp_report)]
)
def test_a_report_carries_the_operators_binding(tmp_path, provider, make) -> None:
    want = attest.binding(31337, CONTRACT, OPERATOR, PEER, NONCE)
    kernel = FakeKernel(tmp_path, "r", provider, make)
    report = attest.request(want, tmp_path, name="r")
    kernel.thread.join(5)
    assert report.provider == provider and report.report_data == want
    assert report.tee_type == attest.TEE_TYPES[provider]
    attest.check_bound(report, want)
    assert (tmp_path / "r" / "inblob").read_bytes() == want  # what the kernel was asked for


def test_a_report_for_another_operator_or_peer_is_not_ours(tmp_path) -> None:
    ours = attest.binding(31337, CONTRACT, OPERATOR, PEER, NONCE)
    FakeKernel(tmp_path, "r", "tdx_guest", tdx_quote)
    report = attest.request(ours, tmp_path, name="r")
    for other in (
        attest.binding(31337, CONTRACT, "0x" + "ce" * 20, PEER, NONCE),
        attest.binding(31337, CONTRACT, OPERATOR, b"\x09" * 32, NONCE),
        attest.binding(1, CONTRACT, OPERATOR, PEER, NONCE),
        attest.binding(31337, CONTRACT, OPERATOR, PEER, b"\x03" * 32),
    ):
        assert other != ours
        with pytest.raises(attest.AttestationError, match="bound to another"):
            attest.check_bound(report, other)


def test_a_kernel_answering_other_data_or_another_generation_is_refused(tmp_path) -> None:
    want = attest.binding(31337, CONTRACT, OPERATOR, PEER, NONCE)
    FakeKernel(tmp_path, "a", "sev_guest", lambda _: snp_report(b"\x07" * 64))
    with pytest.raises(attest.AttestationError, match="does not carry our report data"):
        attest.request(want, tmp_path, name="a")
    FakeKernel(tmp_path, "b", "sev_guest", snp_report, bump=2)  # someone else wrote inblob too
    with pytest.raises(attest.AttestationError, match="generation"):
        attest.request(want, tmp_path, name="b")


def test_malformed_reports_and_missing_tsm_are_clear_errors(tmp_path) -> None:
    with pytest.raises(attest.AttestationError, match="too short"):
        attest.report_data_of("tdx_guest", b"\x04\x00" + b"\x00" * 100)
    with pytest.raises(attest.AttestationError, match="not a TDX v4 quote"):
        attest.report_data_of("tdx_guest", b"\x03\x00" + b"\x00" * 700)
    with pytest.raises(attest.AttestationError, match="too short"):
        attest.report_data_of("sev_guest", b"\x00" * 100)
    with pytest.raises(attest.AttestationError, match="unknown TEE provider"):
        attest.report_data_of("cca_guest", b"\x00" * 2000)
    with pytest.raises(attest.AttestationError, match="not a TDX/SEV guest"):
        attest.request(b"\x00" * 64, tmp_path / "missing")
    with pytest.raises(ValueError, match="64 bytes"):
        attest.request(b"\x00" * 32, tmp_path)

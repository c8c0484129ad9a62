"""TEE attestation reports from Linux configfs-tsm (Intel TDX, AMD SEV-SNP), bound to the
operator: the report's 64 bytes of report data are `binding(...)`, a hash of the chain, the
contract, the operator's address and its libp2p peer key (and a nonce), so a report produced for
one operator or peer cannot be replayed for another.

configfs-tsm (Linux >= 6.7, `Documentation/ABI/testing/configfs-tsm`): make a directory under
`/sys/kernel/config/tsm/report/`, write the report data to its `inblob`, read the report from
`outblob` and the TEE from `provider`; `generation` counts the writes to `inblob`, so a report
whose generation is not the one our write made was produced for somebody else's data.

This module produces, parses and checks the binding of a report. It does not check the hardware
vendor's signature chain over it: that is the attestation service's job (`attest_service`, whose
reference implementation does not do it either), whose signed statement an allowed on-chain
verifier contract checks before the BSM counts the attestation for `teeRequired` jobs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from dtrain_node.errors import NodeError

TSM_REPORTS = Path("/sys/kernel/config/tsm/report")
BINDING_TAG = b"dtrain-tee/1"
REPORT_DATA_BYTES = 64
# Where each provider's report carries the report data, and its least size.
TDX_QUOTE_VERSION = 4
TDX_TEE_TYPE = 0x81
TDX_REPORT_DATA_AT = 48 + 520  # quote header, then the TD report body's REPORTDATA
SNP_REPORT_DATA_AT = 0x50
SNP_MEASUREMENT_AT = 0x90
SNP_REPORT_BYTES = 0x4A0
TDX_MRTD_AT = 48 + 136  # the TD report body's MRTD (after TEE_TCB_SVN, MRSEAM, ... XFAM)
MEASUREMENT_BYTES = 48
TEE_TYPES = {"tdx_guest": 1, "sev_guest": 2}  # the contract's teeType


class AttestationError(NodeError):
    """No usable TEE report: no configfs-tsm, an unknown provider, a malformed or unbound
    report."""


@dataclass(frozen=True)
class Report:
    provider: str  # "tdx_guest" or "sev_guest"
    raw: bytes  # the quote (TDX) or attestation report (SEV-SNP), as the kernel gave it
    report_data: bytes  # the 64 bytes bound into it

    @property
    def tee_type(self) -> int:
        return TEE_TYPES[self.provider]

    @property
    def digest(self) -> bytes:
        """sha256 of the raw report: what the operator records on-chain."""
        return hashlib.sha256(self.raw).digest()


def binding(chain_id: int, contract: str, operator: str, peer_key: bytes, nonce: bytes) -> bytes:
    """The 64 bytes of report data that bind a report to this operator on this deployment."""
    if len(peer_key) != 32 or len(nonce) != 32:
        raise ValueError("peer_key and nonce must be 32 bytes each")
    return hashlib.sha512(
        BINDING_TAG
        + chain_id.to_bytes(32, "big")
        + bytes.fromhex(contract.removeprefix("0x"))
        + bytes.fromhex(operator.removeprefix("0x"))
        + peer_key
        + nonce
    ).digest()


def report_data_of(provider: str, raw: bytes) -> bytes:
    """The report data a provider's report carries (AttestationError if it is malformed)."""
    if provider == "tdx_guest":
        if len(raw) < TDX_REPORT_DATA_AT + REPORT_DATA_BYTES:
            raise AttestationError(f"TDX quote of {len(raw)} bytes is too short")
        version = int.from_bytes(raw[0:2], "little")
        tee = int.from_bytes(raw[4:8], "little")
        if version != TDX_QUOTE_VERSION or tee != TDX_TEE_TYPE:
            raise AttestationError(f"not a TDX v4 quote (version {version}, tee type {tee:#x})")
        return raw[TDX_REPORT_DATA_AT : TDX_REPORT_DATA_AT + REPORT_DATA_BYTES]
    if provider == "sev_guest":
        if len(raw) < SNP_REPORT_BYTES:
            raise AttestationError(f"SEV-SNP report of {len(raw)} bytes is too short")
        return raw[SNP_REPORT_DATA_AT : SNP_REPORT_DATA_AT + REPORT_DATA_BYTES]
    raise AttestationError(f"unknown TEE provider {provider!r}; known: {', '.join(TEE_TYPES)}")


def measurement_of(provider: str, raw: bytes) -> bytes:
    """The TEE's launch measurement (TDX MRTD, SEV-SNP MEASUREMENT: 48 bytes) in a report
    that `report_data_of` accepts."""
    report_data_of(provider, raw)  # same shape checks
    at = TDX_MRTD_AT if provider == "tdx_guest" else SNP_MEASUREMENT_AT
    return raw[at : at + MEASUREMENT_BYTES]


def request(report_data: bytes, root: Path = TSM_REPORTS, name: str | None = None) -> Report:
    """A fresh report over `report_data` from configfs-tsm at `root` (in the entry `name`, a
    new one by default), checked to carry it."""
    if len(report_data) != REPORT_DATA_BYTES:
        raise ValueError(f"report data must be {REPORT_DATA_BYTES} bytes")
    if not root.is_dir():
        raise AttestationError(f"no configfs-tsm at {root}: this machine is not a TDX/SEV guest")
    entry = root / (name or f"dtrain-{os.getpid()}-{secrets.token_hex(4)}")
    try:
        entry.mkdir(exist_ok=True)
        before = _generation(entry)
        (entry / "inblob").write_bytes(report_data)
        raw = (entry / "outblob").read_bytes()
        provider = (entry / "provider").read_text().strip()
        if _generation(entry) != before + 1:
            raise AttestationError("the report was written for another request (generation)")
    except OSError as exc:
        raise AttestationError(f"configfs-tsm at {root}: {exc.strerror or exc}") from None
    finally:
        # configfs removes an entry with its attribute files; a leftover entry is harmless
        with contextlib.suppress(OSError):
            entry.rmdir()
    got = report_data_of(provider, raw)
    if got != report_data:
        raise AttestationError("the report does not carry our report data")
    return Report(provider, raw, got)


def _generation(entry: Path) -> int:
    text = (entry / "generation").read_text().strip() if (entry / "generation").exists() else "0"
    return int(text or 0)


def check_bound(report: Report, expected: bytes) -> None:
    """AttestationError unless `report` carries the binding `expected`."""
    if report_data_of(report.provider, report.raw) != expected:
        raise AttestationError("the report is bound to another operator, peer key or nonce")

"""TEE reports from configfs-tsm, against a fake configfs tree (harness.fake_tsm)."""

from __future__ import annotations

import pytest
from harness.fake_tsm import MRTD, SNP_MEASUREMENT, FakeKernel, snp_report, tdx_quote

from dtrain_node.operator import attest

CONTRACT = "0x" + "ab" * 20
OPERATOR = "0x" + "cd" * 20
PEER, NONCE = b"\x01" * 32, b"\x02" * 32


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
    want_m = MRTD if provider == "tdx_guest" else SNP_MEASUREMENT
    assert attest.measurement_of(provider, report.raw) == want_m
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

"""TEE attestation on a real anvil: a fake configfs-tsm tree makes the report, the reference
attestation service (a real `dtrain attest serve` process) checks its binding and signs a
statement, the operator submits it and joins a teeRequired job; tampered, replayed or unbound
reports are refused by the service, and an operator without an attestation cannot join."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
from eth_account import Account
from harness import default_sigint
from harness.chain import ETH, peer_key, spec
from harness.fake_tsm import MRTD, SNP_MEASUREMENT, FakeKernel, snp_report, tdx_quote

from dtrain import errors
from dtrain.attestation import AttestationVerifier, Statement, evidence, sign_statement
from dtrain.cli import main
from dtrain.client import BSM
from dtrain.models import JobStatus
from dtrain_node.operator import attest
from dtrain_node.operator.attest_service import AttestationRefused, obtain, submit

DTRAIN = [sys.executable, "-m", "dtrain.cli"]
SERVICE = Account.from_key("0x" + "5e" * 32)  # the attestation service's key (never pays gas)
DEVELOPER = 11  # accounts[11] is the BSM's blueprint developer (conftest)


@contextmanager
def service(chain, bsm: BSM, verifier: str, tmp: Path) -> Iterator[str]:
    """A running `dtrain attest serve`; yields its URL."""
    out = tmp / "service.out"
    args = ["--rpc-url", chain.url, "--contract", bsm.address, "attest", "serve"]
    args += ["--key", SERVICE.key.hex(), "--verifier", verifier, "--port", "0", "--ttl", "3600"]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            [*DTRAIN, *args, "--no-vendor-check"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            preexec_fn=default_sigint,
        )
    try:
        deadline = time.monotonic() + 60
        while not (m := re.search(r"on (http://\S+)", out.read_text())):
            assert proc.poll() is None, out.read_text()
            assert time.monotonic() < deadline, "service did not start"
            time.sleep(0.1)
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def verifier(bsm: BSM, accounts) -> str:
    v = AttestationVerifier.deploy(bsm.w3, accounts[0].key, SERVICE.address)
    bsm.with_account(accounts[DEVELOPER].key).set_attestation_verifier(v.address)
    return v.address


def operators(as_account, n: int) -> list[BSM]:
    ops = [as_account(i) for i in range(1, n + 1)]
    for i, op in enumerate(ops, 1):
        op.register_operator(2 * ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4000 + i}"])
    return ops


def tee_job(bsm: BSM) -> int:
    return bsm.create_job(spec(tee_required=True, min_operators=2, max_operators=2))


def test_fake_tsm_report_to_statement_to_a_teeRequired_join(
    chain, bsm, as_account, verifier, tmp_path, capsys
) -> None:
    a, b = operators(as_account, 2)
    job = tee_job(bsm.with_account(as_account(5).account))
    with pytest.raises(errors.AttestationRequired) as refused:
        a.join_job(job)
    assert refused.value.values[:3] == (job, a.sender, 0)
    with service(chain, bsm, verifier, tmp_path) as url:
        # a: a TDX quote, obtained and submitted in process
        FakeKernel(tmp_path / "tsm", "a", "tdx_guest", tdx_quote)
        answer = obtain(url, a, a.sender, peer_key(1), tmp_path / "tsm", entry="a")
        st = answer["statement"]
        assert st["operator"] == a.sender and st["teeType"] == 1
        assert st["peerKey"] == "0x" + peer_key(1).hex()
        assert st["measurement"] == "0x" + hashlib.sha256(MRTD).hexdigest()
        assert answer["verifier"] == verifier and answer["chainId"] == bsm.chain_id
        submit(a, answer)
        # b: an SEV-SNP report, saved to a file and submitted with the CLI
        FakeKernel(tmp_path / "tsm", "b", "sev_guest", snp_report)
        answer_b = obtain(url, b, b.sender, peer_key(2), tmp_path / "tsm", entry="b")
        assert answer_b["statement"]["teeType"] == 2
        assert answer_b["statement"]["measurement"] == "0x" + (
            hashlib.sha256(SNP_MEASUREMENT).hexdigest()
        )
    # a's statement is useless to b (bound to a)
    with pytest.raises(errors.WrongOperator):
        submit(b, answer)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(answer_b))
    base = ["--rpc-url", chain.url, "--contract", bsm.address, "--key", b.account.key.hex()]
    assert main([*base, "attest", "submit", "--file", str(path)]) == 0
    assert "attestation recorded" in capsys.readouterr().out
    for op in (a, b):
        got = op.attestation_of(op.sender)
        assert got.valid and got.verifier == verifier
        assert got.expires_at == got.issued_at + 3600
        op.join_job(job)
    assert bsm.job(job).state.status == JobStatus.RUNNING


def test_the_service_refuses_tampered_replayed_and_unbound_reports(
    chain, bsm, as_account, verifier, tmp_path
) -> None:
    (a,) = operators(as_account, 1)

    def post(url: str, nonce: bytes, report: bytes, key: bytes = peer_key(1)) -> requests.Response:
        body = {
            "operator": a.sender,
            "peerKey": "0x" + key.hex(),
            "provider": "tdx_guest",
            "report": "0x" + report.hex(),
            "nonce": "0x" + nonce.hex(),
        }
        return requests.post(f"{url}/attest", json=body, timeout=30)

    def nonce(url: str) -> bytes:
        return bytes.fromhex(requests.get(f"{url}/nonce", timeout=30).json()["nonce"][2:])

    def bound(n: bytes, operator: str = "", key: bytes = peer_key(1)) -> bytes:
        return attest.binding(bsm.chain_id, bsm.address, operator or a.sender, key, n)

    with service(chain, bsm, verifier, tmp_path) as url:
        n = nonce(url)
        other = "0x" + "cd" * 20
        r = post(url, n, tdx_quote(bound(n, operator=other)))  # bound to another operator
        assert r.status_code == 400 and "bound to another" in r.json()["error"]
        n = nonce(url)
        quote = bytearray(tdx_quote(bound(n)))
        quote[attest.TDX_REPORT_DATA_AT] ^= 1  # tampered report data
        r = post(url, n, bytes(quote))
        assert r.status_code == 400 and "bound to another" in r.json()["error"]
        n = nonce(url)
        r = post(url, n, tdx_quote(bound(n, key=peer_key(9))), key=peer_key(9))
        assert r.status_code == 400 and "not registered" in r.json()["error"]
        n = nonce(url)
        assert post(url, n, tdx_quote(bound(n))).status_code == 200
        r = post(url, n, tdx_quote(bound(n)))  # the same nonce again: a replay
        assert r.status_code == 400 and "nonce" in r.json()["error"]
        r = post(url, b"\x07" * 32, tdx_quote(bound(b"\x07" * 32)))  # a nonce it never gave
        assert r.status_code == 400 and "nonce" in r.json()["error"]
        # A kernel that answers a report over other data: the node refuses before posting.
        FakeKernel(tmp_path / "tsm", "x", "tdx_guest", lambda _: tdx_quote(b"\x00" * 64))
        with pytest.raises(AttestationRefused, match="does not carry our report data"):
            obtain(url, a, a.sender, peer_key(1), tmp_path / "tsm", entry="x")
    assert not a.attestation_of(a.sender).valid
    job = tee_job(bsm.with_account(as_account(5).account))
    with pytest.raises(errors.AttestationRequired):
        a.join_job(job)


def test_a_strangers_verifier_is_not_allowed_and_only_the_developer_allows(
    chain, bsm, as_account, accounts, capsys
) -> None:
    (a,) = operators(as_account, 1)
    stranger = accounts[6]
    own = AttestationVerifier.deploy(bsm.w3, stranger.key, stranger.address)  # signs anything
    base = ["--rpc-url", chain.url, "--contract", bsm.address, "--key", stranger.key]
    assert main([*base, "attest", "allow", own.address]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: only the blueprint developer") and "\n" not in err
    now = bsm.latest_block_timestamp()
    st = Statement(a.sender, peer_key(1), 1, b"\x00" * 32, b"\x00" * 32, now, now + 3600)
    ev = evidence(st, sign_statement(Account.from_key(stranger.key), st, bsm.chain_id, own.address))
    with pytest.raises(errors.VerifierNotAllowed):
        a.submit_attestation(own.address, ev)


def test_serve_refuses_to_start_without_no_vendor_check(chain, bsm, capsys) -> None:
    args = ["--rpc-url", chain.url, "--contract", bsm.address, "attest", "serve"]
    code = main([*args, "--key", SERVICE.key.hex(), "--verifier", "0x" + "11" * 20])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in err
    assert "does not verify the TEE vendor's certificate chain" in err


def test_the_node_attests_before_a_teeRequired_join_only_with_tee(
    chain, bsm, as_account, verifier, tmp_path
) -> None:
    """`node run --tee --attestation-file`: the node submits the saved statement when its
    record does not count, and without --tee it neither picks nor attests for such a job."""
    from types import SimpleNamespace

    from dtrain_node.operator.node import Node, NodeConfig

    (a,) = operators(as_account, 1)
    job = tee_job(bsm.with_account(as_account(5).account))
    with service(chain, bsm, verifier, tmp_path) as url:
        FakeKernel(tmp_path / "tsm", "a", "tdx_guest", tdx_quote)
        answer = obtain(url, a, a.sender, peer_key(1), tmp_path / "tsm", entry="a")
    saved = tmp_path / "statement.json"
    saved.write_text(json.dumps(answer))
    base = dict(key=a.account.key.hex(), rpc_url=chain.url, contract=bsm.address, job_id=job)
    plain = Node(NodeConfig(data_dir=tmp_path / "plain", **base))
    assert "run with --tee" in (plain.ensure_attested() or "")
    assert not plain._acceptable(bsm.job(job), 10 * ETH)
    assert not a.attestation_of(a.sender).valid
    tee = Node(NodeConfig(data_dir=tmp_path / "tee", tee=True, attestation_file=saved, **base))
    tee.transport = SimpleNamespace(peer_key=peer_key(1))
    assert tee.ensure_attested() is None
    assert a.attestation_of(a.sender).valid
    a.join_job(job)
    assert a.sender in bsm.job(job).pending_joins + bsm.job(job).members


def test_attest_and_tee_options_refuse_bad_input_in_one_line(chain, bsm, accounts, capsys) -> None:
    base = ["--rpc-url", chain.url, "--contract", bsm.address, "--key", accounts[1].key]
    for args, words in (
        (["attest", "submit"], "exactly one of --service URL or --file PATH"),
        (["node", "run", "--data-dir", "/tmp/x", "--job", "1", "--tee"], "--attestation-service"),
        (
            ["node", "run", "--data-dir", "/tmp/x", "--job", "1", "--attestation-file", __file__],
            "need --tee",
        ),
        (["attest", "allow", "0x" + "11" * 20], "only the blueprint developer"),
    ):
        code = main([*base, *args])
        err = capsys.readouterr().err.strip()
        assert code != 0 and words in err, (args, err)
        assert (
            len(
                [
                    line
                    for line in err.splitlines()
                    if line.startswith("Error") or line.startswith("error")
                ]
            )
            == 1
        )


def test_a_nonce_flood_keeps_the_service_bounded(bsm) -> None:
    from dtrain_node.operator import attest_service as svc

    service = svc.AttestationService(Account.create(), bsm, bsm.address, vendor_check=False)
    first = service.nonce()
    for _ in range(svc.MAX_NONCES):
        service.nonce()
    assert len(service._nonces) == svc.MAX_NONCES and first not in service._nonces
    with pytest.raises(AttestationRefused, match="vendor"):
        svc.AttestationService(Account.create(), bsm, bsm.address)

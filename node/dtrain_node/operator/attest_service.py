"""A reference attestation service and its client.

The node asks the service for a nonce, has configfs-tsm make a TEE report whose 64 bytes of
report data bind (chain id, BSM, operator, peer key, nonce) (`attest.binding`), and posts it.
The service checks that binding for its own chain and BSM, that the nonce is one it handed out
and unused, that the operator is registered on the BSM with that peer key, and answers a
`Statement` signed with its key, which the SignedAttestationVerifier accepts on-chain.

It does NOT verify the report's vendor signature and certificate chain (Intel's PCS collateral
for a TDX quote, AMD's VCEK chain for an SEV-SNP report): anyone who can post bytes shaped like a
report gets a statement. It is a reference for the protocol and for tests, and refuses to start
unless told `vendor_check=False` (`--no-vendor-check`). A production service must check the
vendor chain before signing.

HTTP: `GET /nonce` -> {"nonce": "0x.."}; `POST /attest` {operator, peerKey, provider, report,
nonce} -> {"verifier", "chainId", "statement": {...}, "signature"}; errors are 400 with
{"error": "one line"}.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests
from eth_account.signers.local import LocalAccount
from web3 import Web3

from dtrain.attestation import Statement, evidence, sign_statement
from dtrain.client import BSM
from dtrain.errors import DtrainError
from dtrain_node.operator import attest

NONCE_TTL_S = 300.0
MAX_NONCES = 10_000  # outstanding at once: a flood of GET /nonce evicts the oldest
MAX_BODY_BYTES = 64 * 1024
VENDOR_CHECK_MISSING = (
    "the reference attestation service does not verify the TEE vendor's certificate chain; "
    "pass --no-vendor-check to run it anyway (tests and demos only)"
)


class AttestationRefused(DtrainError):
    """The attestation service (or the node's TEE) could not produce a statement."""


@dataclass
class AttestationService:
    """Signs statements for reports bound to `bsm`'s chain and address (see the module doc)."""

    signer: LocalAccount
    bsm: BSM
    verifier: str
    ttl_s: int = 86_400
    vendor_check: bool = True
    clock: Callable[[], float] = time.monotonic
    _nonces: dict[bytes, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.vendor_check:
            raise AttestationRefused(VENDOR_CHECK_MISSING)
        if self.ttl_s <= 0:
            raise AttestationRefused(f"statement validity must be positive, got {self.ttl_s}s")
        self.verifier = Web3.to_checksum_address(self.verifier)

    def nonce(self) -> bytes:
        now = self.clock()
        n = secrets.token_bytes(32)
        with self._lock:
            for old in [k for k, t in self._nonces.items() if now - t > NONCE_TTL_S]:
                del self._nonces[old]
            while len(self._nonces) >= MAX_NONCES:
                del self._nonces[next(iter(self._nonces))]  # the oldest (insertion order)
            self._nonces[n] = now
        return n

    def attest(self, body: dict[str, Any]) -> dict[str, Any]:
        try:
            operator = Web3.to_checksum_address(body["operator"])
            peer_key = _hex(body["peerKey"], 32)
            nonce = _hex(body["nonce"], 32)
            provider = str(body["provider"])
            raw = _hex(body["report"])
        except (KeyError, TypeError, ValueError) as exc:
            raise AttestationRefused(f"malformed request: {exc}") from None
        with self._lock:
            issued = self._nonces.pop(nonce, None)  # single use, even when refused below
        if issued is None or self.clock() - issued > NONCE_TTL_S:
            raise AttestationRefused("unknown, used or stale nonce: ask GET /nonce again")
        want = attest.binding(self.bsm.chain_id, self.bsm.address, operator, peer_key, nonce)
        try:
            report = attest.Report(provider, raw, attest.report_data_of(provider, raw))
            attest.check_bound(report, want)
            measurement = attest.measurement_of(provider, raw)
        except attest.AttestationError as exc:
            raise AttestationRefused(str(exc)) from None
        op = self.bsm.operator(operator)
        if not op.registered or op.peer_key != peer_key:
            raise AttestationRefused(
                f"{operator} is not registered on {self.bsm.address} "
                f"with peer key 0x{peer_key.hex()}"
            )
        issued_at = self.bsm.latest_block_timestamp()
        statement = Statement(
            operator=operator,
            peer_key=peer_key,
            tee_type=report.tee_type,
            measurement=hashlib.sha256(measurement).digest(),
            report_data_hash=hashlib.sha256(report.report_data).digest(),
            issued_at=issued_at,
            expires_at=issued_at + self.ttl_s,
        )
        signature = sign_statement(self.signer, statement, self.bsm.chain_id, self.verifier)
        return {
            "verifier": self.verifier,
            "chainId": self.bsm.chain_id,
            "statement": statement.as_json(),
            "signature": "0x" + signature.hex(),
        }


def make_server(service: AttestationService, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/nonce":
                return self._answer(404, {"error": f"no such path {self.path}"})
            self._answer(200, {"nonce": "0x" + service.nonce().hex()})

        def do_POST(self) -> None:
            if self.path != "/attest":
                return self._answer(404, {"error": f"no such path {self.path}"})
            size = int(self.headers.get("Content-Length") or 0)
            if size <= 0 or size > MAX_BODY_BYTES:
                return self._answer(400, {"error": f"body of {size} bytes refused"})
            try:
                body = json.loads(self.rfile.read(size))
                if not isinstance(body, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                return self._answer(400, {"error": f"malformed request: {exc}"})
            try:
                self._answer(200, service.attest(body))
            except DtrainError as exc:
                self._answer(400, {"error": str(exc)})

        def _answer(self, code: int, data: dict[str, Any]) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            return

    return ThreadingHTTPServer((host, port), Handler)


# ---------------------------------------------------------------------- the node's side


def obtain(
    service_url: str,
    bsm: BSM,
    operator: str,
    peer_key: bytes,
    root: Path = attest.TSM_REPORTS,
    timeout: float = 30.0,
    entry: str | None = None,
) -> dict[str, Any]:
    """A signed statement for `operator`: a nonce from the service, a configfs-tsm report over
    our binding (in the report entry `entry`, a new one by default), the service's answer (as
    `AttestationService.attest` returns it)."""
    url = service_url.rstrip("/")
    try:
        got = requests.get(f"{url}/nonce", timeout=timeout)
        nonce = _hex(_json(got)["nonce"], 32)
        data = attest.binding(bsm.chain_id, bsm.address, operator, peer_key, nonce)
        report = attest.request(data, root, name=entry)
        body = {
            "operator": operator,
            "peerKey": "0x" + peer_key.hex(),
            "provider": report.provider,
            "report": "0x" + report.raw.hex(),
            "nonce": "0x" + nonce.hex(),
        }
        return _json(requests.post(f"{url}/attest", json=body, timeout=timeout))
    except attest.AttestationError as exc:
        raise AttestationRefused(str(exc)) from None
    except requests.exceptions.RequestException as exc:
        raise AttestationRefused(
            f"attestation service {url} unreachable ({type(exc).__name__})"
        ) from None


def load_answer(path: Path) -> dict[str, Any]:
    """A service answer saved to a file (`dtrain attest request --out`)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AttestationRefused(f"cannot read attestation file {path}: {exc}") from None


def submit(bsm: BSM, answer: dict[str, Any]) -> None:
    """Submits a service answer with `submitAttestation` on `bsm` (signing as the operator)."""
    try:
        verifier = Web3.to_checksum_address(answer["verifier"])
        statement = Statement.from_json(answer["statement"])
        signature = _hex(answer["signature"])
    except (KeyError, TypeError, ValueError) as exc:
        raise AttestationRefused(f"malformed attestation: {exc}") from None
    bsm.submit_attestation(verifier, evidence(statement, signature))


def _json(resp: requests.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        data = {}
    if resp.status_code != 200:
        raise AttestationRefused(
            f"attestation service refused ({resp.status_code}): {data.get('error', resp.reason)}"
        )
    if not isinstance(data, dict):
        raise AttestationRefused("attestation service answered something other than an object")
    return data


def _hex(value: Any, size: int | None = None) -> bytes:
    raw = bytes.fromhex(str(value).removeprefix("0x"))
    if size is not None and len(raw) != size:
        raise ValueError(f"expected {size} bytes, got {len(raw)}")
    return raw

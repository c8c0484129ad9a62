"""TEE attestation statements and the SignedAttestationVerifier contract.

An attestation service checks an operator's TEE report off-chain and signs a `Statement`
(EIP-712, domain "DtrainAttestation" v1 on the verifier's chain and address) with its key; the
verifier contract, whose owner registered that key, accepts it for `submitAttestation` on the
BSM. What that proves, and what not: docs/contract.md, "TEE attestation"."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_abi import encode
from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from web3 import Web3

from . import typed_data as eip712
from .artifacts import VERIFIER, load_named
from .client import CompanionContract, Receipt, load_key
from .errors import DtrainError

DOMAIN_NAME, DOMAIN_VERSION = "DtrainAttestation", "1"
TEE_TDX, TEE_SNP = 1, 2
_STATEMENT_FIELDS = [
    {"name": "operator", "type": "address"},
    {"name": "peerKey", "type": "bytes32"},
    {"name": "teeType", "type": "uint8"},
    {"name": "measurement", "type": "bytes32"},
    {"name": "reportDataHash", "type": "bytes32"},
    {"name": "issuedAt", "type": "uint64"},
    {"name": "expiresAt", "type": "uint64"},
]
_STATEMENT_ABI = "(address,bytes32,uint8,bytes32,bytes32,uint64,uint64)"


class AttestationError(DtrainError):
    """A malformed attestation statement or evidence."""


@dataclass(frozen=True)
class Statement:
    """What the attestation service vouches for (ISignedAttestationVerifier.Statement)."""

    operator: str
    peer_key: bytes
    tee_type: int
    measurement: bytes
    report_data_hash: bytes
    issued_at: int
    expires_at: int

    def as_tuple(self) -> tuple[Any, ...]:
        return (
            Web3.to_checksum_address(self.operator),
            _b32(self.peer_key),
            self.tee_type,
            _b32(self.measurement),
            _b32(self.report_data_hash),
            self.issued_at,
            self.expires_at,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "operator": Web3.to_checksum_address(self.operator),
            "peerKey": "0x" + _b32(self.peer_key).hex(),
            "teeType": self.tee_type,
            "measurement": "0x" + _b32(self.measurement).hex(),
            "reportDataHash": "0x" + _b32(self.report_data_hash).hex(),
            "issuedAt": self.issued_at,
            "expiresAt": self.expires_at,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Statement:
        try:
            return cls(
                operator=Web3.to_checksum_address(d["operator"]),
                peer_key=_hex32(d["peerKey"]),
                tee_type=int(d["teeType"]),
                measurement=_hex32(d["measurement"]),
                report_data_hash=_hex32(d["reportDataHash"]),
                issued_at=int(d["issuedAt"]),
                expires_at=int(d["expiresAt"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AttestationError(f"malformed attestation statement: {exc}") from None


def typed_data(statement: Statement, chain_id: int, verifier: str) -> dict[str, Any]:
    """The EIP-712 typed data the service signs for `statement` on `verifier`."""
    message = dict(zip((f["name"] for f in _STATEMENT_FIELDS), statement.as_tuple(), strict=True))
    domain = (DOMAIN_NAME, DOMAIN_VERSION, chain_id, verifier)
    return eip712.typed_data("Statement", _STATEMENT_FIELDS, domain, message)


def sign_statement(
    signer: LocalAccount, statement: Statement, chain_id: int, verifier: str
) -> bytes:
    """The service's 65-byte signature (r, s, v) over `statement`."""
    signed = signer.sign_message(
        encode_typed_data(full_message=typed_data(statement, chain_id, verifier))
    )
    return bytes(signed.signature)


def evidence(statement: Statement, signature: bytes) -> bytes:
    """`submitAttestation`'s evidence for the SignedAttestationVerifier."""
    return encode([_STATEMENT_ABI, "bytes"], [statement.as_tuple(), bytes(signature)])


class AttestationVerifier(CompanionContract):
    """A deployed SignedAttestationVerifier, optionally with a signing account (its owner)."""

    @classmethod
    def abi(cls) -> list[dict[str, Any]]:
        return load_named(VERIFIER).abi

    @classmethod
    def bytecode(cls) -> str:
        return load_named(VERIFIER).bytecode

    @classmethod
    def deploy(
        cls, rpc_url_or_w3: str | Web3, key: str | LocalAccount, attester: str, owner: str = ""
    ) -> AttestationVerifier:
        """Deploys a verifier that trusts the service key `attester`, owned by `owner` (the
        deployer by default)."""
        account = load_key(key) if isinstance(key, str) else key
        owner = Web3.to_checksum_address(owner or account.address)
        verifier = cls._deploy(rpc_url_or_w3, account, owner, Web3.to_checksum_address(attester))
        assert isinstance(verifier, AttestationVerifier)
        return verifier

    def attester(self) -> str:
        return str(self.contract.functions.attester().call())

    def valid_since(self) -> int:
        return int(self.contract.functions.validSince().call())

    def set_attester(self, attester: str) -> Receipt:
        return self._transact(
            self.contract.functions.setAttester(Web3.to_checksum_address(attester))
        )

    def set_measurement(self, measurement: bytes, allowed: bool = True) -> Receipt:
        return self._transact(self.contract.functions.setMeasurement(_b32(measurement), allowed))


def _b32(value: bytes) -> bytes:
    if len(value) != 32:
        raise AttestationError(f"expected 32 bytes, got {len(value)}")
    return bytes(value)


def _hex32(value: str) -> bytes:
    raw = bytes.fromhex(str(value).removeprefix("0x"))
    return _b32(raw)

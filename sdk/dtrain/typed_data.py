"""EIP-712 typed data for the contracts the SDK signs for (TestUSD's transfer authorizations,
the attestation verifier's statements): one domain shape, bound to a chain and a contract."""

from __future__ import annotations

from typing import Any

from web3 import Web3

DOMAIN_FIELDS = [
    {"name": "name", "type": "string"},
    {"name": "version", "type": "string"},
    {"name": "chainId", "type": "uint256"},
    {"name": "verifyingContract", "type": "address"},
]


def typed_data(
    primary: str,
    fields: list[dict[str, str]],
    domain: tuple[str, str, int, str],
    message: dict[str, Any],
) -> dict[str, Any]:
    """`message` as a `primary` struct of `fields`, in the domain (name, version, chain id,
    verifying contract): what `encode_typed_data(full_message=...)` takes."""
    name, version, chain_id, contract = domain
    return {
        "types": {"EIP712Domain": DOMAIN_FIELDS, primary: fields},
        "primaryType": primary,
        "domain": {
            "name": name,
            "version": version,
            "chainId": chain_id,
            "verifyingContract": Web3.to_checksum_address(contract),
        },
        "message": message,
    }

"""TestUSD, the devnet's USDC-like ERC-20 (6 decimals, EIP-3009 transfers by signed
authorization): deploy it, mint, move and sign authorizations. For local chains only; on a
real network a job's token is whatever ERC-20 the blueprint developer allowed."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from eth_account.messages import encode_typed_data
from eth_account.signers.local import LocalAccount
from web3 import Web3

from .client import CompanionContract, Receipt
from .errors import DtrainError, TransactionFailed
from .typed_data import typed_data

ARTIFACT = Path(__file__).resolve().parent / "artifacts" / "TestUSD.json"
DECIMALS = 6
UNIT = 10**DECIMALS  # one whole TestUSD in base units


@cache
def _artifact() -> dict[str, Any]:
    return json.loads(ARTIFACT.read_text())


_AUTHORIZATION_FIELDS = [
    {"name": "from", "type": "address"},
    {"name": "to", "type": "address"},
    {"name": "value", "type": "uint256"},
    {"name": "validAfter", "type": "uint256"},
    {"name": "validBefore", "type": "uint256"},
    {"name": "nonce", "type": "bytes32"},
]


class TokenError(DtrainError):
    """A custom error of the token contract (its own or an OpenZeppelin ERC-20 error)."""

    def __init__(self, error_name: str, values: tuple[Any, ...]) -> None:
        self.error_name, self.values = error_name, values
        super().__init__(f"token refused: {error_name}({', '.join(map(str, values))})")


@cache
def _errors() -> dict[bytes, tuple[str, list[str]]]:
    from eth_utils import keccak

    out = {}
    for item in _artifact()["abi"]:
        if item["type"] == "error":
            types = [i["type"] for i in item["inputs"]]
            out[keccak(text=f"{item['name']}({','.join(types)})")[:4]] = (item["name"], types)
    return out


def decode_token_revert(data: str | bytes | None) -> DtrainError:
    from eth_abi import decode

    if isinstance(data, str):
        data = bytes.fromhex(data.removeprefix("0x"))
    known = _errors().get(bytes(data[:4])) if data else None
    if known is None:
        return TransactionFailed(f"token transaction reverted with data 0x{(data or b'').hex()}")
    name, types = known
    return TokenError(name, tuple(decode(types, data[4:])))


class NotTestUSD(DtrainError):
    """An address that does not hold this SDK's TestUSD (only it can be minted by anyone)."""


def is_test_usd(w3: Web3, address: str) -> bool:
    """Whether `address` holds the TestUSD this SDK ships: its runtime code is the artifact's,
    byte for byte outside the immutables (zero in the artifact: the EIP-712 domain cache)."""
    code = bytes(w3.eth.get_code(Web3.to_checksum_address(address)))
    ref = bytes.fromhex(str(_artifact()["deployedBytecode"]).removeprefix("0x"))
    return len(code) == len(ref) and all(r in (0, c) for r, c in zip(ref, code, strict=True))


@dataclass(frozen=True)
class Authorization:
    """A signed EIP-3009 `TransferWithAuthorization` (what x402's `exact` EVM scheme carries)."""

    sender: str
    to: str
    value: int
    valid_after: int
    valid_before: int
    nonce: bytes
    signature: bytes


class TestUSD(CompanionContract):
    """A deployed TestUSD, optionally with a signing account."""

    __test__ = False  # not a pytest test class despite the name

    @classmethod
    def abi(cls) -> list[dict[str, Any]]:
        return list(_artifact()["abi"])

    @classmethod
    def bytecode(cls) -> str:
        return str(_artifact()["bytecode"])

    @classmethod
    def deploy(cls, rpc_url_or_w3: str | Web3, key: str | LocalAccount) -> TestUSD:
        token = cls._deploy(rpc_url_or_w3, key)
        assert isinstance(token, TestUSD)
        return token

    @classmethod
    def attach(cls, w3: Web3, address: str, key: str | LocalAccount | None = None) -> TestUSD:
        """The TestUSD at `address`; `NotTestUSD` when the address holds anything else."""
        from .client import load_key

        if not Web3.is_address(address) or not is_test_usd(w3, address):
            raise NotTestUSD(
                f"{address} is not the devnet TestUSD this SDK deploys (`dtrain token deploy`); "
                "only it can be minted by anyone"
            )
        account = load_key(key) if isinstance(key, str) else key
        return cls(w3, address, account)

    def _revert_error(self, exc: Exception) -> DtrainError:
        data = getattr(exc, "data", None)
        if isinstance(data, dict):
            data = data.get("data")
        if isinstance(data, str | bytes) and len(data) >= 4:
            return decode_token_revert(data)
        return TransactionFailed(f"token transaction reverted: {exc}")

    # ------------------------------------------------------------------ reads

    def balance_of(self, account: str) -> int:
        return int(self.contract.functions.balanceOf(Web3.to_checksum_address(account)).call())

    def allowance(self, owner: str, spender: str) -> int:
        fn = self.contract.functions.allowance(
            Web3.to_checksum_address(owner), Web3.to_checksum_address(spender)
        )
        return int(fn.call())

    def authorization_used(self, authorizer: str, nonce: bytes) -> bool:
        fn = self.contract.functions.authorizationState(Web3.to_checksum_address(authorizer), nonce)
        return bool(fn.call())

    # ------------------------------------------------------------------ writes

    def mint(self, to: str, amount: int) -> Receipt:
        return self._transact(self.contract.functions.mint(Web3.to_checksum_address(to), amount))

    def approve(self, spender: str, amount: int) -> Receipt:
        return self._transact(
            self.contract.functions.approve(Web3.to_checksum_address(spender), amount)
        )

    def transfer(self, to: str, amount: int) -> Receipt:
        return self._transact(
            self.contract.functions.transfer(Web3.to_checksum_address(to), amount)
        )

    def transfer_with_authorization(self, auth: Authorization) -> Receipt:
        """Submits someone's signed authorization (the sender of the transaction pays gas)."""
        fn = self.contract.functions.transferWithAuthorization(
            Web3.to_checksum_address(auth.sender),
            Web3.to_checksum_address(auth.to),
            auth.value,
            auth.valid_after,
            auth.valid_before,
            auth.nonce,
            auth.signature,
        )
        return self._transact(fn)

    # ------------------------------------------------------------------ signing

    def sign_authorization(
        self,
        signer: LocalAccount,
        to: str,
        value: int,
        valid_before: int,
        valid_after: int = 0,
        nonce: bytes | None = None,
    ) -> Authorization:
        """`signer`'s EIP-712 `TransferWithAuthorization` of `value` to `to`."""
        nonce = nonce if nonce is not None else secrets.token_bytes(32)
        message = {
            "from": signer.address,
            "to": Web3.to_checksum_address(to),
            "value": value,
            "validAfter": valid_after,
            "validBefore": valid_before,
            "nonce": nonce,
        }
        domain = ("TestUSD", "2", self.chain_id, self.address)
        typed = typed_data("TransferWithAuthorization", _AUTHORIZATION_FIELDS, domain, message)
        signed = signer.sign_message(encode_typed_data(full_message=typed))
        return Authorization(
            sender=signer.address,
            to=message["to"],
            value=value,
            valid_after=valid_after,
            valid_before=valid_before,
            nonce=nonce,
            signature=bytes(signed.signature),
        )

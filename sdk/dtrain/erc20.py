"""The few ERC-20 calls a caller of a token-priced job needs: balance, allowance, decimals,
symbol and approve, against any ERC-20 (a job's payment token is whatever token the blueprint
developer allowed; on a devnet, TestUSD)."""

from __future__ import annotations

from typing import Any

from web3 import Web3
from web3.contract.contract import Contract

from .errors import ConfigError, DtrainError


class InsufficientTokenBalance(DtrainError):
    """The payer holds less of the token than the job's escrow."""


class NotAnERC20(ConfigError):
    """An address that holds no ERC-20 token on this chain (no code, or no decimals/symbol)."""


def _fn(name: str, inputs: list[tuple[str, str]], outputs: list[str], view: bool) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "inputs": [{"name": n, "type": t} for n, t in inputs],
        "outputs": [{"name": "", "type": t} for t in outputs],
        "stateMutability": "view" if view else "nonpayable",
    }


ABI = [
    _fn("balanceOf", [("account", "address")], ["uint256"], True),
    _fn("allowance", [("owner", "address"), ("spender", "address")], ["uint256"], True),
    _fn("decimals", [], ["uint8"], True),
    _fn("symbol", [], ["string"], True),
    _fn("approve", [("spender", "address"), ("amount", "uint256")], ["bool"], False),
]


def contract(w3: Web3, token: str) -> Contract:
    return w3.eth.contract(address=Web3.to_checksum_address(token), abi=ABI)


def format_units(amount: int, decimals: int, symbol: str = "") -> str:
    """`amount` base units as a decimal number of whole tokens ("2.5 TUSD")."""
    whole, frac = divmod(amount, 10**decimals)
    text = str(whole)
    if frac:
        text += "." + str(frac).rjust(decimals, "0").rstrip("0")
    return f"{text} {symbol}".strip()


def parse_units(text: str, decimals: int) -> int:
    """Whole tokens written as a decimal ("2.5") in base units; at most `decimals` places."""
    from .errors import InvalidAmount

    raw = text.strip()
    whole, _, frac = raw.partition(".")
    if not (whole or frac) or not (whole or "0").isdigit() or (frac and not frac.isdigit()):
        raise InvalidAmount(f"not an amount of tokens: {text!r}")
    if len(frac) > decimals:
        raise InvalidAmount(f"{text!r} has more than {decimals} decimal places")
    return int(whole or "0") * 10**decimals + int(frac.ljust(decimals, "0") or "0")


def read_token(w3: Web3, token: str) -> tuple[str, int, str]:
    """(checksum address, decimals, symbol) of the ERC-20 at `token`; `NotAnERC20` when it is
    not an address or holds no ERC-20 on this chain."""
    if not Web3.is_address(token):
        raise NotAnERC20(f"not an address: {token!r}")
    address = Web3.to_checksum_address(token)
    t = contract(w3, address)
    try:
        return address, int(t.functions.decimals().call()), str(t.functions.symbol().call())
    except Exception:  # no code, or not an ERC-20
        raise NotAnERC20(f"{address} is not an ERC-20 token on this chain") from None

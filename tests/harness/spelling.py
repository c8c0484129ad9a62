"""Accounts whose checksum spellings sort in another order than their addresses: a rule that
orders senders by their mixed-case spelling shows with them (fixed devnet accounts hide it)."""

from __future__ import annotations

from eth_account import Account
from eth_utils import keccak


def spelled_apart(n: int) -> list:
    """n fixed accounts, by address (lowercase), whose checksum spellings sort otherwise."""
    for start in range(1000):
        keys = [keccak(b"evidence-%d" % (start + i)) for i in range(n)]
        accounts = sorted((Account.from_key(k) for k in keys), key=lambda a: a.address.lower())
        if [a.address for a in accounts] != sorted(a.address for a in accounts):
            return accounts
    raise AssertionError("no fixed accounts whose spellings sort apart")

"""One exception root for everything the SDK raises, and a Python class per contract error.

Contract custom errors are decoded from revert data into instances of the matching subclass of
`ContractError`, carrying the decoded arguments (`.args_by_name`) and a one-line message built
from the error's `@notice` in the contract (shipped in the artifact's userdoc): a backticked
argument name in the notice stands for that argument's value, so the message is written once,
in Solidity.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from .units import format_eth, format_time


class DtrainError(Exception):
    """Root of every error raised by the SDK and CLI."""


class ConfigError(DtrainError):
    """Missing or inconsistent configuration (no contract address, no key, ...)."""


class InvalidKey(DtrainError):
    """A private key that is not 32 bytes of hex."""


class InvalidAmount(DtrainError):
    """An amount or duration that cannot be read."""


class RpcUnavailable(DtrainError):
    """The RPC endpoint does not answer."""


class WrongChain(DtrainError):
    """The RPC endpoint serves another chain than expected."""


class NoContract(DtrainError):
    """No contract code at the address, or a contract that is not a DistributedTrainingBSM."""


class InsufficientFunds(DtrainError):
    """The sender cannot pay value plus gas."""


class TransactionFailed(DtrainError):
    """A transaction was mined but reverted, or could not be sent."""


class NotServed(DtrainError):
    """Nobody serves a file a command needs (a completed job's final checkpoint): one plain
    line naming who should and what to do; the per-peer dial errors stay in `tried`. The node
    raises its subclass `FinalCheckpointUnavailable` from `dtrain job fetch`."""

    def __init__(self, message: str, tried: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tried = tried


class ContractError(DtrainError):
    """A custom error raised by the contract. Subclasses are generated from the ABI."""

    error_name: ClassVar[str] = ""
    arg_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *values: Any) -> None:
        self.values = values
        self.args_by_name = dict(zip(self.arg_names, values, strict=False))
        super().__init__(self.describe())

    def describe(self) -> str:
        """The error's NatSpec notice with each `argument` replaced by its decoded value;
        arguments the notice does not mention follow in parentheses."""
        fields = {name: _fmt(self.error_name, name, v) for name, v in self.args_by_name.items()}
        template = MESSAGES.get(self.error_name, "")
        if not template:
            inner = ", ".join(f"{k}={v}" for k, v in fields.items())
            return f"{self.error_name}({inner})"
        mentioned: set[str] = set()

        def value_of(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in fields:
                return match.group(0)
            mentioned.add(name)
            return fields[name]

        text = _ARGUMENT.sub(value_of, template)
        rest = ", ".join(f"{k}={v}" for k, v in fields.items() if k not in mentioned)
        return f"{text} ({rest})" if rest else text


_ARGUMENT = re.compile(r"`(\w+)`")

# Arguments in wei, shown in ETH, per error (a name alone is ambiguous: `needed` is seconds in
# UnbondingTooShort, `expected` a member count in ParticipationLength).
AMOUNTS: dict[str, frozenset[str]] = {
    "StakeBelowMinimum": frozenset({"stake", "minStake"}),
    "InsufficientStake": frozenset({"requested", "available"}),
    "TransferFailed": frozenset({"amount"}),
    "PriceBelowAsk": frozenset({"price", "ask"}),
    "WrongEscrow": frozenset({"expected", "sent"}),
    "InsufficientFreeStake": frozenset({"selfStake", "needed"}),
    "StakeBonded": frozenset({"remaining", "needed"}),
    "SeatBondTooLow": frozenset({"seatBond", "minSeatBond"}),
    "WrongChallengeBond": frozenset({"expected", "sent"}),
    "InvalidChallengeParams": frozenset({"challengeBond"}),
    "ApplicantsFull": frozenset({"lightest", "weight"}),
}
# Arguments that are unix times, shown as local time and relative to now, per error.
TIMES: dict[str, frozenset[str]] = {
    "StillUnbonding": frozenset({"unlockAt", "nowTs"}),
    "DeadlinePassed": frozenset({"deadline", "nowTs"}),
    "RevealNotOpen": frozenset({"opensAfter", "nowTs"}),
    "RevealClosed": frozenset({"closedAt", "nowTs"}),
    "OpenTimeoutPending": frozenset({"timeoutAt", "nowTs"}),
    "EpochNotFinalizable": frozenset({"deadline"}),
    "AttestationRequired": frozenset({"expiresAt", "nowTs"}),
    "AttestationExpired": frozenset({"expiresAt", "nowTs"}),
    "StatementExpired": frozenset({"expiresAt", "nowTs"}),
    "StatementNotYetValid": frozenset({"issuedAt", "nowTs"}),
    "StatementBeforeRotation": frozenset({"issuedAt", "validSince"}),
    "ChallengeWindowClosed": frozenset({"closedAt", "nowTs"}),
    "ChallengeWindowOpen": frozenset({"closesAt"}),
    "NotInPhase": frozenset({"opensAt", "closesAt", "nowTs"}),
    "SeatDrawNotDue": frozenset({"drawAt", "nowTs"}),
    "SeatApplicationsClosed": frozenset({"drawAt"}),
}
_STATUS = ["None", "Open", "Running", "Completed", "Failed", "Cancelled"]


def is_amount(error: str, name: str) -> bool:
    """Whether argument `name` of contract error `error` is an amount of wei."""
    return name in AMOUNTS.get(error, ())


def is_time(error: str, name: str) -> bool:
    """Whether argument `name` of contract error `error` is a unix time."""
    return name in TIMES.get(error, ())


def _fmt(error: str, name: str, value: Any) -> str:
    if is_amount(error, name) and isinstance(value, int):
        return format_eth(value)
    if is_time(error, name) and isinstance(value, int):
        if name == "expiresAt" and value == 0:
            return "none"
        if name == "nowTs":  # the reverting block's time, which may lag the wall clock
            return f"{format_time(value).removesuffix(' (now)')} by the chain's clock"
        return format_time(value)
    if name == "status" and isinstance(value, int) and value < len(_STATUS):
        return _STATUS[value]
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, str) and len(value) == 42 and value.startswith("0x"):
        from eth_utils import to_checksum_address

        return to_checksum_address(value)
    return str(value)


def _abi_type(param: dict[str, Any]) -> str:
    if param["type"].startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in param["components"])
        return f"({inner}){param['type'][5:]}"
    return param["type"]


def _message_template(signature: str, artifact: Any = None) -> str:
    """The error's NatSpec as a one-line message template: `@notice` as written in
    contracts/src (a sentence's capital and full stop dropped, for library errors' `@dev`)."""
    from .artifacts import load

    text = (artifact or load()).natspec("errors", signature).removesuffix(".")
    if re.match(r"[A-Z][a-z]", text):
        text = text[0].lower() + text[1:]
    return text


def _build_contract_errors() -> tuple[dict[str, type[ContractError]], dict[str, str]]:
    from .artifacts import VERIFIER, load, load_named

    classes: dict[str, type[ContractError]] = {}
    messages: dict[str, str] = {}
    # The BSM's errors, then the attestation verifier's (they revert through submitAttestation).
    bsm, verifier = load(), load_named(VERIFIER)
    items = [(i, bsm) for i in bsm.abi] + [(i, verifier) for i in verifier.abi]
    for item, artifact in items:
        if item["type"] != "error" or item["name"] in classes:
            continue
        name = item["name"]
        abi_types = tuple(_abi_type(i) for i in item["inputs"])
        messages[name] = _message_template(f"{name}({','.join(abi_types)})", artifact)
        classes[name] = type(
            name,
            (ContractError,),
            {
                "error_name": name,
                "arg_names": tuple(i["name"] for i in item["inputs"]),
                "abi_types": abi_types,
                "__doc__": f"Contract error: {messages[name] or name}",
                "__module__": __name__,
            },
        )
    return classes, messages


# MESSAGES: error name -> its message template, from the contract's NatSpec (see describe).
CONTRACT_ERRORS, MESSAGES = _build_contract_errors()
globals().update(CONTRACT_ERRORS)


def _selector(cls: type[ContractError]) -> bytes:
    from eth_utils import keccak

    sig = f"{cls.error_name}({','.join(cls.abi_types)})"  # type: ignore[attr-defined]
    return keccak(text=sig)[:4]


SELECTORS: dict[bytes, type[ContractError]] = {_selector(c): c for c in CONTRACT_ERRORS.values()}


def decode_revert(data: str | bytes | None) -> DtrainError:
    """The exception for revert data: a ContractError subclass when the selector is known."""
    from eth_abi import decode
    from eth_utils import to_checksum_address

    if isinstance(data, str):
        data = bytes.fromhex(data.removeprefix("0x"))
    if not data or len(data) < 4:
        return TransactionFailed("transaction reverted without a reason")
    cls = SELECTORS.get(data[:4])
    if cls is None:
        return TransactionFailed(f"transaction reverted with unknown data 0x{data.hex()}")
    types = cls.abi_types  # type: ignore[attr-defined]
    try:
        values = decode(list(types), data[4:])
    except Exception:  # malformed revert data from a foreign contract
        return TransactionFailed(f"transaction reverted with malformed {cls.error_name} data")
    # Addresses as web3 gives them everywhere else (events, reads): checksummed.
    values = [
        to_checksum_address(v) if t == "address" else v for t, v in zip(types, values, strict=True)
    ]
    return cls(*values)


def __getattr__(name: str) -> type[ContractError]:
    # Lets type checkers and readers know contract errors are attributes of this module.
    try:
        return CONTRACT_ERRORS[name]
    except KeyError:
        raise AttributeError(name) from None

"""One exception root for everything the SDK raises, and a Python class per contract error.

Contract custom errors are decoded from revert data into instances of the matching subclass of
`ContractError`, carrying the decoded arguments (`.args_by_name`) and a one-line message.
"""

from __future__ import annotations

from typing import Any, ClassVar


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


class ContractError(DtrainError):
    """A custom error raised by the contract. Subclasses are generated from the ABI."""

    error_name: ClassVar[str] = ""
    arg_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, *values: Any) -> None:
        self.values = values
        self.args_by_name = dict(zip(self.arg_names, values, strict=False))
        super().__init__(self.describe())

    def describe(self) -> str:
        template = MESSAGES.get(self.error_name)
        fields = {name: _fmt(name, v) for name, v in self.args_by_name.items()}
        if template is None:
            inner = ", ".join(f"{k}={v}" for k, v in fields.items())
            return f"{self.error_name}({inner})"
        return template.format(**fields)


_AMOUNT_NAMES = {
    "stake",
    "minStake",
    "requested",
    "available",
    "amount",
    "price",
    "ask",
    "expected",
    "sent",
    "declared",
}
_STATUS = ["None", "Open", "Running", "Completed", "Failed", "Cancelled"]


def _fmt(name: str, value: Any) -> str:
    from .units import format_eth

    if name in _AMOUNT_NAMES and isinstance(value, int):
        return format_eth(value)
    if name == "status" and isinstance(value, int) and value < len(_STATUS):
        return _STATUS[value]
    if isinstance(value, bytes):
        return "0x" + value.hex()
    if isinstance(value, str) and len(value) == 42 and value.startswith("0x"):
        from eth_utils import to_checksum_address

        return to_checksum_address(value)
    return str(value)


MESSAGES: dict[str, str] = {
    "BpsSumNot10000": "fee basis points sum to {sum}, not 10000",
    "SlashBpsTooHigh": "slash of {bps} bps above the maximum {max}",
    "BpsTooHigh": "{bps} basis points is more than 100%",
    "InvalidMaxOperators": "maxOperators {maxOperators} outside 1..{cap}",
    "ZeroAddress": "treasury and developer must not be the zero address",
    "ZeroValue": "a zero amount was given where a positive one is required",
    "NotCore": "only the Tangle core {core} may call this (caller {caller})",
    "StakeBelowMinimum": "stake {stake} below minimum {minStake}",
    "AlreadyRegistered": "operator {operator} is already registered",
    "NotRegistered": "{operator} is not a registered operator",
    "InsufficientStake": "cannot take {requested}: only {available} staked",
    "OperatorHasActiveJobs": "operator {operator} is still in {activeJobs} job(s)",
    "NothingUnbonding": "{account} has nothing unbonding with operator {operator}",
    "StillUnbonding": "stake unlocks at {unlockAt} (now {nowTs})",
    "NothingToWithdraw": "{account} has no credit to withdraw",
    "TransferFailed": "sending {amount} to {to} failed",
    "InvalidOperatorRange": "operators min {minOperators} / max {maxOperators} outside 1..{cap}",
    "InvalidSchedule": (
        "invalid schedule: {totalEpochs} epochs of {stepsPerEpoch} steps, sync every {syncInterval}"
    ),
    "InvalidCompression": "invalid compression: top-k {topkPerChunk}, {quantBits}-bit values",
    "InvalidEpochDuration": "epoch duration {duration}s outside 1s..30 days",
    "WrongEscrow": "escrow must be exactly {expected}, got {sent}",
    "UnknownJob": "job {jobId} does not exist",
    "NotJobCaller": "{sender} is not the caller {caller} of this job",
    "JobNotOpen": "job {jobId} is {status}, not open",
    "JobNotRunning": "job {jobId} is {status}, not running",
    "JobFull": "job {jobId} is full: {members} of {maxOperators} operators",
    "AlreadyMember": "{operator} already joined job {jobId}",
    "NotMember": "{operator} is not a member of job {jobId}",
    "AlreadyLeaving": "{operator} is already leaving job {jobId}",
    "PriceBelowAsk": "job price {price} below the operator's ask {ask}",
    "AttestationRequired": "job {jobId} requires a TEE attestation from {operator}",
    "WrongEpoch": "job {jobId} is in epoch {current}, not {given}",
    "DeadlinePassed": "epoch deadline {deadline} has passed (now {nowTs})",
    "AlreadySubmitted": "{operator} already submitted for job {jobId} epoch {epoch}",
    "ZeroCheckpoint": "checkpoint hash must not be zero",
    "ParticipationLength": "participation has {given} entries, the epoch has {expected} members",
    "ParticipationTooHigh": "participation[{index}] = {rounds} exceeds {maxRounds} rounds",
    "EpochNotFinalizable": (
        "job {jobId}: {submitted} of {members} members submitted and the deadline {deadline} "
        "has not passed"
    ),
    "UnknownJobKind": "unknown job kind {job}",
    "UnsupportedPaymentAsset": "payment asset {asset} is not supported (native only)",
    "PaymentMismatch": "declared payment {declared} but sent {sent}",
    "InvalidSlashPercent": "slash percent {percent} outside 1..50",
    "ReentrancyGuardReentrantCall": "reentrant call",
    "SafeCastOverflowedUintDowncast": "value {value} does not fit in {bits} bits",
}


def _abi_type(param: dict[str, Any]) -> str:
    if param["type"].startswith("tuple"):
        inner = ",".join(_abi_type(c) for c in param["components"])
        return f"({inner}){param['type'][5:]}"
    return param["type"]


def _build_contract_errors() -> dict[str, type[ContractError]]:
    from .artifacts import load

    classes: dict[str, type[ContractError]] = {}
    for item in load().abi:
        if item["type"] != "error":
            continue
        name = item["name"]
        doc = MESSAGES.get(name, name)
        classes[name] = type(
            name,
            (ContractError,),
            {
                "error_name": name,
                "arg_names": tuple(i["name"] for i in item["inputs"]),
                "abi_types": tuple(_abi_type(i) for i in item["inputs"]),
                "__doc__": f"Contract error: {doc}",
                "__module__": __name__,
            },
        )
    return classes


CONTRACT_ERRORS: dict[str, type[ContractError]] = _build_contract_errors()
globals().update(CONTRACT_ERRORS)


def _selector(cls: type[ContractError]) -> bytes:
    from eth_utils import keccak

    sig = f"{cls.error_name}({','.join(cls.abi_types)})"  # type: ignore[attr-defined]
    return keccak(text=sig)[:4]


SELECTORS: dict[bytes, type[ContractError]] = {_selector(c): c for c in CONTRACT_ERRORS.values()}


def decode_revert(data: str | bytes | None) -> DtrainError:
    """The exception for revert data: a ContractError subclass when the selector is known."""
    from eth_abi import decode

    if isinstance(data, str):
        data = bytes.fromhex(data.removeprefix("0x"))
    if not data or len(data) < 4:
        return TransactionFailed("transaction reverted without a reason")
    cls = SELECTORS.get(data[:4])
    if cls is None:
        return TransactionFailed(f"transaction reverted with unknown data 0x{data.hex()}")
    try:
        values = decode(list(cls.abi_types), data[4:])  # type: ignore[attr-defined]
    except Exception:  # malformed revert data from a foreign contract
        return TransactionFailed(f"transaction reverted with malformed {cls.error_name} data")
    return cls(*values)


def __getattr__(name: str) -> type[ContractError]:
    # Lets type checkers and readers know contract errors are attributes of this module.
    try:
        return CONTRACT_ERRORS[name]
    except KeyError:
        raise AttributeError(name) from None

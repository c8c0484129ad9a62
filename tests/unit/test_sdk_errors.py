"""Every contract custom error decodes into its own exception class with a readable message."""

from __future__ import annotations

import re

import pytest
from eth_abi import encode
from eth_utils import to_checksum_address
from hypothesis import given
from hypothesis import strategies as st

from dtrain import artifacts, errors
from dtrain.units import format_eth, format_time

OPERATOR = to_checksum_address("0x" + "ab" * 20)


def _sample(abi_type: str, i: int):
    if abi_type == "address":
        return "0x" + f"{i + 1:040x}"
    if abi_type in ("uint8", "uint16"):
        return 7 + i
    if abi_type.startswith("uint"):
        return 10**18 + i if i % 2 == 0 else i + 1
    if abi_type.startswith("bytes"):
        return bytes([i + 1]) * int(abi_type[5:] or 1)
    raise AssertionError(f"no sample for {abi_type}")


ABI_ERRORS = [e for e in artifacts.load().abi if e["type"] == "error"]


@pytest.mark.parametrize("item", ABI_ERRORS, ids=[e["name"] for e in ABI_ERRORS])
def test_every_abi_error_decodes(item) -> None:
    cls = errors.CONTRACT_ERRORS[item["name"]]
    types = [i["type"] for i in item["inputs"]]
    values = [_sample(t, i) for i, t in enumerate(types)]
    data = errors._selector(cls) + encode(types, values)
    exc = errors.decode_revert(data)
    assert type(exc) is cls
    assert isinstance(exc, errors.ContractError) and isinstance(exc, errors.DtrainError)
    assert list(exc.args_by_name) == [i["name"] for i in item["inputs"]]
    message = str(exc)
    assert item["name"] in errors.MESSAGES, "add a /// @notice message to this error"
    assert "{" not in message and "\n" not in message
    for name, value in exc.args_by_name.items():
        if errors.is_amount(item["name"], name):
            assert format_eth(value) in message, (name, message)
        elif errors.is_time(item["name"], name):
            assert _stamp(value) in message, (name, message)
        elif isinstance(value, int) and name != "status":
            assert str(value) in message, (name, message)
            # shown as a number, not as ether (another argument of the error may be ether)
            assert f"{value} wei" not in message, (name, message)
            assert format_eth(value) not in message, (name, message)


def _stamp(ts: int) -> str:
    """A time as messages show it, without the part relative to now."""
    return format_time(ts).split(" (")[0]


def _signature(item) -> str:
    return f"{item['name']}({','.join(errors._abi_type(i) for i in item['inputs'])})"


def test_messages_come_from_the_contracts_natspec() -> None:
    art = artifacts.load()
    libraries = ("ReentrancyGuard", "SafeCast", "SafeERC20")  # OpenZeppelin: @dev only
    ours = [e for e in ABI_ERRORS if not e["name"].startswith(libraries)]
    for item in ours:
        notice = art.userdoc["errors"][_signature(item)][0]["notice"]
        assert errors.MESSAGES[item["name"]] == notice, "add a /// @notice to this error"
        assert f"Contract error: {notice}" == errors.CONTRACT_ERRORS[item["name"]].__doc__
    # Library errors document themselves with @dev only: their text, arguments appended.
    assert str(errors.ReentrancyGuardReentrantCall()) == "unauthorized reentrant call"
    message = str(errors.SafeCastOverflowedUintDowncast(64, 2**70))
    assert message.startswith("value doesn't fit in a uint of 64") and str(2**70) in message


def test_every_event_has_a_notice() -> None:
    art = artifacts.load()
    for item in (e for e in art.abi if e["type"] == "event"):
        assert art.natspec("events", _signature(item)), f"add a /// @notice to {item['name']}"


def test_amounts_in_messages_are_ether() -> None:
    exc = errors.StakeBelowMinimum(5 * 10**17, 10**18)
    assert str(exc) == "stake 0.5 ETH below minimum 1 ETH"
    assert exc.args_by_name == {"stake": 5 * 10**17, "minStake": 10**18}


def test_amount_arguments_name_real_arguments() -> None:
    """Each error AMOUNTS formats as ether exists with those arguments: a renamed argument
    would otherwise silently print as a bare number of wei."""
    by_name = {e["name"]: {i["name"] for i in e["inputs"]} for e in ABI_ERRORS}
    for error, names in errors.AMOUNTS.items():
        assert error in by_name, error
        assert names <= by_name[error], (error, names - by_name[error])


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (
            errors.InsufficientFreeStake(10**18, 11 * 10**17),
            "self-stake 1 ETH cannot bond this seat: 1.1 ETH needed "
            "(minimum stake and every seat bond)",
        ),
        (
            errors.StakeBonded(5 * 10**17, 6 * 10**17),
            "0.5 ETH of self-stake would be left, below the 0.6 ETH bonded in jobs or the "
            "minimum stake",
        ),
        (errors.SeatBondTooLow(10**16, 10**17), "seat bond 0.01 ETH below the minimum 0.1 ETH"),
        # The same argument name is seconds in one error and wei in another...
        (
            errors.UnbondingTooShort(100, 2760),
            "unbonding period 100s is shorter than 2760s "
            "(4 x (startGrace + minEpochDuration + revealWindow + 4 x challengeWindow))",
        ),
        # ...and a count, not an amount, outside WrongEscrow.
        (errors.ParticipationLength(3, 2), "participation has 3 entries, the epoch has 2 members"),
        (
            errors.CommitmentMismatch(4, OPERATOR.lower()),
            f"the revealed vote of {OPERATOR} does not match its commitment in job 4",
        ),
        (
            errors.EpochNotFinalizable(1, 2, 3, 1700000000),
            f"job 1: 2 of 3 members revealed and the reveal deadline {_stamp(1700000000)} (",
        ),
        (
            errors.OpenTimeoutPending(7, 1700000000, 1699999000),
            f"job 7 may be failed by anyone only after {_stamp(1700000000)} (",
        ),
        (
            errors.RevealNotOpen(1700000000, 1699999999),
            f"reveals open after {_stamp(1700000000)} (",
        ),
        (errors.RevealClosed(1700000600, 1700000601), "the reveal window closed at 20"),
        (
            errors.ApplicantsFull(5, 10**18, 10**18),
            "job 5 has 32 applicants and the lightest weighs 1 ETH: an applicant weighing "
            "1 ETH (capped self-stake) must weigh more",
        ),
        (
            errors.SeatDrawNotDue(5, 1700000000, 1699999990),
            f"job 5's seats are drawn at {_stamp(1700000000)} (",
        ),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, errors.ContractError) else "",
)
def test_new_error_messages(exc: errors.ContractError, message: str) -> None:
    assert str(exc).startswith(message), str(exc)


@pytest.mark.parametrize(
    ("exc", "parts"),
    [
        (errors.StillUnbonding(1700000000, 1699999000), ["stake unlocks at", "by the chain's"]),
        (errors.RevealNotOpen(1700000000, 1699999999), ["or once every member committed (now"]),
        (errors.OpenTimeoutPending(7, 1700000000, 1699999000), ["ago) by the chain's clock)"]),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, errors.ContractError) else "",
)
def test_times_in_messages_are_local_and_relative(exc, parts) -> None:
    """Unix times in a message read as local times and relative ones ("3 min ago"), never
    as bare numbers; the reverting block's time says it is the chain's clock."""
    message = str(exc)
    for value in exc.args_by_name.values():
        if value > 10**9:
            assert _stamp(value) in message and str(value) not in message, message
    assert " ago)" in message, message
    for part in parts:
        assert part in message, message


def test_status_names() -> None:
    assert str(errors.JobNotOpen(3, 2)) == "job 3 is Running, not open"


def test_unknown_and_short_revert_data() -> None:
    assert isinstance(errors.decode_revert("0x"), errors.TransactionFailed)
    assert "unknown data 0xdeadbeef" in str(errors.decode_revert("0xdeadbeef"))
    truncated = errors._selector(errors.StakeBelowMinimum) + b"\x00" * 5
    assert "malformed StakeBelowMinimum" in str(errors.decode_revert(truncated))


@given(st.binary(max_size=200))
def test_decode_revert_never_crashes(data: bytes) -> None:
    assert isinstance(errors.decode_revert(data), errors.DtrainError)


@given(st.sampled_from(sorted(errors.SELECTORS)), st.binary(max_size=160))
def test_decode_revert_fuzz_known_selectors(selector: bytes, tail: bytes) -> None:
    exc = errors.decode_revert(selector + tail)
    assert isinstance(exc, errors.DtrainError)
    assert re.fullmatch(r"[^\n{}]+", str(exc))

"""What a user types: amounts with units ("1.5ether", "200gwei", "42wei", "42") and durations
("90s", "2h", "7d"). Each reading error is an `InvalidAmount` naming what it could not read."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation, localcontext

from .errors import InvalidAmount

UNITS = {
    "wei": 0,
    "kwei": 3,
    "mwei": 6,
    "gwei": 9,
    "szabo": 12,
    "finney": 15,
    "ether": 18,
    "eth": 18,
}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")
_DURATION = re.compile(r"^\s*([0-9]+)\s*([smhdw]?)\s*$")
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _read(text: str | int, what: str, pattern: re.Pattern[str], examples: str) -> int | re.Match:
    """A plain non-negative int as it is, else the match of `pattern` on the text."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise InvalidAmount(f"{what} {text} is negative")
        return text
    m = pattern.match(str(text))
    if not m:
        raise InvalidAmount(f"cannot read {what} {text!r}: use e.g. {examples}")
    return m


def parse_amount(text: str | int) -> int:
    """Wei from "1.5ether", "200 gwei", "7wei" or a bare integer number of wei."""
    m = _read(text, "amount", _AMOUNT, "1.5ether, 200gwei or 42 (wei)")
    if isinstance(m, int):
        return m
    number, unit = m.group(1), m.group(2).lower() or "wei"
    if unit not in UNITS:
        raise InvalidAmount(f"unknown unit {unit!r} in {text!r}; known: {', '.join(UNITS)}")
    try:
        with localcontext() as c:
            c.prec = 100
            value = Decimal(number) * (Decimal(10) ** UNITS[unit])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only decimals
        raise InvalidAmount(f"cannot read amount {text!r}") from exc
    if value != value.to_integral_value():
        raise InvalidAmount(f"amount {text!r} is not a whole number of wei")
    if value >= 2**256:
        raise InvalidAmount(f"amount {text!r} does not fit in 256 bits")
    return int(value)


def parse_duration(text: str | int) -> int:
    """Seconds from "90", "90s", "15m", "2h", "7d" or "1w"."""
    m = _read(text, "duration", _DURATION, "90s, 15m, 2h or 7d")
    if isinstance(m, int):
        return m
    return int(m.group(1)) * _SECONDS[m.group(2)]

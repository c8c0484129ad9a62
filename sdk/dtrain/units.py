"""Amounts with units ("1.5ether", "200gwei", "42wei", "42") and durations ("90s", "2h", "7d")."""

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


def format_eth(wei: int) -> str:
    """Readable ether amount: exact, trailing zeros trimmed ("0.5 ETH", "1 wei")."""
    if 0 < abs(wei) < 10**9:
        return f"{wei} wei"
    with localcontext() as c:
        c.prec = 100
        text = f"{Decimal(wei) / Decimal(10**18):f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} ETH"


_SPANS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def format_epoch(epoch: int | None, total: int | None) -> str:
    """ "epoch 1 (epochs 0..2)": epochs count from 0 everywhere (the contract, its events,
    `job fetch --epoch`, the node's logs), with the job's range beside it."""
    e = "?" if epoch is None else str(epoch)
    return f"epoch {e} (epochs 0..{total - 1})" if total else f"epoch {e}"


def format_span(seconds: int) -> str:
    """A duration in its two largest units: "6 d 23 h", "3 min", "45 s", "0 s"."""
    left, parts = abs(int(seconds)), []
    for unit, size in _SPANS:
        n, left = divmod(left, size)
        if n or parts:
            parts.append((n, unit))
        if len(parts) == 2:
            break
    shown = [f"{n} {unit}" for n, unit in parts if n]
    return " ".join(shown) or "0 s"


def format_relative(ts: int, now: float) -> str:
    """`ts` relative to `now`: "in 6 d 23 h", "3 min ago", "now"."""
    delta = int(ts - now)
    if delta == 0:
        return "now"
    return f"in {format_span(delta)}" if delta > 0 else f"{format_span(delta)} ago"


def format_time(ts: int, now: float | None = None) -> str:
    """A unix time as local time with its zone and relative to now (the wall clock):
    "2025-03-01 14:05:09 CET (in 6 d 23 h)"; 0 reads "-" (no such time)."""
    import time

    if not ts:
        return "-"
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ts))
    except (OverflowError, OSError, ValueError):  # beyond what the C library represents
        return f"unix time {ts}"
    return f"{stamp} ({format_relative(ts, time.time() if now is None else now)})"

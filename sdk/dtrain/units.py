"""Readable amounts of ether, durations, epochs and times, as every command prints them.

What a user types is read by `dtrain.inputs` (amounts with units, durations)."""

from __future__ import annotations

from decimal import Decimal, localcontext


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

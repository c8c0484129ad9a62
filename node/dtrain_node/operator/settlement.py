"""The node's line for an epoch it settled: which events the settlement emitted and, when a
member was slashed, how much, why and in which epoch; this node's own slash first, in words."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dtrain.models import SlashReason
from dtrain.units import format_eth


def slashes(events: Iterable[Any]) -> list[dict[str, Any]]:
    """The `Slashed` events of a settlement receipt as JSON-able records (operator, epoch,
    reason, amount in wei)."""
    return [
        {
            "operator": str(e.args["operator"]),
            "epoch": int(e.args["epoch"]),
            "reason": int(e.args["reason"]),
            "amount": int(e.args["amount"]),
        }
        for e in events
        if e.name == "Slashed"
    ]


def _reason(code: int, words: bool = True) -> str:
    """FABRICATION (fabricated checkpoint: ...); just the name without `words`."""
    try:
        reason = SlashReason(code)
    except ValueError:  # a reason this SDK does not know yet
        return f"reason {code}"
    return f"{reason.name} ({reason.explanation})" if words else reason.name


def settled_line(
    epoch: int, events: Sequence[str], slashed: Sequence[Mapping[str, Any]], me: str
) -> str:
    """`epoch N settled: EVENTS`, then this node's slash (amount in ETH, reason, epoch) and the
    other members' slashes, if any. Epochs are counted from 1, as the node prints them."""
    line = f"epoch {epoch + 1} settled: {', '.join(events) or '-'}"
    mine = [s for s in slashed if str(s["operator"]).lower() == me.lower()]
    others = [s for s in slashed if str(s["operator"]).lower() != me.lower()]
    for s in mine:
        line += (
            f"; this node was slashed {format_eth(int(s['amount']))} in epoch "
            f"{int(s['epoch']) + 1} for {_reason(int(s['reason']))}"
        )
    if others:
        n = len(others)
        line += f"; {n} other member{'s' if n > 1 else ''} slashed: " + ", ".join(
            f"{s['operator']} {format_eth(int(s['amount']))} for {_reason(int(s['reason']), False)}"
            for s in others
        )
    return line


def describe_settled(data: Mapping[str, Any], me: str) -> str:
    """The line for the node's `finalized` metric record."""
    return settled_line(
        int(data["epoch"]), list(data.get("events") or []), list(data.get("slashed") or []), me
    )

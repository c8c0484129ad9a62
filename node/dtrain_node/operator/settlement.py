"""The node's line for an epoch it settled: which events the settlement emitted and, when a
member was slashed, how much, why and in which epoch; this node's own slash first, in words."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dtrain.models import SlashReason
from dtrain.units import format_eth

if TYPE_CHECKING:
    from dtrain.client import BSM

SETTLE_EVENTS = ("EpochFinalized", "EpochFailed", "Slashed", "JobAborted")


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


def settled_by_other(
    bsm: BSM, job_id: int, epoch: int, since: int
) -> tuple[list[str], list[dict[str, Any]]] | None:
    """How epoch `epoch` of the job was settled by someone else's transaction, read from the
    chain from block `since`: (the settlement's event names, its slashes), or None when no
    settlement of that epoch is there (the job was cancelled, or the read came too early)."""
    events = [
        e
        for e in bsm.events(from_block=since, names=SETTLE_EVENTS, job_id=job_id)
        if int(e.args.get("epoch", -1)) == epoch
    ]
    if not events:
        return None
    return [e.name for e in events], slashes(events)


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
    other members' slashes, if any. Epochs are counted from 0, as on chain."""
    line = f"epoch {epoch} settled: {', '.join(events) or '-'}"
    mine = [s for s in slashed if str(s["operator"]).lower() == me.lower()]
    others = [s for s in slashed if str(s["operator"]).lower() != me.lower()]
    for s in mine:
        line += (
            f"; this node was slashed {format_eth(int(s['amount']))} in epoch "
            f"{int(s['epoch'])} for {_reason(int(s['reason']))}"
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

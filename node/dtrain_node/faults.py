"""Misbehaviours for demos and tests, explicit and off by default.

Each one is something the chain must catch: a fabricated checkpoint hash (fabrication slash),
no packets from round N on (the quorum's participation shows it: sync-failure slash), a node
that vanishes mid-epoch (dropout slash), packets of random bytes (dropped by every receiver).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Faults:
    fabricate_checkpoint: bool = False
    stop_sync_at_round: int | None = None
    offline_at_round: int | None = None
    garbage_packets: bool = False

    def __post_init__(self) -> None:
        for name in ("stop_sync_at_round", "offline_at_round"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")

    @classmethod
    def parse(cls, items: list[str]) -> Faults:
        """From CLI words: fabricate, garbage, stop-sync=N, offline=N."""
        kw: dict[str, object] = {}
        for item in items:
            name, _, value = item.partition("=")
            if name == "fabricate" and not value:
                kw["fabricate_checkpoint"] = True
            elif name == "garbage" and not value:
                kw["garbage_packets"] = True
            elif name in ("stop-sync", "offline") and value.isdigit():
                kw["stop_sync_at_round" if name == "stop-sync" else "offline_at_round"] = int(value)
            else:
                raise ValueError(
                    f"unknown fault {item!r}; use fabricate, garbage, stop-sync=N or offline=N"
                )
        return cls(**kw)  # type: ignore[arg-type]

    @property
    def any(self) -> bool:
        return self != Faults()

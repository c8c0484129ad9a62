"""Attack packet transforms: what a member with a seat could send instead of its honest packet.

Pure functions of packet bytes (plus context: the previous round's packet, another member's
packet, a seed); every result is a codec-valid packet for the same spec. Used by the tests,
scripts/bench_robust.py and the operator's fault option.

    poison     every tensor's scale exponent at EXP_MAX
    scale=X    the honest update times X (exponents shifted by round(log2 X), clamped to range)
    signflip   the honest update negated
    noise      a random valid packet: random indices, levels and exponents in [EXP_MIN, EXP_MAX]
    stale      last round's packet re-sent (the honest one if there is none)
    copy       another member's packet of this round (the honest one if there is none)
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch

from dtrain_node.optim import codec
from dtrain_node.optim.codec import Spec
from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, LEVELS, Sparse
from dtrain_node.optim.optimizer import DeMo, SyncStats

KINDS = ("poison", "scale", "signflip", "noise", "stale", "copy")


def _map(spec: Spec, pkt: bytes, fn) -> bytes:
    return codec.encode(spec, [fn(i, s) for i, s in enumerate(codec.decode(spec, pkt))])


def poison(spec: Spec, pkt: bytes) -> bytes:
    return _map(spec, pkt, lambda _, s: replace(s, exp=EXP_MAX))


def scale(spec: Spec, pkt: bytes, x: float) -> bytes:
    d = round(math.log2(x))
    return _map(spec, pkt, lambda _, s: replace(s, exp=min(EXP_MAX, max(EXP_MIN, s.exp + d))))


def signflip(spec: Spec, pkt: bytes) -> bytes:
    return _map(spec, pkt, lambda _, s: replace(s, lvl=-s.lvl))


def noise(spec: Spec, pkt: bytes, seed: int = 0) -> bytes:
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor(LEVELS[spec.cfg.bits], dtype=torch.int8)

    def rand(i: int, s: Sparse) -> Sparse:
        nc, ce, k, _, _ = spec.layout[i]
        idx = torch.rand(nc, ce, generator=g).topk(k, dim=1).indices.sort(dim=1).values
        lvl = levels[torch.randint(len(levels), (nc, k), generator=g)]
        return Sparse(idx, lvl, int(torch.randint(EXP_MIN, EXP_MAX + 1, (), generator=g)))

    return _map(spec, pkt, rand)


@dataclass(frozen=True)
class Attack:
    """One attack, parsed from "poison", "scale=100", "signflip", "noise", "stale", "copy"."""

    kind: str
    x: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown attack {self.kind!r}; use one of {', '.join(KINDS)}")
        if not (math.isfinite(self.x) and self.x > 0):
            raise ValueError(f"scale factor must be finite and > 0, got {self.x}")

    @classmethod
    def parse(cls, text: str) -> Attack:
        kind, _, arg = text.partition("=")
        if kind == "scale":
            if not arg:
                raise ValueError("scale needs a factor: scale=X")
            return cls(kind, float(arg))
        if arg:
            raise ValueError(f"attack {kind!r} takes no argument")
        return cls(kind)

    def __str__(self) -> str:
        return f"scale={self.x:g}" if self.kind == "scale" else self.kind

    def __call__(
        self,
        spec: Spec,
        pkt: bytes,
        prev: bytes | None = None,
        other: bytes | None = None,
        seed: int = 0,
    ) -> bytes:
        """The packet to send instead of the honest `pkt`."""
        if self.kind == "poison":
            return poison(spec, pkt)
        if self.kind == "scale":
            return scale(spec, pkt, self.x)
        if self.kind == "signflip":
            return signflip(spec, pkt)
        if self.kind == "noise":
            return noise(spec, pkt, seed)
        if self.kind == "stale":
            return prev if prev is not None else pkt
        return other if other is not None else pkt


@dataclass
class Attacker:
    """Member `who` of an in-process lockstep run sends `attack` instead of its honest packet.

    Keeps what the transforms need: its previous honest packet (stale), the round number
    (noise seed); `other` is the next member's packet of the same round (copy).
    """

    attack: Attack
    who: int
    prev: bytes | None = None
    round: int = 0

    def packets(self, packets: list[tuple[Hashable, bytes]], spec: Spec) -> list:
        """This round's packets with the attacker's replaced."""
        s, honest = packets[self.who]
        other = packets[(self.who + 1) % len(packets)][1]
        bad = self.attack(spec, honest, prev=self.prev, other=other, seed=self.round)
        self.prev, self.round = honest, self.round + 1
        return [*packets[: self.who], (s, bad), *packets[self.who + 1 :]]

    def lockstep(self, opts: Sequence[DeMo]) -> list[SyncStats]:
        """One round: everyone prepares, the attacker swaps its packet, everyone applies."""
        pk = self.packets([(o.sender, o.prepare()) for o in opts], opts[0].spec)
        return [o.apply(pk) for o in opts]

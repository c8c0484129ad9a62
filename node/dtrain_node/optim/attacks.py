"""Attack packet transforms: what a member with a seat could send instead of its honest packet.

Pure functions of packet bytes (plus context: the previous round's packet, another member's
packet, a seed); every result is a codec-valid packet for the same spec. Used by the tests,
scripts/bench_robust.py and the operator's fault option.

    poison     every tensor's scale exponent at EXP_MAX
    scale=X    the honest update times X (exponents shifted by round(log2 X), clamped to range)
    signflip   the honest update negated
    flip=X     the honest update negated and times X
    push=X     `other` negated and times X: in a Coalition every member sends the leader's
               honest update so, one direction f times (the node's fault: another member's
               packet of the previous round)
    noise      a random valid packet: random indices, levels and exponents in [EXP_MIN, EXP_MAX]
    orth=X     a random direction at X times the honest update's scales (random indices and
               levels, the honest exponents shifted by round(log2 X))
    edge=X     the honest update times X with a seeded half of its signs flipped: the honest
               support and scale, about no honest direction
    skew=X     the honest update times X with a seeded quarter of its signs flipped: half
               the honest direction and the rest noise, a shape that keeps a cosine with the
               others' sum above the trust threshold (RobustConfig.cos_trust)
    adapt      (Coalition only) per round, the first of flip, push and edge at x16, x8, x4,
               x2 and x1 that the robust rule would have kept for every colluder on the
               previous round's revealed packets: an attacker that knows the rule
    stale      last round's packet re-sent (the honest one if there is none)
    copy       another member's packet of this round (the honest one if there is none)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace

import torch

from dtrain_node.optim import codec
from dtrain_node.optim.codec import Spec
from dtrain_node.optim.compress import EXP_MAX, EXP_MIN, LEVELS, Sparse
from dtrain_node.optim.optimizer import DeMo, SyncStats
from dtrain_node.optim.robust import RobustConfig, screen

KINDS = (
    "poison",
    "scale",
    "signflip",
    "flip",
    "push",
    "noise",
    "orth",
    "edge",
    "skew",
    "adapt",
    "stale",
    "copy",
)
_SCALED = ("scale", "flip", "push", "orth", "edge", "skew")  # kinds that take a factor
ADAPT_CANDIDATES = tuple((k, x) for k in ("flip", "push", "edge") for x in (16, 8, 4, 2, 1))


def _map(spec: Spec, pkt: bytes, fn) -> bytes:
    return codec.encode(spec, [fn(i, s) for i, s in enumerate(codec.decode(spec, pkt))])


def poison(spec: Spec, pkt: bytes) -> bytes:
    return _map(spec, pkt, lambda _, s: replace(s, exp=EXP_MAX))


def _shifted(exp: int, d: int) -> int:
    return min(EXP_MAX, max(EXP_MIN, exp + d))


def scale(spec: Spec, pkt: bytes, x: float) -> bytes:
    d = round(math.log2(x))
    return _map(spec, pkt, lambda _, s: replace(s, exp=_shifted(s.exp, d)))


def signflip(spec: Spec, pkt: bytes) -> bytes:
    return _map(spec, pkt, lambda _, s: replace(s, lvl=-s.lvl))


def _random(spec: Spec, pkt: bytes, seed: int, exp: Callable[[Sparse, torch.Generator], int]):
    """Random indices and levels in every tensor, each tensor's exponent from `exp`."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.tensor(LEVELS[spec.cfg.bits], dtype=torch.int8)

    def rand(i: int, s: Sparse) -> Sparse:
        nc, ce, k, _, _ = spec.layout[i]
        idx = torch.rand(nc, ce, generator=g).topk(k, dim=1).indices.sort(dim=1).values
        lvl = levels[torch.randint(len(levels), (nc, k), generator=g)]
        return Sparse(idx, lvl, exp(s, g))

    return _map(spec, pkt, rand)


def noise(spec: Spec, pkt: bytes, seed: int = 0) -> bytes:
    return _random(
        spec, pkt, seed, lambda _, g: int(torch.randint(EXP_MIN, EXP_MAX + 1, (), generator=g))
    )


def orth(spec: Spec, pkt: bytes, x: float, seed: int = 0) -> bytes:
    d = round(math.log2(x))
    return _random(spec, pkt, seed, lambda s, _: _shifted(s.exp, d))


def edge(spec: Spec, pkt: bytes, x: float, seed: int = 0, flipped: float = 0.5) -> bytes:
    g = torch.Generator().manual_seed(seed)

    def some(i: int, s: Sparse) -> Sparse:
        flip = torch.rand(s.lvl.shape, generator=g) < flipped
        return replace(s, lvl=torch.where(flip, -s.lvl, s.lvl))

    return scale(spec, _map(spec, pkt, some), x)


@dataclass(frozen=True)
class Attack:
    """One attack, parsed from "poison", "scale=100", "signflip", "flip=4", "push=4", "noise",
    "stale", "copy"."""

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
        if kind in _SCALED:
            if not arg:
                raise ValueError(f"{kind} needs a factor: {kind}=X")
            return cls(kind, float(arg))
        if arg:
            raise ValueError(f"attack {kind!r} takes no argument")
        return cls(kind)

    def __str__(self) -> str:
        return f"{self.kind}={self.x:g}" if self.kind in _SCALED else self.kind

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
        if self.kind == "flip":
            return scale(spec, signflip(spec, pkt), self.x)
        if self.kind == "push":
            return scale(spec, signflip(spec, other if other is not None else pkt), self.x)
        if self.kind == "noise":
            return noise(spec, pkt, seed)
        if self.kind == "orth":
            return orth(spec, pkt, self.x, seed)
        if self.kind == "edge":
            return edge(spec, pkt, self.x, seed)
        if self.kind == "skew":
            return edge(spec, pkt, self.x, seed, flipped=0.25)
        if self.kind == "adapt":
            raise ValueError("adapt is a coalition's attack: it needs every packet of the round")
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


@dataclass
class Coalition:
    """Members `who` of an in-process lockstep run collude: each sends `attack` instead of its
    honest packet. For `push` every member sends the same packet, built from the first
    member's (the leader's) honest packet; `copy` copies the first honest member's packet."""

    attack: Attack
    who: tuple[int, ...]
    prev: dict[int, bytes] = field(default_factory=dict)
    round: int = 0
    last: list[tuple[Hashable, bytes]] | None = None  # adapt: the previous round's packets

    def packets(self, packets: list[tuple[Hashable, bytes]], spec: Spec) -> list:
        """This round's packets with every coalition member's replaced."""
        if self.attack.kind == "adapt":
            return self._adapt(packets, spec)
        out = list(packets)
        leader = packets[self.who[0]][1]
        honest = next((p for w, (_, p) in enumerate(packets) if w not in self.who), leader)
        for w in self.who:
            s, mine = packets[w]
            other = leader if self.attack.kind == "push" else honest
            seed = 1000 * self.round + w
            out[w] = (s, self.attack(spec, mine, prev=self.prev.get(w), other=other, seed=seed))
            self.prev[w] = mine
        self.round += 1
        return out

    def _adapt(self, packets: list[tuple[Hashable, bytes]], spec: Spec) -> list:
        """The first candidate (flip, then push, then edge; the largest factor first) that the
        rule would have kept for every colluder on the previous round's revealed packets: the
        round's own packets are committed before any is revealed (docs/protocol.md 4.2)."""
        last, self.last = self.last, list(packets)
        self.round += 1
        if last is None:
            return list(packets)
        bad = {packets[w][0] for w in self.who}
        for kind, x in ADAPT_CANDIDATES:
            then = Coalition(Attack(kind, float(x)), self.who, round=self.round).packets(last, spec)
            decoded = [(s, codec.decode(spec, p)) for s, p in then]
            if not bad & set(screen(spec, decoded, RobustConfig())[1]):
                atk = Coalition(Attack(kind, float(x)), self.who, prev=self.prev, round=self.round)
                return atk.packets(packets, spec)
        return list(packets)

"""Misbehaviours for demos and tests, explicit and off by default.

Each one is something the chain must catch: a fabricated checkpoint hash, committed and
revealed like an honest one (fabrication slash; `collude`: the same fabricated hash from every
colluding member, a quorum when they hold 2/3 of the seats, which an honest member's challenge
overturns, and which no colluder challenges; `unworkable`: the UNWORKABLE vote after training,
a caller's sybils getting its escrow back; `doctor`: a challenge of an honest quorum with a
transcript file that leaves the other members' packets out, which the referees re-execute
united with the files the members post, so the challenger loses its bond; `inject`: a challenge
of an honest quorum with a file in which one of the challenger's packets is replaced by one it
signs after the epoch, which the referees set aside because a certified voter's own file leads
to the certified vote), a commitment never revealed (dropout slash), no packets from round N on
(the quorum's participation shows it: sync-failure slash), a node that vanishes mid-epoch
(dropout slash), packets of random bytes (dropped by every receiver), a codec-valid attack
packet (`attack=KIND`, dtrain_node.optim.attacks: the honest members' robust aggregation rule
excludes it, so they do not count us as participating and the quorum's participation slashes us
for sync failure).

The epoch trainer runs the honest behaviour and passes its results through the active `Faults`
(`before_round`, `packet`, `digest`), which replace them when a fault applies; `Faults()` passes
everything through unchanged. `packet` also gets the round's `RoundContext` (the optimizer's
packet spec, our honest packet and the packets collected in the previous round), which the
attacks need.

`attack=copy` re-sends another member's packet: the transport publishes our packet before it
delivers the round's packets, so the copy is taken from the previous round's collected packets
(the first other member's, in canonical order), published under our own signature like any
packet of ours; round 0 of an attempt (and the first round after a restart) has none and
sends the honest packet. `attack=stale` likewise re-sends our honest packet of the previous
round.

`equivocate=N` signs and publishes a second commitment, to another packet, right after
revealing in round N of every epoch (the gossip transport does it; `epoch=` does not limit it):
the members' transcript holds both, and they post the proof on-chain.

`withhold=N` commits its packet in round N of every epoch and never reveals it, to anyone (the
gossip transport does it): the members' transcript leaves the packet out everywhere.

`late=N` commits its packet in round N of every epoch and reveals it late and to one member
only: never by gossip, through its sync server once its own round deadline passed, to the first
member that asks (the gossip transport does it). The members that did not get it fetch it from
that member, or the transcript leaves it out everywhere; either way they end with one
transcript.

`ahead` skips training and closes every round at once (no waiting for anyone): the node
commits and reveals round r as soon as round r - 1 ended, before the honest members begin it.
With `attack=poison` it is the member that tries to own each round with a poisoned packet; the
members apply a round only with what the canonical transcript holds, never one early reveal.

`stale` is the free-rider: it trains round 0 of each attempt and from then on skips the inner
steps and re-sends that first packet every round (still committing, as it must, to the private
state it holds). Its packets are valid and near honest scale, so aggregation cannot tell; a
replay spot check of any later round (docs/protocol.md 4.6) gives another packet.

`shun=ADDR` leaves member ADDR's packets out of our transcript file after the epoch and votes
what that file re-executes to, naming it: the vote of a coalition that claims it never got an
honest member's packets (of a job's first epoch). Its vote is consistent with its own file,
and so is the honest member's with its own: the referees of a challenge uphold the coalition's
vote, and pay both sides.

`stall` names a transcript file nobody has in its vote, and stalls every file a peer asks it
for: it answers that it has it and then sends nothing (each such file costs whoever asks it
the fetch's idle timeout). With `collude`, a coalition that tries to run a challenge's referees
out of time (they fetch with one deadline for all files, asking a file's namers first).

`drip` serves each private state a checker or a referee asks for (docs/protocol.md 4.6) at one
byte per 55 s: never idle long enough for a fetch's idle timeout, and never done. The checker
and the referees ask within the state's deadline; the referees catch it as withholding.

`forge-claim` signs, with the product's own claim code, a "withheld" claim about another
member's packet in a round whose check was not ours, and challenges the certified vote with it:
the referees recompute the round's assignment and refuse it before fetching anything.

`slow=X` is no misbehaviour: an honest machine X times slower than it is (every round's inner
steps take X times as long). The chain must not punish it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from web3 import Web3

from dtrain import UNWORKABLE
from dtrain_node.optim.attacks import KINDS, Attack
from dtrain_node.optim.codec import Spec

USAGE = (
    "fabricate, collude, unworkable, doctor, inject, no-reveal, garbage, stop-sync=N, offline=N, "
    "attack=KIND (KIND: poison, scale=X, signflip, noise, stale, copy), ahead, stale, slow=X, "
    "equivocate=N, withhold=N, late=N, shun=ADDR, stall, drip, forge-claim, "
    "epoch=E, once"
)

# `ahead`: how long its rounds wait for the others, and for their agreement (they do not)
AHEAD_WAIT_S = 0.1


def _number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def _vanish(code: int) -> NoReturn:
    os._exit(code)  # like a crashed machine: no cleanup, no goodbye


@dataclass(frozen=True)
class RoundContext:
    """What an attack packet may be built from in one round (the trainer fills it in
    honestly every round; only `Faults.packet` reads it)."""

    spec: Spec  # the optimizer's packet spec
    me: str  # our address
    prev_honest: bytes | None = None  # our honest packet of the previous round
    prev_packets: Sequence[tuple[Any, bytes]] = ()  # the previous round's collected packets
    first_sent: bytes | None = None  # the first packet we sent in this attempt (run)

    def other(self) -> bytes | None:
        """Another member's packet of the previous round (the first in canonical order)."""
        me = self.me.lower()
        return next((p for s, p in self.prev_packets if str(s).lower() != me and p), None)


def _attack(value: str) -> Attack:
    kinds = ", ".join(k for k in KINDS if k != "adapt")
    try:
        attack = Attack.parse(value)
    except ValueError as exc:
        raise ValueError(f"bad attack {value!r}: {exc}; use one of {kinds}") from None
    if attack.kind == "adapt":  # it needs every packet of the round before sending its own
        raise ValueError(f"bad attack {value!r}: a benchmark coalition's; use one of {kinds}")
    return attack


@dataclass(frozen=True)
class Faults:
    """`epoch` limits every fault to that epoch (None: all epochs)."""

    fabricate_checkpoint: bool = False
    collude: bool = False  # fabricate the checkpoint every colluding member fabricates
    vote_unworkable: bool = False  # train, then vote UNWORKABLE (to get a caller its escrow back)
    doctor: bool = False  # challenge the quorum with a transcript of our own packets only
    inject: bool = False  # challenge it with one of our packets re-signed after the epoch
    withhold_reveal: bool = False  # commit, then never reveal
    stop_sync_at_round: int | None = None
    offline_at_round: int | None = None
    garbage_packets: bool = False
    attack: Attack | None = None  # send this codec-valid attack packet instead of ours
    epoch: int | None = None
    first_attempt_only: bool = False  # a retried epoch (no quorum) runs honestly
    slow: float = 1.0  # inner steps take this many times as long
    equivocate_rounds: tuple[int, ...] = ()
    withhold_rounds: tuple[int, ...] = ()
    late_rounds: tuple[int, ...] = ()  # reveal to one member only, by sync
    ahead: bool = False  # no inner steps, no waiting: every round committed before the others
    stale: bool = False  # no inner steps after the first round: its first packet every round
    shun: str | None = None  # vote what our transcript leads to without this member's packets
    stall: bool = False  # name a file nobody has; answer file requests and send nothing
    drip: bool = False  # serve our private states one byte per 55 s
    forge_claim: bool = False  # claim "withheld" about a member's round not ours to check

    def __post_init__(self) -> None:
        if not 1.0 <= self.slow <= 100.0:
            raise ValueError(f"slow must be in [1, 100], got {self.slow}")
        for name in ("stop_sync_at_round", "offline_at_round", "epoch"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0, got {v}")

    @property
    def honest(self) -> bool:
        """No fault but `slow` (a slow machine is no misbehaviour). Only an honest node gives
        up an epoch it cannot make; a faulty one stays to be judged, as the attacks it stands
        for would (docs/node.md)."""
        return dataclasses.replace(self, slow=1.0, epoch=None, first_attempt_only=False) == Faults()

    def active(self, epoch: int, retry: bool = False) -> Faults:
        """The faults that apply in `epoch` (`retry`: not its first attempt)."""
        if (self.epoch is not None and self.epoch != epoch) or (retry and self.first_attempt_only):
            return Faults()
        return self

    @classmethod
    def parse(cls, items: list[str]) -> Faults:
        """From CLI words: fabricate, no-reveal, garbage, stop-sync=N, offline=N, attack=KIND,
        epoch=E, once (`attack=scale=100`: everything after the first `=` is the attack)."""
        kw: dict[str, object] = {}
        for item in items:
            name, _, value = item.partition("=")
            if name == "attack" and value:
                kw["attack"] = _attack(value)
            elif name == "fabricate" and not value:
                kw["fabricate_checkpoint"] = True
            elif name == "collude" and not value:
                kw["collude"] = True
            elif name == "unworkable" and not value:
                kw["vote_unworkable"] = True
            elif name == "doctor" and not value:
                kw["doctor"] = True
            elif name == "inject" and not value:
                kw["inject"] = True
            elif name == "no-reveal" and not value:
                kw["withhold_reveal"] = True
            elif name == "garbage" and not value:
                kw["garbage_packets"] = True
            elif name == "ahead" and not value:
                kw["ahead"] = True
            elif name == "stale" and not value:
                kw["stale"] = True
            elif name == "stall" and not value:
                kw["stall"] = True
            elif name == "drip" and not value:
                kw["drip"] = True
            elif name == "forge-claim" and not value:
                kw["forge_claim"] = True
            elif name == "once" and not value:
                kw["first_attempt_only"] = True
            elif name == "equivocate" and value.isdigit():
                kw["equivocate_rounds"] = (int(value),)
            elif name == "withhold" and value.isdigit():
                kw["withhold_rounds"] = (int(value),)
            elif name == "late" and value.isdigit():
                kw["late_rounds"] = (int(value),)
            elif name == "shun" and Web3.is_address(value):
                kw["shun"] = Web3.to_checksum_address(value)
            elif name == "slow" and _number(value):
                kw["slow"] = float(value)
            elif name in ("stop-sync", "offline", "epoch") and value.isdigit():
                field_name = {
                    "stop-sync": "stop_sync_at_round",
                    "offline": "offline_at_round",
                    "epoch": "epoch",
                }[name]
                kw[field_name] = int(value)
            else:
                raise ValueError(f"unknown fault {item!r}; use {USAGE}")
        return cls(**kw)  # type: ignore[arg-type]

    @property
    def any(self) -> bool:
        return self != Faults()

    # -- wrappers around the honest behaviour (call them on the `active` faults) -------------

    def before_round(
        self,
        rnd: int,
        metric: Callable[..., Any],
        vanish: Callable[[int], Any] = _vanish,
    ) -> None:
        """Hook before each round: `offline=N` vanishes mid-epoch at round N."""
        if self.offline_at_round is not None and rnd >= self.offline_at_round:
            metric("fault_offline", round=rnd)
            vanish(3)

    def skips_compute(self, ctx: RoundContext | None) -> bool:
        """No inner steps this round: `ahead`, or `stale` once it sent its first packet."""
        return self.ahead or (self.stale and ctx is not None and ctx.first_sent is not None)

    def throttle(self, compute_s: float, sleep: Callable[[float], Any] = time.sleep) -> None:
        """`slow=X`: after inner steps that took `compute_s`, wait so they took X times as long."""
        if self.slow > 1.0:
            sleep((self.slow - 1.0) * compute_s)

    def packet(self, rnd: int, honest: bytes, ctx: RoundContext | None = None) -> bytes:
        """The packet published in round `rnd`: `stop-sync=N` publishes nothing from round N,
        `garbage` publishes random bytes of the honest packet's length, `attack=KIND` the
        attack packet built from the honest one and `ctx`."""
        packet = honest
        if self.attack is not None:
            if ctx is None:
                raise ValueError("an attack needs the round's context")
            packet = self.attack(
                ctx.spec, honest, prev=ctx.prev_honest, other=ctx.other(), seed=rnd
            )
        if self.stale and ctx is not None and ctx.first_sent:
            packet = ctx.first_sent
        if self.stop_sync_at_round is not None and rnd >= self.stop_sync_at_round:
            packet = b""  # publish nothing; keep training on our own
        if self.garbage_packets:
            packet = os.urandom(len(packet))
        return packet

    @property
    def reveals(self) -> bool:
        """Does the node reveal its committed vote? (`no-reveal`: never.)"""
        return not self.withhold_reveal

    def digest(self, honest: bytes, sender: str, attempt: int) -> bytes:
        """The checkpoint hash committed and revealed: `fabricate` makes one up, `collude`
        makes up the one every colluding member of the attempt votes (a fabricated quorum),
        `unworkable` votes UNWORKABLE after training."""
        if self.vote_unworkable:
            return UNWORKABLE
        if self.collude:
            return Web3.keccak(text=f"fabricated by the coalition:{attempt}")
        if self.fabricate_checkpoint:
            return Web3.keccak(text=f"fabricated:{sender}:{attempt}")
        return honest

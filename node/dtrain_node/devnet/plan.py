"""Who does what in the demo story, decided once from the options (pure, no chain).

Operators are numbered by their index `i` (node name `op{i+1}`, account `i + 1` of the
devnet): the first `--operators` start with the job, one more joins at the first epoch
boundary unless `--no-late-join` (every epoch needs the job's min_operators members, so the
story asks for the fewest its epochs will have, see `Plan.min_operators`); unless
`--no-faults`, op2 fabricates its checkpoint hash in epoch 1, op3 goes offline before the last
round of epoch 2 and op4 sends poisoned packets (`--fault attack=poison`) in epoch 3, so the
others' robust aggregation excludes it every round and the quorum's participation slashes it
for sync failure (each only if it starts with the job and the job has that epoch).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

FABRICATE_EPOCH = 1
OFFLINE_EPOCH = 2
POISON_EPOCH = 3


def node_name(i: int) -> str:
    return f"op{i + 1}"


@dataclass(frozen=True)
class Plan:
    starters: tuple[int, ...]  # start with the job
    late: int | None = None  # joins at the first epoch boundary
    fabricator: int | None = None  # submits a fabricated checkpoint hash
    offline: int | None = None  # vanishes mid-epoch
    offline_round: int = 0  # the round it vanishes before
    poisoner: int | None = None  # sends poisoned packets in POISON_EPOCH

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> Plan:
        return make_plan(
            a.operators,
            a.steps // a.sync,
            faults=not a.no_faults,
            late_join=not a.no_late_join,
            epochs=a.epochs,
        )

    @property
    def operators(self) -> tuple[int, ...]:
        """Every operator of the story (each registers before the job is submitted)."""
        return self.starters if self.late is None else (*self.starters, self.late)

    def min_operators(self, epochs: int) -> int:
        """The job's min_operators: every epoch starts only with that many members, so it is
        the fewest members any epoch of the story has (at least 2). The late joiner comes in
        after epoch 0 and members leave only when slashed (the fabricator after
        FABRICATE_EPOCH, the offline one after OFFLINE_EPOCH, the poisoner after POISON_EPOCH).
        Epoch 0 starts with that many of the starters (the first to join); the others join at
        its boundary with the late joiner."""
        members = len(self.starters) + (self.late is not None)
        slashed = (
            (self.fabricator, FABRICATE_EPOCH),
            (self.offline, OFFLINE_EPOCH),
            (self.poisoner, POISON_EPOCH),
        )
        fewest = len(self.starters)
        for e in range(1, epochs):
            gone = sum(1 for who, at in slashed if who is not None and at < e)
            fewest = min(fewest, members - gone)
        return max(2, fewest)

    def faults(self, i: int) -> list[str]:
        """The `dtrain node run --fault` options operator `i` is started with."""
        if i == self.fabricator:
            return ["fabricate", f"epoch={FABRICATE_EPOCH}"]
        if i == self.offline:
            return [f"offline={self.offline_round}", f"epoch={OFFLINE_EPOCH}"]
        if i == self.poisoner:
            return ["attack=poison", f"epoch={POISON_EPOCH}"]
        return []


def make_plan(
    operators: int,
    rounds_per_epoch: int,
    faults: bool = True,
    late_join: bool = True,
    epochs: int = POISON_EPOCH + 1,
) -> Plan:
    starters = tuple(range(operators))
    late = operators if late_join else None
    if not faults:
        return Plan(starters, late)

    def role(i: int, epoch: int) -> int | None:
        return i if operators > i and epochs > epoch else None

    return Plan(
        starters,
        late,
        fabricator=role(1, FABRICATE_EPOCH),
        offline=role(2, OFFLINE_EPOCH),
        offline_round=rounds_per_epoch - 1,
        poisoner=role(3, POISON_EPOCH),
    )

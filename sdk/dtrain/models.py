"""Typed read models of the contract's state and the job spec a caller submits.

Structs cross the ABI by field name: a model field is the snake_case of a struct component
(`pricePerOperatorEpoch` -> `price_per_operator_epoch`), reads map decoded components by
their ABI names and writes order values by the shipped ABI's component order. A struct whose
fields no longer match its model raises instead of shifting values into the wrong fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import astuple, dataclass, field, fields
from enum import IntEnum
from functools import cache
from typing import Any, ClassVar, Self, TypeVar

ZERO32 = b"\0" * 32
T = TypeVar("T")


def snake_case(name: str) -> str:
    """`minPricePerEpoch` -> `min_price_per_epoch`."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


@cache
def struct_components(struct: str) -> tuple[str, ...]:
    """Component names, in ABI order, of the BSM's `<struct>` in the shipped ABI."""
    from .artifacts import load

    # Declared in IDistributedTrainingBSMTypes (or any interface the BSM's ABI names).
    wanted = f".{struct}"
    for item in load().abi:
        for param in [*item.get("inputs", []), *item.get("outputs", [])]:
            internal = param.get("internalType", "")
            if internal.startswith("struct IDistributedTrainingBSM") and internal.endswith(wanted):
                return tuple(c["name"] for c in param["components"])
    raise KeyError(f"no struct {struct} in the ABI")


def _check_fields(cls: type, names: Iterable[str], extra: Iterable[str] = ()) -> None:
    expected = {f.name for f in fields(cls)} - set(extra)
    got = {snake_case(n) for n in names}
    if got != expected:
        raise TypeError(
            f"{cls.__name__} does not match the contract struct: "
            f"missing {sorted(expected - got)}, unknown {sorted(got - expected)}"
        )


def from_struct(
    cls: type[T],
    struct: Mapping[str, Any],
    convert: Mapping[str, Callable[[Any], Any]] | None = None,
    **extra: Any,
) -> T:
    """A model from a struct decoded by component name; `convert` maps field -> type, `extra`
    gives the model's fields that are not in the struct."""
    _check_fields(cls, struct, extra)
    values = {snake_case(k): v for k, v in struct.items()}
    for name, conv in (convert or {}).items():
        values[name] = conv(values[name])
    return cls(**values, **extra)


def to_struct(model: Any, struct: str) -> tuple:
    """A model's values in the ABI's component order of `struct` (enums as plain ints)."""
    names = struct_components(struct)
    _check_fields(type(model), names)
    values = (getattr(model, snake_case(n)) for n in names)
    return tuple(int(v) if isinstance(v, IntEnum) else v for v in values)


class Decoded:
    """A read model decoded from a contract struct by component name (`from_struct`).

    `CONVERT` maps a field to the type its raw value becomes (enums, bytes)."""

    CONVERT: ClassVar[Mapping[str, Callable[[Any], Any]]] = {}

    @classmethod
    def from_struct(cls, struct: Mapping[str, Any]) -> Self:
        return from_struct(cls, struct, cls.CONVERT)


class Method(IntEnum):
    CPT = 0
    SFT = 1
    DPO = 2
    GRPO = 3


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    RUNNING = 2
    COMPLETED = 3
    FAILED = 4
    CANCELLED = 5

    @property
    def is_ended(self) -> bool:
        """Completed, failed or cancelled: nothing more happens to the job."""
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class SlashReason(IntEnum):
    """Why stake was slashed; `label` is how people read it ("sync failure")."""

    FABRICATION = 0
    DROPOUT = 1
    SYNC_FAILURE = 2
    EXTERNAL = 3
    EQUIVOCATION = 4  # signed two packets for one round (reportEquivocation)
    WITHHELD_REVEAL = 5  # committed and never revealed: the fabrication rate
    WRONG_VERDICT = 6  # a referee off the referees' majority (or that withheld its verdict)
    FAILED_REPLAY = 7  # a round replayed from its committed state gave another packet

    @property
    def label(self) -> str:
        return self.name.lower().replace("_", " ")

    @property
    def meaning(self) -> str:
        """What the member did, in a few words ("fabricated checkpoint")."""
        return _SLASH_MEANINGS[self][0]

    @property
    def explanation(self) -> str:
        """`meaning` and how the contract knew it."""
        return ": ".join(_SLASH_MEANINGS[self])


_SLASH_MEANINGS = {
    SlashReason.FABRICATION: ("fabricated checkpoint", "its vote was not the quorum's"),
    SlashReason.DROPOUT: ("offline mid-epoch", "no vote committed and revealed in time"),
    SlashReason.SYNC_FAILURE: ("failed to sync", "the quorum saw it miss its syncs"),
    SlashReason.EXTERNAL: ("external", "slashed through the blueprint's core"),
    SlashReason.EQUIVOCATION: ("equivocated", "signed two different packets for one round"),
    SlashReason.WITHHELD_REVEAL: (
        "withheld its reveal",
        "committed a vote and never revealed it",
    ),
    SlashReason.WRONG_VERDICT: (
        "wrong verdict",
        "as a referee it revealed a verdict other than the referees' majority, or none",
    ),
    SlashReason.FAILED_REPLAY: (
        "failed a replay check",
        "a challenge's referees replayed its round from its committed state and got another packet",
    ),
}


@dataclass(frozen=True)
class Params(Decoded):
    """Deploy-time parameters (basis points sum to 10000; slash bps at most 5000)."""

    treasury: str
    developer: str
    operator_bps: int = 4000
    staker_bps: int = 2000
    protocol_bps: int = 2000
    developer_bps: int = 2000
    fabrication_slash_bps: int = 1000
    dropout_slash_bps: int = 500
    sync_fail_slash_bps: int = 200
    reporter_bounty_bps: int = 1000
    sync_threshold_bps: int = 5000
    # Paid to each member whose UNWORKABLE vote reached quorum (bps of the job's price).
    unworkable_comp_bps: int = 1000
    max_operators: int = 32
    max_failed_epochs: int = 3
    # Referees drawn to re-execute a challenged epoch (odd).
    referee_count: int = 3
    unbonding_period: int = 7 * 86400
    # An epoch spans at most unbonding_period / 4 (start_grace + epoch_duration + reveal_window).
    min_epoch_duration: int = 60
    start_grace: int = 30
    reveal_window: int = 600
    open_timeout: int = 86400
    # Seconds after an epoch's last reveal in which its certified vote may be challenged; each
    # phase of a challenge (referees apply, commit, reveal) lasts as long. 0: no challenges.
    challenge_window: int = 600
    # Seconds a job's seats stay open to applications once min_operators applied; then
    # `draw_seats` draws max_operators of them by capped self-stake. 0: first joiners.
    seat_draw_window: int = 60
    max_reporter_bounty: int = 10**16
    min_stake: int = 10**18
    min_seat_bond: int = 10**17
    # Ether a challenger bonds, and self-stake each referee bonds while the challenge is open.
    challenge_bond: int = 10**17
    core: str = "0x0000000000000000000000000000000000000000"

    def as_tuple(self) -> tuple:
        """The constructor's `Params` argument."""
        return to_struct(self, "Params")


# Coefficients in one 64x64 DCT chunk: the most a job's top-k per chunk can keep.
TOPK_MAX = 64 * 64


# Coverage the default top-k aims for in each epoch: top-k / 4096 x syncs per epoch, how many
# times over a member sends each coefficient of a chunk before its error feedback starts again
# (every epoch builds a fresh DeMo). docs/demo-optimizer.md, "Coverage".
COVERAGE_TARGET = 1.0


def default_topk(max_operators: int, syncs_per_epoch: int = 0) -> int:
    """DeMo coefficients per 64x64 DCT chunk for a job of up to `max_operators` members that
    syncs `syncs_per_epoch` times an epoch (0: unknown, the member floor alone).

    The larger of a floor by member count and the k at which an epoch reaches
    COVERAGE_TARGET. The floor, measured in docs/benchmarks.md (Scaling): k = 4 keeps 93% of
    data-parallel's speedup at 4 members; at 8 members k = 4 stops gaining over 4 members and
    k = 6 does. The coverage term is for short epochs, where the floor leaves most
    coefficients never sent: at 100 syncs k = 4 covers 0.1 of each chunk and four members
    trained worse than one worker alone (docs/benchmarks.md, "Compression: coverage"). A long
    epoch keeps the floor and its 1,000x-and-more less upload than a bf16 ring.
    """
    if max_operators < 1:
        raise ValueError(f"max_operators must be >= 1, got {max_operators}")
    if syncs_per_epoch < 0:
        raise ValueError(f"syncs_per_epoch must be >= 0, got {syncs_per_epoch}")
    floor = 4 if max_operators <= 4 else 6
    if syncs_per_epoch == 0:
        return floor
    return min(TOPK_MAX, max(floor, math.ceil(COVERAGE_TARGET * TOPK_MAX / syncs_per_epoch)))


def coverage(topk_per_chunk: int, syncs_per_epoch: int) -> float:
    """How many times over an epoch's syncs send each coefficient of a 64x64 chunk."""
    return topk_per_chunk * syncs_per_epoch / TOPK_MAX


@dataclass(frozen=True)
class JobSpec(Decoded):
    """What a caller pays for. Escrow = price x max_operators x total_epochs.

    `seat_bond` is the self-stake each member bonds for its seat; 0 (the default) stands for the
    deployment's `min_seat_bond`, which `BSM.create_job` fills in from `params()` (a job read
    back always holds the bond the contract stored). `recipe_hash` / `recipe_uri` pin the
    training recipe (`dtrain.recipe.Recipe`); a zero hash means the reference defaults."""

    CONVERT: ClassVar = {
        "method": Method,
        "model_hash": bytes,
        "dataset_hash": bytes,
        "recipe_hash": bytes,
    }

    price_per_operator_epoch: int
    total_epochs: int = 1
    steps_per_epoch: int = 100
    sync_interval: int = 2  # the measured default (docs/benchmarks.md, Scaling)
    min_operators: int = 2
    max_operators: int = 3
    method: Method = Method.CPT
    model_hash: bytes = ZERO32
    model_uri: str = ""
    dataset_hash: bytes = ZERO32
    dataset_uri: str = ""
    topk_per_chunk: int = 4
    quant_bits: int = 1
    epoch_duration: int = 3600
    tee_required: bool = False
    seat_bond: int = 0
    recipe_hash: bytes = ZERO32  # sha256 of the recipe's canonical form; zero: the default
    recipe_uri: str = ""  # where operators read the recipe (TOML; dtrain.recipe)

    @property
    def escrow(self) -> int:
        return self.price_per_operator_epoch * self.max_operators * self.total_epochs

    @property
    def rounds_per_epoch(self) -> int:
        return self.steps_per_epoch // self.sync_interval

    def as_tuple(self) -> tuple:
        """The `createJob` argument."""
        return to_struct(self, "JobSpec")


@dataclass(frozen=True)
class JobState(Decoded):
    CONVERT: ClassVar = {"status": JobStatus, "checkpoint": bytes}

    caller: str
    status: JobStatus
    epoch: int
    failed_epochs: int
    attempt: int
    epoch_start: int
    escrow: int
    checkpoint: bytes


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: JobState
    members: tuple[str, ...] = ()
    pending_joins: tuple[str, ...] = ()
    committed: int = 0  # members that committed a vote in the epoch in progress
    revealed: int = 0  # members that revealed it
    deadline: int = 0  # commit deadline of the epoch in progress (0 when not running)
    reveal_deadline: int = 0  # deadline + reveal_window (0 when not running)
    block: int = 0  # the block this snapshot was read at

    @property
    def final_epoch(self) -> int | None:
        """The epoch whose checkpoint is the job's final one (`state.checkpoint`) once it ended:
        its last finalized (paid) epoch, a completed job's last; None while it runs or when no
        epoch of it was finalized."""
        st = self.state
        return st.epoch - 1 if st.status.is_ended and st.epoch > 0 else None


@dataclass(frozen=True)
class Submission(Decoded):
    """A member's vote in the epoch in progress (`submissionOf`): its commitment, and once
    revealed the checkpoint (or `UNWORKABLE`) and the vote's key; zero bytes when none."""

    CONVERT: ClassVar = {"commitment": bytes, "checkpoint": bytes, "vote_key": bytes}

    commitment: bytes
    checkpoint: bytes
    vote_key: bytes

    @property
    def is_committed(self) -> bool:
        return self.commitment != ZERO32

    @property
    def is_revealed(self) -> bool:
        return self.vote_key != ZERO32


@dataclass(frozen=True)
class Operator:
    address: str
    registered: bool
    active_jobs: int
    min_price_per_epoch: int
    peer_key: bytes
    multiaddrs: tuple[str, ...]
    hardware: str
    self_stake: int = 0
    pool: Pool | None = None
    bonded: int = 0  # self-stake bonded by the operator's seats (sum of its jobs' seat bonds)

    @classmethod
    def from_struct(
        cls, struct: Mapping[str, Any], address: str, self_stake: int, pool: Pool, bonded: int = 0
    ) -> Operator:
        """From `getOperator`'s `OperatorInfo`, plus the stake reads it does not hold."""
        conv = {"peer_key": bytes, "multiaddrs": tuple}
        extra = {"address": address, "self_stake": self_stake, "pool": pool, "bonded": bonded}
        return from_struct(cls, struct, conv, **extra)

    @property
    def peer_id_bytes(self) -> bytes:
        """libp2p peer id of the Ed25519 key (identity multihash)."""
        return bytes.fromhex("002408011220") + self.peer_key


@dataclass(frozen=True)
class Attestation:
    """An operator's TEE attestation as the BSM recorded it (`attestationOf`): which allowed
    verifier accepted it, for which peer key, until when; `valid` says whether it counts now for
    a `teeRequired` join."""

    verifier: str
    issued_at: int
    expires_at: int
    tee_type: int  # 1 TDX, 2 SEV-SNP
    measurement: bytes
    peer_key: bytes
    valid: bool


@dataclass(frozen=True)
class Pool(Decoded):
    total_shares: int
    total_assets: int
    unbonding_shares: int
    unbonding_assets: int
    reward_per_share: int
    reward_reserve: int


@dataclass(frozen=True)
class Accounting(Decoded):
    """Running totals whose sum equals the contract balance."""

    staked: int
    unbonding: int
    escrow: int
    credits: int
    reward_reserve: int

    @property
    def total(self) -> int:
        return sum(astuple(self))


@dataclass(frozen=True)
class TokenAccounting(Decoded):
    """Running totals of one payment token whose sum equals the contract's balance of it."""

    escrow: int
    credits: int
    reward_reserve: int

    @property
    def total(self) -> int:
        return sum(astuple(self))


@dataclass(frozen=True)
class Balances:
    """What an account holds: in its wallet and as claimable credit in the contract."""

    address: str
    wallet: int
    credit: int
    pending_rewards: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Event:
    name: str
    args: dict
    block: int
    tx_hash: str
    log_index: int


@dataclass(frozen=True)
class SlashLoss:
    """One `Slashed` event of an operator's pool and what it took from one position."""

    job_id: int
    epoch: int
    reason: SlashReason
    block: int
    time: int  # the block's unix time
    pool_amount: int  # wei the slash took from the whole pool (active and unbonding)
    lost: int  # wei it took from this position: its share of the pool just before the slash


@dataclass(frozen=True)
class Earnings:
    """An operator's profit and loss in ether over every job, from the chain's events: what it
    earned (its share of each operator-epoch paid in ether, its own stake's pool rewards, its
    finalizer bounties), what slashes took from its own stake, and what it withdrew."""

    paid_epochs: int  # operator-epochs it was paid for, in ether jobs
    paid: int  # its operator share of them (`operator_bps` of each price)
    rewards: int  # its own stake's share of its pool's rewards: claimed and pending
    bounties: int  # paid for settling epochs (`FinalizerPaid`)
    slashed: int  # what its pool's slashes took from its own stake
    withdrawn: int  # ether credit it withdrew (`Withdrawn`)
    token_epochs: int = 0  # operator-epochs paid in a token (not in the ether sums)

    @property
    def earned(self) -> int:
        return self.paid + self.rewards + self.bounties

    @property
    def net(self) -> int:
        """Earned less what slashes took from its own stake."""
        return self.earned - self.slashed


@dataclass(frozen=True)
class Slash:
    """One `Slashed` event of an operator: what its pool (active and unbonding stake) lost."""

    operator: str
    job_id: int
    epoch: int  # 0-based, as the contract counts
    reason: SlashReason
    amount: int  # wei taken from the operator's whole pool
    reporter: str  # who settled the epoch (or proved the fault) and earned the bounty
    block: int
    time: int  # the block's unix time
    tx_hash: str


@dataclass(frozen=True)
class Challenge(Decoded):
    """The challenge of one epoch attempt's certified vote (`challengeOf`); `challenger` is
    the zero address when there is none."""

    CONVERT: ClassVar[Mapping[str, Callable[[Any], Any]]] = {
        "transcript": bytes,
        "certified_key": bytes,
        "verdict_key": bytes,
        "referees": tuple,
    }

    challenger: str
    opened_at: int
    resolved: bool
    transcript: bytes  # sha256 of the transcript file the challenger serves
    certified_key: bytes
    verdict_key: bytes  # zero bytes: no verdict (yet)
    consistent: int  # with the verdict: bit i set, member i's own transcript leads to its vote
    caught: int  # with the verdict: bit i set, member i's replayed packet is not the one it sent
    committed: int
    revealed: int
    seed_block: int  # the block whose hash draws the referees; 0 once drawn
    referees: tuple[str, ...]  # empty until drawn

    @property
    def open(self) -> bool:
        return int(self.challenger, 16) != 0 and not self.resolved


@dataclass(frozen=True)
class Position:
    """An account's stake with one operator (a delegation, or the operator's self-stake)."""

    operator: str
    account: str
    stake: int  # active stake now, in wei
    unbonding: int  # wei queued for unbonding (still slashable until withdrawn)
    unlock_at: int  # unix time the unbonding amount can be withdrawn (0: nothing unbonding)
    pending_rewards: int
    slashes: tuple[SlashLoss, ...] = ()

    @property
    def lost(self) -> int:
        return sum(s.lost for s in self.slashes)


@dataclass(frozen=True)
class Holder:
    """An operator that holds a completed job's final checkpoint, as registered on chain."""

    operator: str
    peer_id: str  # base58 libp2p peer id of its Ed25519 key
    multiaddrs: tuple[str, ...]

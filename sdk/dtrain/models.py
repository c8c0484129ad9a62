"""Typed read models of the contract's state and the job spec a caller submits."""

from __future__ import annotations

from dataclasses import astuple, dataclass, field
from enum import IntEnum

ZERO32 = b"\0" * 32


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
    FABRICATION = 0
    DROPOUT = 1
    SYNC_FAILURE = 2
    EXTERNAL = 3


@dataclass(frozen=True)
class Params:
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
    max_operators: int = 32
    max_failed_epochs: int = 3
    unbonding_period: int = 7 * 86400
    min_stake: int = 10**18
    core: str = "0x0000000000000000000000000000000000000000"

    def as_tuple(self) -> tuple:
        return (
            self.operator_bps,
            self.staker_bps,
            self.protocol_bps,
            self.developer_bps,
            self.fabrication_slash_bps,
            self.dropout_slash_bps,
            self.sync_fail_slash_bps,
            self.reporter_bounty_bps,
            self.sync_threshold_bps,
            self.max_operators,
            self.max_failed_epochs,
            self.unbonding_period,
            self.min_stake,
            self.treasury,
            self.developer,
            self.core,
        )

    @classmethod
    def from_tuple(cls, t: tuple) -> Params:
        return cls(
            operator_bps=t[0],
            staker_bps=t[1],
            protocol_bps=t[2],
            developer_bps=t[3],
            fabrication_slash_bps=t[4],
            dropout_slash_bps=t[5],
            sync_fail_slash_bps=t[6],
            reporter_bounty_bps=t[7],
            sync_threshold_bps=t[8],
            max_operators=t[9],
            max_failed_epochs=t[10],
            unbonding_period=t[11],
            min_stake=t[12],
            treasury=t[13],
            developer=t[14],
            core=t[15],
        )


@dataclass(frozen=True)
class JobSpec:
    """What a caller pays for. Escrow = price x max_operators x total_epochs."""

    price_per_operator_epoch: int
    total_epochs: int = 1
    steps_per_epoch: int = 100
    sync_interval: int = 10
    min_operators: int = 1
    max_operators: int = 3
    method: Method = Method.CPT
    model_hash: bytes = ZERO32
    model_uri: str = ""
    dataset_hash: bytes = ZERO32
    dataset_uri: str = ""
    topk_per_chunk: int = 4
    quant_bits: int = 2
    epoch_duration: int = 3600
    tee_required: bool = False

    @property
    def escrow(self) -> int:
        return self.price_per_operator_epoch * self.max_operators * self.total_epochs

    @property
    def rounds_per_epoch(self) -> int:
        return self.steps_per_epoch // self.sync_interval

    def as_tuple(self) -> tuple:
        return (
            self.model_hash,
            self.model_uri,
            self.dataset_hash,
            self.dataset_uri,
            int(self.method),
            self.total_epochs,
            self.steps_per_epoch,
            self.sync_interval,
            self.topk_per_chunk,
            self.quant_bits,
            self.min_operators,
            self.max_operators,
            self.epoch_duration,
            self.tee_required,
            self.price_per_operator_epoch,
        )

    @classmethod
    def from_tuple(cls, t: tuple) -> JobSpec:
        return cls(
            model_hash=bytes(t[0]),
            model_uri=t[1],
            dataset_hash=bytes(t[2]),
            dataset_uri=t[3],
            method=Method(t[4]),
            total_epochs=t[5],
            steps_per_epoch=t[6],
            sync_interval=t[7],
            topk_per_chunk=t[8],
            quant_bits=t[9],
            min_operators=t[10],
            max_operators=t[11],
            epoch_duration=t[12],
            tee_required=t[13],
            price_per_operator_epoch=t[14],
        )


@dataclass(frozen=True)
class JobState:
    caller: str
    status: JobStatus
    epoch: int
    failed_epochs: int
    attempt: int
    epoch_start: int
    escrow: int
    checkpoint: bytes

    @classmethod
    def from_tuple(cls, t: tuple) -> JobState:
        return cls(t[0], JobStatus(t[1]), t[2], t[3], t[4], t[5], t[6], bytes(t[7]))


@dataclass(frozen=True)
class Job:
    id: int
    spec: JobSpec
    state: JobState
    members: tuple[str, ...] = ()
    pending_joins: tuple[str, ...] = ()
    submitted: int = 0
    deadline: int = 0
    block: int = 0  # the block this snapshot was read at


@dataclass(frozen=True)
class Operator:
    address: str
    registered: bool
    active_jobs: int
    min_price_per_epoch: int
    peer_key: bytes
    multiaddrs: tuple[str, ...]
    hardware: str
    attestation_report: bytes
    tee_type: int
    attestation_verifier: str
    self_stake: int = 0
    pool: Pool | None = None

    @property
    def peer_id_bytes(self) -> bytes:
        """libp2p peer id of the Ed25519 key (identity multihash)."""
        return bytes.fromhex("002408011220") + self.peer_key


@dataclass(frozen=True)
class Pool:
    total_shares: int
    total_assets: int
    unbonding_shares: int
    unbonding_assets: int
    reward_per_share: int
    reward_reserve: int

    @classmethod
    def from_tuple(cls, t: tuple) -> Pool:
        return cls(*t)


@dataclass(frozen=True)
class Accounting:
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

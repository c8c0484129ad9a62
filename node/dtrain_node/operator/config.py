"""What an operator node is run with (`dtrain node run`'s options): the epoch, its transport
and its checks read it, the node wires them together."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dtrain_node.operator import attest
from dtrain_node.operator.faults import Faults
from dtrain_node.operator.sources import DEFAULT_MAX_BYTES, Cache


@dataclass(frozen=True)
class NodeConfig:
    key: str
    rpc_url: str
    contract: str
    data_dir: Path
    listen: str = "/ip4/127.0.0.1/tcp/0"
    job_id: int | None = None
    auto: bool = False
    stake: int = 10**18
    min_price: int | None = None  # our ask in ether, set on chain at start; None: keep it
    step_s: float = 0.5  # --auto: our expected seconds per inner step (epoch-length check)
    hardware: str = "cpu"
    batch_size: int = 8
    # Outer-step hyper-parameters are part of the protocol: every node of a job must use the
    # same ones or theta_sync (and the checkpoint hash) would differ.
    outer_lr: float = 1.0
    beta: float = 0.8  # DeMo error-feedback decay: the Recipe default
    inner_lr: float = 2e-3
    round_deadline_s: float = 20.0
    poll_s: float = 0.3
    withdraw: bool = True
    export: bool = True
    linger_s: float = 0.0  # keep serving checkpoints this long after the job ends
    keep_final_s: float = 0.0  # and the final one until the caller's receipt, this long at most
    faults: Faults = field(default_factory=Faults)
    cache_dir: Path | None = None  # fetched models and datasets; None: data_dir / "cache"
    max_fetch_bytes: int = DEFAULT_MAX_BYTES  # the largest model pack or dataset we fetch
    device: str = "auto"  # where inner steps run: auto (CUDA if present), cpu or cuda
    # TEE: join teeRequired jobs, attesting first through the service (a configfs-tsm report
    # from `tsm_root`) or with a statement saved to `attestation_file`.
    tee: bool = False
    attestation_service: str | None = None
    attestation_file: Path | None = None
    tsm_root: Path = attest.TSM_REPORTS

    def source_cache(self) -> Cache:
        """Where the job's remote model, dataset and recipe are fetched to (operator.sources)."""
        root = self.cache_dir if self.cache_dir is not None else self.data_dir / "cache"
        return Cache(root, max_bytes=self.max_fetch_bytes, progress="log")

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.job_id is None and not self.auto:
            raise ValueError("give a job id or auto=True")
        if self.batch_size < 1 or self.round_deadline_s <= 0 or self.poll_s <= 0:
            raise ValueError("batch_size >= 1, round_deadline_s > 0 and poll_s > 0 required")
        if not self.step_s >= 0:
            raise ValueError(f"step_s must be >= 0, got {self.step_s}")
        if self.tee and (self.attestation_service is None) == (self.attestation_file is None):
            raise ValueError("tee needs exactly one of attestation_service or attestation_file")

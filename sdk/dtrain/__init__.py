"""Python SDK for the DistributedTrainingBSM contract."""

from .chain import LocalChain
from .client import BSM, Receipt, connect, load_key
from .models import (
    Accounting,
    Balances,
    Event,
    Job,
    JobSpec,
    JobState,
    JobStatus,
    Method,
    Operator,
    Params,
    Pool,
    SlashReason,
)

__version__ = "0.1.0"

__all__ = [
    "BSM",
    "Accounting",
    "Balances",
    "Event",
    "Job",
    "JobSpec",
    "JobState",
    "JobStatus",
    "LocalChain",
    "Method",
    "Operator",
    "Params",
    "Pool",
    "Receipt",
    "SlashReason",
    "connect",
    "load_key",
]

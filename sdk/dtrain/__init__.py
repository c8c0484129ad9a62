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
    Submission,
)
from .recipe import Recipe
from .votes import UNWORKABLE, commitment_hash, findings, new_salt, vote_key

__version__ = "0.1.0"

__all__ = [
    "BSM",
    "UNWORKABLE",
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
    "Recipe",
    "SlashReason",
    "Submission",
    "commitment_hash",
    "connect",
    "findings",
    "load_key",
    "new_salt",
    "vote_key",
]

"""What a server serves and how: one typed value, built by the CLI, read by the app."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_MAX_TOKENS_CAP = 512
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


@dataclass(frozen=True)
class ServeConfig:
    job_id: int
    checkpoint: bytes  # the job's on-chain final checkpoint hash, which the weights match
    host: str = "127.0.0.1"
    port: int = 8000
    max_tokens_cap: int = DEFAULT_MAX_TOKENS_CAP

    def __post_init__(self) -> None:
        if self.max_tokens_cap < 1:
            raise ValueError(f"max_tokens_cap must be >= 1, got {self.max_tokens_cap}")

    @property
    def model_id(self) -> str:
        return model_id(self.job_id)

    @property
    def fingerprint(self) -> str:
        """`system_fingerprint` of every response: the checkpoint the answer came from."""
        return "dtrain-" + self.checkpoint.hex()[:16]


def model_id(job_id: int) -> str:
    return f"dtrain-job-{job_id}"

"""Every exception the node raises on purpose derives from `NodeError` (but `StopRequested`,
a `BaseException` like KeyboardInterrupt).

Rejections of network input carry a short machine-readable `reason` (counted in metrics); the
rest say which input was wrong in their message.
"""

from __future__ import annotations

from dtrain.errors import NotServed


class NodeError(Exception):
    """Root of the node's exceptions."""


class RejectedInput(NodeError, ValueError):
    """Bytes from the network were rejected; `reason` is a short tag used in metrics."""

    def __init__(self, reason: str, msg: str) -> None:
        super().__init__(f"{reason}: {msg}")
        self.reason = reason


class PacketError(RejectedInput):
    """A DeMo packet payload that does not decode against the job's model shape."""


class EnvelopeError(RejectedInput):
    """A gossip envelope that is malformed, unsigned, not from a member or out of window."""


class WireError(RejectedInput):
    """A stream-protocol frame that is malformed or oversized."""


class TranscriptInvalid(NodeError, ValueError):
    """An epoch transcript file that is malformed, or holds a packet its sender did not commit."""


class EpochNotReproduced(NodeError):
    """`dtrain node recompute`: an epoch's transcript does not lead to the checkpoint the chain
    certified for it (or the chain certified none for that attempt)."""


class CheckpointInvalid(NodeError, ValueError):
    """A checkpoint that is missing, unreadable or does not match its expected hash."""


class CheckpointUnavailable(NodeError):
    """No peer delivered a file with the expected sha256 (nothing is left at the destination)."""


class FinalCheckpointUnavailable(CheckpointUnavailable, NotServed):
    """`dtrain job fetch`: no operator of the job serves its final checkpoint right now (all
    stopped, or stopped lingering). The SDK's `NotServed` too, so the `dtrain` CLI prints its
    one-line message (`error: ...`) and exits 1."""

    def __init__(
        self, job_id: int, checkpoint: bytes, holders: list[str], epoch: int | None = None
    ) -> None:
        who = ", ".join(h[:10] + ".." for h in holders) or "none"
        what = "final checkpoint" if epoch is None else f"checkpoint of epoch {epoch}"
        super().__init__(
            f"job {job_id}: nobody serves its {what} 0x{checkpoint.hex()[:16]}.. "
            f"now (operators that hold it: {who}; none answered). Operators serve it while "
            f"`dtrain node run` runs and for --linger (1h by default) after the job: ask one "
            f"to run `dtrain node run --job {job_id}` again, then retry"
        )
        self.job_id = job_id
        self.checkpoint = checkpoint
        self.holders = holders


class GossipError(NodeError):
    """The gossip host is not running or failed to start."""


class DatasetError(NodeError, ValueError):
    """A dataset that is missing, does not match its hash, or holds an invalid record."""


class RecipeInvalid(NodeError, ValueError):
    """A job's recipe that is missing, unreadable, invalid or does not match its recipeHash."""


class CompressionInvalid(NodeError, ValueError):
    """A job's compression (its spec's top-k and bits, its recipe's token tensors) that no
    member can sync: more coefficients than a chunk holds, a packet over the gossip limit, or
    an aggregate that cannot stay exact for its seats."""


class ModelUnavailable(NodeError, ValueError):
    """A job's model URI names no model this node can build (unknown preset, unreadable config)."""


class BackendUnavailable(NodeError):
    """The selected training backend's package is not installed."""


class StopRequested(BaseException):
    """The operator asked the node to stop now (a second SIGINT or SIGTERM, raised by the
    signal handler wherever the main thread is). The one exception outside `NodeError`: like
    KeyboardInterrupt it is no `Exception`, so no `except Exception` on its way (logging's, a
    retry loop's) can swallow it."""


class NoteError(RejectedInput):
    """A signed note (a member's round progress, an operator's refusal of a job) that is
    malformed, not signed by its sender, for another job or from a sender not allowed."""

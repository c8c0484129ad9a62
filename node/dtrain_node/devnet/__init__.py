"""The whole story on one machine: `make demo` (`python -m dtrain_node.devnet`).

Starts anvil, deploys the BSM, registers operators and stakers, submits a continued
pre-training job (small Llama-style model, offline corpus of Python stdlib sources), launches one
operator node per OS process (real libp2p gossip between them), lets a late operator join at an
epoch boundary, makes one operator fabricate its checkpoint, one go offline mid-epoch and one
poison its packets in the last epoch (excluded by the others' robust aggregation, slashed for
sync failure), then prints and writes (demo-result.json) per epoch the members, the quorum
hash, who was paid and who was slashed and why, every account's credit against the
contract's rules (40/20/20/20 split; slashed stake to the treasury, all of it; a capped share
of the protocol's fee only to a finalizer outside the job), the held-out loss before and after,
the upload bytes per sync against a dense all-reduce, and the final checkpoint with its on-chain
hash. Exits non-zero when any check fails.

| module | what |
|---|---|
| `__main__` | the options and the exit code |
| `plan` | `Plan`: who starts, who joins late, who fabricates, goes offline, poisons (pure) |
| `story` | the sequence on the chain and the nodes, up to what it `Observed` |
| `cluster` | node processes (`dtrain node run`) and `Cluster`, the tests' and benchmarks' fixture |
| `job` | `JobOptions`, the dataset, the built-in tiny model, the `JobSpec`, deploy parameters |
| `money` | every account's credit recomputed from the events (pure) |
| `report` | the checks, the table and demo-result.json (`DemoResult`, pure) |
| `final_model` | the caller fetches, loads, evaluates and samples the final checkpoint |
"""

from __future__ import annotations

from .cluster import Cluster, NodeConfig, Proc, spawn_node, stop_all
from .job import JobOptions
from .money import ETH

__all__ = [
    "ETH",
    "Cluster",
    "JobOptions",
    "NodeConfig",
    "Proc",
    "main",
    "spawn_node",
    "stop_all",
]


def main(argv: list[str] | None = None) -> int:
    """Runs the demo with `argv` as options; returns the exit code."""
    # Imported on call: `python -m dtrain_node.devnet` must find __main__ not yet imported.
    from .__main__ import main as run

    return run(argv)

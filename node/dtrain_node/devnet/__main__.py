"""The whole story on one machine: `make demo`.

`python -m dtrain_node.devnet [options]`: parses the options, plays the story (story.py) as
the plan says (plan.py), writes demo-result.json into the run directory, prints the checks
and exits non-zero when any failed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from .job import MIN_EPOCH_DURATION, max_epoch_duration
from .plan import Plan
from .report import Checks


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m dtrain_node.devnet", description=(__doc__ or "").splitlines()[0]
    )
    ap.add_argument("--operators", type=int, default=4, help="operators at the start")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="training steps per epoch")
    ap.add_argument("--sync", type=int, default=2, help="DeMo sync every K steps")
    ap.add_argument(
        "--epoch-duration",
        type=int,
        default=150,
        help=f"seconds per epoch deadline ({MIN_EPOCH_DURATION}..{max_epoch_duration()})",
    )
    ap.add_argument("--round-deadline", type=float, default=30.0)
    ap.add_argument(
        "--method",
        choices=["cpt", "sft", "dpo", "grpo"],
        default="cpt",
        help="training method of the job",
    )
    ap.add_argument(
        "--model",
        default="builtin:tiny",
        help="the start model: builtin:tiny, a Hugging Face model folder or hf://org/name@rev",
    )
    ap.add_argument(
        "--dataset",
        default=None,
        help="the caller's dataset file for --method (default: one generated for the method)",
    )
    ap.add_argument(
        "--recipe",
        default=None,
        help="the job's recipe TOML (learning rates, batch size, seq_len, LoRA, ...)",
    )
    _add_paid_flags(ap)
    ap.add_argument("--no-faults", action="store_true", help="every operator honest")
    ap.add_argument("--no-late-join", action="store_true", help="no operator joins later")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--run-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    if not a.model.startswith(("builtin:", "hf://")):
        a.model = str(Path(a.model).resolve())
    for name in ("dataset", "recipe"):
        if getattr(a, name):
            if not Path(getattr(a, name)).is_file():
                ap.error(f"--{name} {getattr(a, name)}: no such file")
            setattr(a, name, str(Path(getattr(a, name)).resolve()))
    if a.operators < 2:
        ap.error("--operators must be at least 2: nobody certifies its own checkpoint")
    if not MIN_EPOCH_DURATION <= a.epoch_duration <= max_epoch_duration():
        ap.error(
            f"--epoch-duration must be {MIN_EPOCH_DURATION}..{max_epoch_duration()} seconds "
            "(the contract's minimum, and a quarter of the unbonding period less the start grace "
            "and the reveal window)"
        )
    return a


def _add_paid_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--x402",
        action="store_true",
        help="the caller buys the job over x402 from `dtrain gateway`, paying its escrow in "
        "the devnet's TestUSD (the job is priced and paid out in TestUSD)",
    )
    ap.add_argument(
        "--serve",
        action="store_true",
        help="after the job, an operator serves the final model (`dtrain serve --price`) and "
        "the caller pays one chat completion over x402",
    )


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the chain and the nodes are always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from .story import run

    run_dir = (a.run_dir or Path.cwd() / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    # the story takes minutes: say at once where to follow it (a log folder per node)
    print(f"demo: logs and results in {run_dir}", flush=True)
    checks = Checks()
    result = run(a, Plan.from_args(a), run_dir, checks)
    path = run_dir / "demo-result.json"
    result.write(path)
    print()
    checks.print()
    print(f"\nresult: {path}")
    return 0 if checks.ok else 1


if __name__ == "__main__":
    sys.exit(main())

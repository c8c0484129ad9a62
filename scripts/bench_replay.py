"""Replay benchmark: what checking a member's packet by replay costs, and how exact it is, on
the models jobs train (`builtin:tiny`, `builtin:small`).

A member trains R rounds (K inner steps on its batches, then its packet; it applies its own
packet, as when alone), recording per round the shared state, its private state and the
packet. A checker (another model and optimizer in the same process) recomputes each packet
with `dtrain_node.optim.reproduce` at 1 thread and at 2 threads. Reported per model: the
member's round time, the replay time, the private state's size, and how many replays matched
byte for byte, at the member's thread count and at another one (CPU kernels may sum in
another order with another thread count: such a replay is compared by what the packet
encodes, the top-k indices and signs per chunk).

    python scripts/bench_replay.py            # docs/bench/replay.{json,md}
    python scripts/bench_replay.py --quick    # one model, 3 rounds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "node"))

from dtrain_node.optim import codec  # noqa: E402
from dtrain_node.optim import reproduce as rp  # noqa: E402
from dtrain_node.optim.compress import CompressConfig  # noqa: E402
from dtrain_node.optim.optimizer import DeMo, DeMoConfig  # noqa: E402
from dtrain_node.train.start import start_model  # noqa: E402

K = 2  # the node's default sync interval (`dtrain job submit`)
BSZ, CTX = 8, 128


def _member(uri: str) -> tuple[torch.nn.Module, DeMo]:
    torch.manual_seed(0)
    model = start_model(uri).fresh()
    cfg = DeMoConfig(
        mode="local", sync_interval=K, lr=1.0, compress=CompressConfig(k2d=4, k1d=1, bits=1)
    )
    return model, DeMo(model.named_parameters(), cfg, sender="0x" + "aa" * 20)


def _batches(r: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(r)
    return [torch.randint(0, 256, (BSZ, CTX), generator=g) for _ in range(K)]


def _loss(model):
    return lambda ids: model(input_ids=ids, labels=ids).loss


def _bytes(state: rp.PrivateState) -> int:
    ts = [state["e"]["mat"], state["e"]["vec"]]
    ts += [v for s in state["inner"]["state"].values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in ts)


def _same_selection(spec, a: bytes, b: bytes) -> bool:
    """Same top-k indices and signs in every chunk (what the packet encodes, bar the scales)."""
    for x, y in zip(codec.decode(spec, a), codec.decode(spec, b), strict=True):
        if not torch.equal(x.idx, y.idx) or not torch.equal(x.lvl.sign(), y.lvl.sign()):
            return False
    return True


def bench(uri: str, rounds: int) -> dict:
    torch.set_num_threads(1)
    model, opt = _member(uri)
    loss = _loss(model)
    recorded, train_s = [], []
    for r in range(rounds):
        shared, state = [t.clone() for t in opt.theta_sync], rp.private_state(opt)
        t0 = time.perf_counter()
        for b in _batches(r):
            loss(b).backward()
            opt.inner_step()
        packet = opt.prepare()
        train_s.append(time.perf_counter() - t0)
        opt.apply([(opt.sender, packet)])
        recorded.append((shared, state, packet))
    cmodel, checker = _member(uri)
    out = dict(model=uri, params=sum(p.numel() for p in model.parameters()), rounds=rounds, K=K)
    out["private_state_bytes"] = _bytes(recorded[-1][1])  # round 0 has no AdamW state yet
    out["round_s"] = statistics.median(train_s)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        exact, selection, replay_s = 0, 0, []
        for r, (shared, state, packet) in enumerate(recorded):
            t0 = time.perf_counter()
            got = rp.reproduce(checker, shared, state, _batches(r), _loss(cmodel))
            replay_s.append(time.perf_counter() - t0)
            exact += got == packet
            selection += got == packet or _same_selection(checker.spec, got, packet)
        out[f"threads{threads}"] = dict(
            exact=exact, same_selection=selection, replay_s=statistics.median(replay_s)
        )
    torch.set_num_threads(1)
    return out


def table(rows: list[dict]) -> str:
    head = (
        "| model | params | private state | member's round | replay (1 thread) "
        "| exact, 1 thread (as the member) | exact, 2 threads | same top-k and signs, 2 threads |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {r['model']} | {r['params']:,} | {r['private_state_bytes'] / 2**20:.1f} MiB "
        f"| {r['round_s']:.3f} s | {r['threads1']['replay_s']:.3f} s "
        f"| {r['threads1']['exact']}/{r['rounds']} | {r['threads2']['exact']}/{r['rounds']} "
        f"| {r['threads2']['same_selection']}/{r['rounds']} |\n"
        for r in rows
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="builtin:tiny, 3 rounds")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench")
    a = ap.parse_args()
    models = ["builtin:tiny"] if a.quick else ["builtin:tiny", "builtin:small"]
    rounds = 3 if a.quick else a.rounds
    rows = []
    for uri in models:
        rows.append(bench(uri, rounds))
        print(json.dumps(rows[-1]), flush=True)
    md = (
        f"Replay of a member's packets (scripts/bench_replay.py): K={K}, batch {BSZ}x{CTX}, "
        f"{rounds} rounds, CPU, the member at 1 thread.\n\n" + table(rows)
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "replay.json").write_text(json.dumps(rows, indent=1) + "\n")
    (a.out / "replay.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

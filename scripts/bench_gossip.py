"""Gossip round latency and throughput between real node processes on loopback.

For each (nodes, params) it starts that many harness.gossip_worker processes (each a libp2p
host with the gossip sync layer), runs `rounds` sync rounds with real DeMo codec packets of a
synthetic model with `params` parameters at the default compression (4 of 4096 coefficients
per 64x64 chunk, ~0.1% density, 1-bit levels), and records per-round latency as seen by each
node (start of the round, i.e. publishing its commitment, to "all members' packets in hand"),
lost rounds and memory.

    python scripts/bench_gossip.py [--quick] [--out DIR]
    python scripts/bench_gossip.py --withhold-stall [--busy 2] [--out DIR]

Writes DIR/gossip.json (list of records) and DIR/gossip.md (table); DIR is docs/bench (full) or
docs/bench/quick (--quick) unless --out is given. Run it under `nice` on a shared machine.

--withhold-stall: one member of 4 commits every round, never reveals and holds every sync
request open until the asker's timeout, at D = 4 s and settle = 2 s, beside BUSY CPU-bound
loops (default 2); the honest members' round times against D + settle go to
DIR/gossip_stall.json and .md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The benchmark baselines, model and corpus live with the test harnesses, not in the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness.gossip_cluster import Cluster

ROOT = Path(__file__).resolve().parents[1]


def run_one(nodes: int, params: int, rounds: int, deadline_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-gossip-") as tmp:
        c = Cluster(
            Path(tmp),
            nodes,
            rounds=rounds,
            params=params,
            gossip={"round_deadline_s": deadline_s, "settle_s": 5.0},
            distinct_packets=4,  # packet content does not matter to the network; saves CPU
        )
        try:
            t0 = time.monotonic()
            c.spawn()
            c.start(timeout=180)
            startup = time.monotonic() - t0
            results = c.wait_done(timeout=rounds * (deadline_s + 10) + 120)
        finally:
            c.close()
    lat = sorted(r["latency_s"] for res in results for r in res["rounds"])
    lost = 0
    for i in range(rounds):
        views = {tuple(res["rounds"][i]["digests"]) for res in results}
        incomplete = any(res["rounds"][i]["missing"] for res in results)
        lost += len(views) != 1 or incomplete
    spans = [res["rounds"][-1]["t_end"] - res["rounds"][0]["t_end"] for res in results]
    span = max(statistics.median(spans), 1e-9)
    packet = results[0]["packet_bytes"]
    return {
        "nodes": nodes,
        "params": results[0]["params"],
        "packet_bytes": packet,
        "rounds": rounds,
        "lost_rounds": lost,
        "median_round_s": lat[len(lat) // 2],
        "p95_round_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_round_s": lat[-1],
        "rounds_per_s": (rounds - 1) / span,
        # distinct packet bytes each node receives per second of sync
        "recv_mb_per_s_per_node": (nodes - 1) * packet * (rounds - 1) / span / 1e6,
        "bytes_in_per_round_per_node": statistics.mean(
            r["bytes_in"] for res in results for r in res["rounds"]
        ),
        "re_requests_per_round": statistics.mean(
            r["re_requests"] for res in results for r in res["rounds"]
        ),
        "rss_mb_per_node": statistics.mean(res["metrics"]["rss_mb"] for res in results),
        "startup_s": startup,
        # 2-core machines are often shared: a high load average explains slow rounds
        "loadavg_1m": os.getloadavg()[0],
    }


STALL_GOSSIP = {"round_deadline_s": 4.0, "settle_s": 2.0}


def _spin() -> None:
    while True:
        pass


def run_stall(nodes: int, rounds: int, busy: int) -> dict[str, Any]:
    """The honest members' round times while the last member withholds and stalls sync."""
    loops = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(busy)]
    for p in loops:
        p.start()
    staller = {"withhold_rounds": list(range(rounds)), "stall_sync": True}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stall-") as tmp:
            c = Cluster(
                Path(tmp),
                nodes,
                rounds=rounds,
                params=1_000_000,
                gossip=STALL_GOSSIP,
                per_node={nodes - 1: staller},
                distinct_packets=4,
            )
            try:
                c.spawn()
                c.start(timeout=180)
                results = c.wait_done(list(range(nodes - 1)), timeout=rounds * 30 + 120)
            finally:
                c.close()
    finally:
        for p in loops:
            p.kill()
    lat = sorted(r["latency_s"] for res in results for r in res["rounds"])
    bound = STALL_GOSSIP["round_deadline_s"] + STALL_GOSSIP["settle_s"]
    return {
        "nodes": nodes,
        "rounds": rounds,
        "busy_loops": busy,
        "bound_s": bound,
        "median_round_s": statistics.median(lat),
        "p95_round_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))],
        "max_round_s": lat[-1],
        "rounds_over_bound_plus_1s": sum(x > bound + 1.0 for x in lat),
        "round_samples": len(lat),
        "loadavg_1m": os.getloadavg()[0],
    }


def stall_table(records: list[dict[str, Any]]) -> str:
    head = (
        "| nodes (1 staller) | rounds | busy loops | D + settle | median round | p95 | max "
        "| rounds > D + settle + 1 s |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = [
        f"| {r['nodes']} | {r['rounds']} | {r['busy_loops']} | {r['bound_s']:.0f} s "
        f"| {r['median_round_s']:.2f} s | {r['p95_round_s']:.2f} s | {r['max_round_s']:.2f} s "
        f"| {r['rounds_over_bound_plus_1s']} of {r['round_samples']} |"
        for r in records
    ]
    return head + "\n".join(rows) + "\n"


def table(records: list[dict[str, Any]]) -> str:
    head = (
        "| nodes | params | packet | rounds | lost | median round | p95 round | rounds/s "
        "| recv MB/s/node | re-requests/round | RSS MB/node |\n"
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = [
        f"| {r['nodes']} | {r['params'] / 1e6:.1f}M | {r['packet_bytes'] / 1024:.1f} KiB "
        f"| {r['rounds']} | {r['lost_rounds']} | {r['median_round_s'] * 1000:.0f} ms "
        f"| {r['p95_round_s'] * 1000:.0f} ms | {r['rounds_per_s']:.1f} "
        f"| {r['recv_mb_per_s_per_node']:.2f} | {r['re_requests_per_round']:.2f} "
        f"| {r['rss_mb_per_node']:.0f} |"
        for r in records
    ]
    return head + "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="CI-sized run (under 3 min on 2 cores)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--nodes", type=int, nargs="*", default=None)
    ap.add_argument("--params", type=int, nargs="*", default=None)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--withhold-stall", action="store_true", help="the staller's rounds")
    ap.add_argument("--busy", type=int, default=2, help="CPU-bound loops beside the stall run")
    args = ap.parse_args()
    if args.withhold_stall:
        return stall_main(args)
    if args.quick:
        nodes, params, rounds = [2, 4], [10_000_000, 100_000_000], 20
    else:
        nodes, params, rounds = [2, 4, 8], [10_000_000, 100_000_000], 200
    nodes = args.nodes or nodes
    params = args.params or params
    rounds = args.rounds or rounds
    out = args.out or ROOT / "docs" / "bench" / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for p in params:
        for n in nodes:
            rec = run_one(n, p, rounds, deadline_s=30.0)
            records.append(rec)
            print(json.dumps(rec), flush=True)
            (out / "gossip.json").write_text(json.dumps(records, indent=1) + "\n")
    md = table(records)
    (out / "gossip.md").write_text(md)
    print(md)
    return 0


def stall_main(args: argparse.Namespace) -> int:
    out = args.out or ROOT / "docs" / "bench"
    out.mkdir(parents=True, exist_ok=True)
    records = [run_stall(n, args.rounds or 12, args.busy) for n in (args.nodes or [4])]
    (out / "gossip_stall.json").write_text(json.dumps(records, indent=1) + "\n")
    md = stall_table(records)
    (out / "gossip_stall.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

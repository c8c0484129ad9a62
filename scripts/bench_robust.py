"""Robust aggregation benchmark: one attacking member among N, with and without the rule.

N simulated members in one process train a small byte-level GPT on disjoint shards of this
machine's Python standard library sources with DeMo (local mode); the last member sends an
attack packet (dtrain_node.optim.attacks) instead of its honest one every round. Per attack
and N: rounds in which the attacker was excluded, held-out loss damage against the all-honest
run (same init, data and seeds), the same damage with the rule switched off, honest senders
ever excluded (false exclusions, over every run), and the time the rule adds per round.

    python scripts/bench_robust.py --quick          # CI: ~2 minutes on 2 cores
    python scripts/bench_robust.py --jobs 2         # full run (docs/benchmarks.md)
    python scripts/bench_robust.py --coalitions     # f colluding members of n (see below)
    python scripts/bench_robust.py --shaped --model builtin:tiny   # attacks shaped to the rule

Writes DIR/robust.json and DIR/robust.md; DIR is docs/bench (full) or docs/bench/quick
(--quick) unless --out is given. With --coalitions: f = 1 .. (n - 1) // 2 colluding members
for n in 4, 5, 7, 8, 10 (the last f), every one sending the same kind of attack packet
(COALITION_ATTACKS; push: all of them one direction; /alt: every other round), into
DIR/coalitions.json and .md. With --shaped: the largest f < n/3 at n = 7, 10, 16 sending
attacks shaped to the rule (SHAPED_ATTACKS: amplified, orthogonal, edge-of-band, adaptive,
ALIE-like), 2 of 5 beyond the bound (BEYOND), and the honest runs with the bound switched off
(what it costs), into DIR/shaped.json and .md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from dtrain_node.optim.aggregate import aggregate
from dtrain_node.optim.attacks import Attack, Coalition
from dtrain_node.optim.codec import Spec
from dtrain_node.optim.compress import CompressConfig, compress
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.optim.robust import RobustConfig, screen

# The benchmark model and corpus live with the test harnesses, not in the product.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from harness import bench_corpus as corpus
from harness.bench_model import GPT, GPTConfig

ATTACKS = ("poison", "scale=100", "noise", "signflip", "stale", "copy")
GROSS = ("poison", "scale=100", "noise")  # must be excluded in every round
# "/alt": the coalition attacks every other round and sends honest packets in between
COALITION_ATTACKS = (
    "flip=4",
    "flip=16",
    "push=4",
    "push=16",
    "push=4/alt",
    "signflip",
    "noise",
    "stale",
)
COALITION_SIZES = (4, 5, 7, 8, 10)
# push=1: one shared adverse direction at the honest norm, inside the honest spread (ALIE-like)
SHAPED_ATTACKS = ("scale=8", "orth=8", "edge=8", "adapt", "push=1", "flip=4")
SHAPED_SIZES = (7, 10, 16)
RUNS_LOG = "BENCH_ROBUST_RUNS"  # env: a jsonl file each finished run is appended to
BEYOND = ((5, 2, "push=4"), (5, 2, "push=8"))  # a coalition between a third and a half


class ByteLM(torch.nn.Module):
    """A job's start model (a `builtin:` URI, byte-level) behind the harness GPT's interface:
    forward(x, y) -> mean next-byte loss."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        from dtrain_node.train.start import start_model

        self.lm = start_model(uri).fresh()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([x, y[:, -1:]], 1).long()
        return self.lm(input_ids=ids, labels=ids).loss

    def numel(self) -> int:
        return sum(p.numel() for p in self.parameters())


def make_model(setup: Setup) -> torch.nn.Module:
    return ByteLM(setup.uri) if setup.uri else GPT(setup.model)


@dataclass(frozen=True)
class Setup:
    model: GPTConfig
    members: tuple[int, ...]
    K: int
    k: int
    bits: int
    bsz: int
    steps: int
    inner_lr: float
    eval_windows: int
    max_train: int
    uri: str | None = None  # a job's model (builtin:tiny) instead of the harness GPT
    outer_lr: float = 1.0  # DeMo's step on the aggregate (the recipe's outer_lr)
    clip: float = RobustConfig.clip  # the rule's bound (RobustConfig.clip) when it is on
    trust_shift: int = RobustConfig.trust_shift  # senders below cos_trust scaled by 2^-this
    support: float = RobustConfig.support  # share of the kept senders a coefficient needs
    majority: bool = RobustConfig.majority  # entries against their coefficient's sign out
    weighted: bool = RobustConfig.weighted  # the mean divides by the kept senders' weights
    graded: bool = RobustConfig.graded  # trust shifts by cosine against the median's
    block: int = 0  # shards dealt in blocks of this many bytes (0: contiguous, bench_corpus)


def setups(quick: bool) -> Setup:
    if quick:
        m = GPTConfig(d=64, n_layer=1, n_head=1, ctx=64)
        return Setup(m, (4, 8), 4, 4, 1, 8, 48, 2e-3, 16, 400_000)
    m = GPTConfig(d=128, n_layer=2, n_head=2, ctx=64)
    return Setup(m, (4, 8), 4, 4, 1, 8, 160, 2e-3, 64, 1_000_000)


@torch.no_grad()
def evaluate(m: torch.nn.Module, ev) -> float:
    m.eval()
    out = float(m(*ev))
    m.train()
    return out


def run(
    setup: Setup, n: int, attack: str | None, rule: bool, seed: int, f: int = 1, clip: bool = True
) -> dict:
    """One training run; attack None: all honest, "absent": the last f members send nothing;
    otherwise the last f members collude, each sending `attack`. clip=False: the rule without
    its bound on kept senders."""
    torch.set_num_threads(1)
    train, held = corpus.stdlib_corpus(max_train=setup.max_train)
    ctx = 127 if setup.uri else setup.model.ctx  # the builtin models' 128 positions
    ev = corpus.eval_windows(held, setup.eval_windows, ctx)
    shards = corpus.shards(train, n, setup.block)
    gens = [torch.Generator().manual_seed(1000 * seed + w) for w in range(n)]
    torch.manual_seed(seed)
    models = [make_model(setup) for _ in range(n)]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    cfg = DeMoConfig(
        mode="local",
        sync_interval=setup.K,
        lr=setup.outer_lr,
        inner_lr=setup.inner_lr,
        compress=CompressConfig(k2d=setup.k, k1d=1, bits=setup.bits),
        robust=RobustConfig(
            enabled=rule,
            clip=setup.clip if clip else 0.0,
            trust_shift=setup.trust_shift,
            support=setup.support,
            majority=setup.majority,
            weighted=setup.weighted,
            graded=setup.graded,
        ),
    )
    opts = [DeMo(m.named_parameters(), cfg, sender=w) for w, m in enumerate(models)]
    bad = tuple(range(n - f, n))
    alternate = attack is not None and attack.endswith("/alt")
    kind = attack.removesuffix("/alt") if attack else attack
    atk = Coalition(Attack.parse(kind), bad) if kind not in (None, "absent") else None
    rec = dict(excluded_rounds=0, rounds=0, false_exclusions=0, reasons={}, screen_s=[], agg_s=[])
    rec.update(attacker_exclusions=0, clipped_colluders=0, clipped_honest=0)
    for t in range(1, setup.steps + 1):
        for w, m in enumerate(models):
            m(*corpus.batch(shards[w], setup.bsz, ctx, gens[w])).backward()
            opts[w].inner_step()
        if t % setup.K:
            continue
        pk = [(o.sender, o.prepare()) for o in opts]
        if atk and not (alternate and rec["rounds"] % 2 == 0):
            pk = atk.packets(pk, opts[0].spec)
        pk = [p for p in pk if p[0] not in bad] if attack == "absent" else pk
        # every honest node computes the same aggregate: compute it once, apply it everywhere
        st = opts[0].apply(pk)
        for o in opts[1:]:
            if st.aggregate is not None:
                o.apply_aggregate(st.aggregate)
        rec["rounds"] += 1
        rec["excluded_rounds"] += n - 1 in st.excluded
        rec["attacker_exclusions"] += sum(s in bad for s in st.excluded)
        rec["false_exclusions"] += sum(s not in bad for s in st.excluded)
        rec["clipped_colluders"] += sum(s in bad for s in st.clipped)
        rec["clipped_honest"] += sum(s not in bad for s in st.clipped)
        for r in st.excluded.values():
            rec["reasons"][r.split(":")[0]] = rec["reasons"].get(r.split(":")[0], 0) + 1
        rec["screen_s"].append(st.screen_s)
        rec["agg_s"].append(st.aggregate_s)
    loss = evaluate(models[0], ev)
    out = dict(n=n, f=f, attack=attack or "honest", rule=rule, seed=seed, loss=loss, **rec)
    out.update(
        k=setup.k,
        outer_lr=setup.outer_lr,
        inner_lr=setup.inner_lr,
        steps=setup.steps,
        block=setup.block,
    )
    return dict(out, clip=clip)


def _job(args):
    t0 = time.time()
    r = run(*args)
    if os.environ.get(RUNS_LOG):  # every finished run, for a report of a run stopped early
        with open(os.environ[RUNS_LOG], "a") as f:
            f.write(json.dumps(r) + "\n")
    print(
        f"  N={r['n']} f={r['f']} {r['attack']:10s} rule={'on ' if r['rule'] else 'off'} "
        f"seed {r['seed']}: "
        f"loss {r['loss']:.4f}, attacker excluded {r['excluded_rounds']}/{r['rounds']}, "
        f"false {r['false_exclusions']}{'' if r['clip'] else ', no bound'} "
        f"({time.time() - t0:.0f}s)",
        flush=True,
    )
    return r


def jobs(setup: Setup, seeds: list[int]) -> list[tuple]:
    out = []
    for s in seeds:
        for n in setup.members:
            out += [(setup, n, None, True, s), (setup, n, "absent", True, s)]
            out += [(setup, n, a, rule, s) for a in ATTACKS for rule in (True, False)]
    return out


def coalition_jobs(setup: Setup, seeds: list[int]) -> list[tuple]:
    out = []
    for s in seeds:
        for n in COALITION_SIZES:
            out.append((setup, n, None, True, s))
            for f in range(1, (n - 1) // 2 + 1):
                out += [(setup, n, a, True, s, f) for a in COALITION_ATTACKS]
    return out


def shaped_jobs(
    setup: Setup,
    seeds: list[int],
    sizes: tuple[int, ...] = SHAPED_SIZES,
    attacks: tuple[str, ...] = SHAPED_ATTACKS,
) -> list:
    out = []
    for s in seeds:
        for n in sizes:
            f = (n - 1) // 3
            out += [(setup, n, None, True, s), (setup, n, None, True, s, 1, False)]
            # the coalition sending nothing: what no rule can undo (its members' share is lost)
            out += [(setup, n, a, True, s, f) for a in ("absent", *attacks)]
            out += [(setup, n, a, True, s, f, False) for a in ("scale=8", "adapt") if a in attacks]
        beyond = [b for b in BEYOND if b[0] in sizes or sizes == SHAPED_SIZES]
        for n in sorted({b[0] for b in beyond}):
            out += [(setup, n, None, True, s), (setup, n, None, True, s, 1, False)]
        out += [(setup, n, a, True, s, f, c) for n, f, a in beyond for c in (True, False)]
    return out


def shaped_rows(results: list[dict]) -> list[dict]:
    """Per (n, f, attack, bound): damage against the honest run with the bound, and against
    the run whose coalition sent nothing (`absent`, where it ran), paired by seed."""

    def key(r: dict) -> tuple:
        return r["n"], r["f"], r["attack"], r["clip"]

    honest = {(r["n"], r["seed"]): r["loss"] for r in results if key(r)[2:] == ("honest", True)}
    absent = {(r["n"], r["seed"]): r["loss"] for r in results if key(r)[2:] == ("absent", True)}
    rows = []
    for n, f, attack, clip in sorted({key(r) for r in results}, key=lambda k: (*k[:3], not k[3])):
        rs = [r for r in results if key(r) == (n, f, attack, clip)]
        base = [honest[(n, r["seed"])] for r in rs]
        rows.append(
            dict(
                members=n,
                colluders=0 if attack == "honest" else f,
                attack=attack,
                bound=clip,
                loss=_mean(rs, "loss"),
                damage_pct=statistics.mean(
                    100 * (r["loss"] - b) / b for r, b in zip(rs, base, strict=True)
                ),
                vs_absent_pct=_vs(rs, absent) if attack != "honest" else None,
                honest_exclusions=sum(r["false_exclusions"] for r in rs),
                attacker_exclusions=sum(r["attacker_exclusions"] for r in rs),
                attacker_rounds=sum(r["rounds"] * f for r in rs) if attack != "honest" else 0,
                clipped_colluders=sum(r["clipped_colluders"] for r in rs),
                clipped_honest=sum(r["clipped_honest"] for r in rs),
                screen_ms=1e3 * statistics.mean(x for r in rs for x in r["screen_s"]),
            )
        )
    return rows


def _vs(rs: list[dict], absent: dict[tuple[int, int], float]) -> float | None:
    """Mean damage of runs `rs` against their seed's run with the coalition absent."""
    base = [absent.get((r["n"], r["seed"])) for r in rs]
    if None in base:
        return None
    return statistics.mean(100 * (r["loss"] - b) / b for r, b in zip(rs, base, strict=True))


def shaped_table(rows: list[dict]) -> str:
    head = (
        "| n | f | attack | bound | held-out loss | vs honest | vs coalition absent "
        "| honest excluded | colluders excluded | colluders clipped | honest clipped "
        "| rule ms/round |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['members']} | {r['colluders']} | {r['attack']} | {'on' if r['bound'] else 'off'} "
        f"| {r['loss']:.4f} | {_pct(r['damage_pct'])} | {_pct(r.get('vs_absent_pct'))} "
        f"| {r['honest_exclusions']} "
        f"| {r['attacker_exclusions']}/{r['attacker_rounds']} | {r['clipped_colluders']} "
        f"| {r['clipped_honest']} | {r['screen_ms']:.2f} |\n"
        for r in rows
    )


def shaped_verdict(rows: list[dict]) -> str:
    on = [r for r in rows if r["bound"]]
    below = [
        r
        for r in on
        if r["attack"] not in ("honest", "absent") and 3 * r["colluders"] < r["members"]
    ]
    if not below:
        return "- no attack under a third was run\n"
    worst = max(below, key=lambda r: r["damage_pct"])
    vs = [r for r in below if r.get("vs_absent_pct") is not None]
    worst_vs = max(vs, key=lambda r: r["vs_absent_pct"], default=None)
    false = sum(r["honest_exclusions"] for r in below)
    beyond = [
        r
        for r in on
        if r["attack"] not in ("honest", "absent") and 3 * r["colluders"] >= r["members"]
    ]
    ratio = max((1 + r["damage_pct"] / 100 for r in beyond), default=None)
    # each honest run without the bound against with it (damage_pct), as with against without
    cost = [
        -100 * r["damage_pct"] / (100 + r["damage_pct"])
        for r in rows
        if r["attack"] == "honest" and not r["bound"]
    ]
    first = (
        f"- f < n/3, bound on: worst {worst['damage_pct']:+.2f}% ({worst['attack']}, "
        f"n={worst['members']}; {'met' if worst['damage_pct'] < 5 else 'MISSED'} < 5%), honest "
        f"exclusions {false} ({'met' if false == 0 else 'MISSED'})\n"
    )
    if worst_vs is not None:
        first += (
            f"- f < n/3, bound on, against the same run with the coalition absent (what no rule "
            f"can undo): worst {worst_vs['vs_absent_pct']:+.2f}% ({worst_vs['attack']}, "
            f"n={worst_vs['members']}; {'met' if worst_vs['vs_absent_pct'] < 5 else 'MISSED'} "
            "< 5%)\n"
        )
    second = (
        "- beyond the bound: not run\n"
        if ratio is None
        else f"- beyond the bound, bound on: worst loss {ratio:.2f}x the honest run's "
        f"({'met' if ratio <= 2 else 'MISSED'} <= 2x)\n"
    )
    third = (
        "- what the bound costs honest runs (loss with it against without, per n): "
        + ", ".join(f"{c:+.2f}%" for c in cost)
        + f" (<= 1%: {'met' if all(c <= 1 for c in cost) else 'MISSED'})\n"
    )
    return first + second + third


def coalition_rows(results: list[dict]) -> list[dict]:
    honest = {(r["n"], r["seed"]): r["loss"] for r in results if r["attack"] == "honest"}
    keys = sorted({(r["n"], r["f"], r["attack"]) for r in results if r["attack"] != "honest"})
    rows = []
    for n, f, attack in keys:
        rs = [r for r in results if (r["n"], r["f"], r["attack"]) == (n, f, attack)]
        rows.append(
            dict(
                members=n,
                colluders=f,
                below_third=3 * f < n,
                attack=attack,
                honest_exclusions=sum(r["false_exclusions"] for r in rs),
                attacker_exclusions=sum(r["attacker_exclusions"] for r in rs),
                attacker_rounds=sum(r["rounds"] * f for r in rs),
                loss=_mean(rs, "loss"),
                damage_pct=statistics.mean(
                    100 * (r["loss"] - honest[(n, r["seed"])]) / honest[(n, r["seed"])] for r in rs
                ),
            )
        )
    return rows


def coalition_table(rows: list[dict]) -> str:
    head = (
        "| n | f | f < n/3 | attack | honest exclusions | colluders excluded | held-out loss "
        "| damage vs honest |\n|---|---|---|---|---|---|---|---|\n"
    )
    return head + "".join(
        f"| {r['members']} | {r['colluders']} | {'yes' if r['below_third'] else 'no'} "
        f"| {r['attack']} | {r['honest_exclusions']} "
        f"| {r['attacker_exclusions']}/{r['attacker_rounds']} | {r['loss']:.4f} "
        f"| {_pct(r['damage_pct'])} |\n"
        for r in rows
    )


def coalition_verdict(rows: list[dict]) -> str:
    below = [r for r in rows if r["below_third"]]
    false = sum(r["honest_exclusions"] for r in below)
    worst = max(below, key=lambda r: r["damage_pct"])
    return (
        f"- f < n/3: honest exclusions {false} ({'met' if false == 0 else 'MISSED'}); worst "
        f"damage {worst['damage_pct']:+.2f}% ({worst['attack']}, n={worst['members']}, "
        f"f={worst['colluders']}; {'met' if worst['damage_pct'] < 5 else 'MISSED'} < 5%)\n"
    )


def _mean(rs: list[dict], key: str) -> float:
    return statistics.mean(r[key] for r in rs)


def summarize(setup: Setup, results: list[dict]) -> list[dict]:
    recs = []
    for n in setup.members:

        def pick(attack, rule, n=n):
            return [r for r in results if (r["n"], r["attack"], r["rule"]) == (n, attack, rule)]

        honest = {r["seed"]: r["loss"] for r in pick("honest", True)}
        for attack in ("honest", "absent", *ATTACKS):
            on, off = pick(attack, True), pick(attack, False)
            loss = _mean(on, "loss")
            recs.append(
                dict(
                    members=n,
                    attack=attack,
                    seeds=len(on),
                    loss=loss,
                    losses=[r["loss"] for r in sorted(on, key=lambda r: r["seed"])],
                    damage_pct=_damage(on, honest),
                    loss_without_rule=_mean(off, "loss") if off else None,
                    damage_without_rule_pct=_damage(off, honest) if off else None,
                    attacker_excluded_rounds=sum(r["excluded_rounds"] for r in on),
                    rounds=sum(r["rounds"] for r in on),
                    honest_false_exclusions=sum(r["false_exclusions"] for r in on),
                    reasons=_merge([r["reasons"] for r in on]),
                    screen_ms_per_round=1e3 * statistics.mean(x for r in on for x in r["screen_s"]),
                    aggregate_ms_per_round=1e3 * statistics.mean(x for r in on for x in r["agg_s"]),
                )
            )
    return recs


def _damage(rs: list[dict], honest: dict[int, float]) -> float:
    """Mean over seeds of the loss change against the all-honest run of the same seed (%):
    paired, because the seeds' honest losses differ far more than the attacks' effects."""
    return statistics.mean(100 * (r["loss"] - honest[r["seed"]]) / honest[r["seed"]] for r in rs)


def _merge(ds: list[dict]) -> dict:
    out: dict = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _pct(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:+.3g}%" if abs(x) >= 1000 else f"{x:+.2f}%"


COLUMNS = (
    "N",
    "attack",
    "attacker excluded",
    "held-out loss",
    "damage vs honest",
    "damage, rule off",
    "honest false excl.",
    "rule ms/round",
    "aggregate ms/round",
)


def _cells(r: dict) -> list[str]:
    baseline = r["attack"] in ("honest", "absent")
    return [
        str(r["members"]),
        r["attack"],
        "-" if baseline else f"{r['attacker_excluded_rounds']}/{r['rounds']}",
        f"{r['loss']:.4f}",
        _pct(r["damage_pct"]),
        _pct(r["damage_without_rule_pct"]),
        str(r["honest_false_exclusions"]),
        f"{r['screen_ms_per_round']:.2f}",
        f"{r['aggregate_ms_per_round']:.2f}",
    ]


def table(recs: list[dict]) -> str:
    lines = [COLUMNS, ("---",) * len(COLUMNS), *(_cells(r) for r in recs)]
    return "".join("| " + " | ".join(c) + " |\n" for c in lines)


def verdict(recs: list[dict]) -> str:
    """The targets, checked on the measured numbers."""
    att = [r for r in recs if r["attack"] in ATTACKS]
    gross = all(r["attacker_excluded_rounds"] == r["rounds"] for r in att if r["attack"] in GROSS)
    worst = max(att, key=lambda r: r["damage_pct"])
    false = sum(r["honest_false_exclusions"] for r in recs)
    return (
        f"- poison, scale=100, noise excluded in every round at every N: "
        f"{'met' if gross else 'MISSED'}\n"
        f"- held-out damage < 5% for every attack: {'met' if worst['damage_pct'] < 5 else 'MISSED'}"
        f" (worst: {worst['attack']} at N={worst['members']}, {worst['damage_pct']:+.2f}%)\n"
        f"- honest false exclusions: {false} ({'met' if false == 0 else 'MISSED'})\n"
    )


def timing(model: GPTConfig, members: tuple[int, ...], reps: int = 3) -> list[dict]:
    """Rule vs aggregation time per round on one larger model, from real compressed packets
    (honest-sized random momenta; the rule's cost depends on sizes, not on values)."""
    torch.set_num_threads(1)
    named = list(GPT(model).named_parameters())
    spec = Spec.of(named, CompressConfig(k2d=4, k1d=1, bits=1))
    out = []
    for n in members:
        g = torch.Generator().manual_seed(n)
        pk = [
            (w, [compress(torch.randn(p.shape, generator=g) * 1e-3, spec.cfg) for _, p in named])
            for w in range(n)
        ]
        t0 = time.perf_counter()
        for _ in range(reps):
            kept, ex = screen(spec, pk, RobustConfig())
        t1 = time.perf_counter()
        for _ in range(reps):
            aggregate(spec, kept)
        t2 = time.perf_counter()
        out.append(
            dict(
                members=n,
                params=sum(p.numel() for _, p in named),
                excluded=len(ex),
                screen_ms=1e3 * (t1 - t0) / reps,
                aggregate_ms=1e3 * (t2 - t1) / reps,
            )
        )
    return out


def timing_table(rows: list[dict]) -> str:
    head = "| params | N | rule ms/round | aggregate ms/round | rule / aggregate |\n"
    head += "|---|---|---|---|---|\n"
    return (
        head
        + "\n".join(
            f"| {r['params']:,} | {r['members']} | {r['screen_ms']:.1f} | {r['aggregate_ms']:.1f} "
            f"| {r['screen_ms'] / r['aggregate_ms']:.2f} |"
            for r in rows
        )
        + "\n"
    )


def report(setup: Setup, P: int, seeds: int, recs: list, times: list, wall: float) -> str:
    c = setup.model
    return (
        f"Model: byte-level GPT d={c.d} layers={c.n_layer} heads={c.n_head} ctx={c.ctx}, "
        f"{P:,} params; DeMo local K={setup.K}, k={setup.k}/4096, {setup.bits}-bit, "
        f"outer lr {setup.outer_lr:g}; "
        f"{setup.steps} steps x batch {setup.bsz} per member; seeds {seeds}; the last "
        f"member attacks every round; RobustConfig defaults; wall {wall:.0f}s.\n\n"
        + table(recs)
        + "\nDamage is paired: per seed against the all-honest run of that seed, then averaged. "
        + "All-honest loss per seed: "
        + "; ".join(
            f"N={r['members']}: " + ", ".join(f"{x:.4f}" for x in r["losses"])
            for r in recs
            if r["attack"] == "honest"
        )
        + ".\n\n"
        + verdict(recs)
        + "\nRule vs exact aggregation, one round, one node (1 thread):\n\n"
        + timing_table(times)
    )


def run_all(todo: list[tuple], n: int) -> list[dict]:
    """Every run, in `n` spawned processes (one thread each) when n > 1."""
    if n <= 1:
        return [_job(j) for j in todo]
    with mp.get_context("spawn").Pool(n) as pool:
        return list(pool.imap_unordered(_job, todo))


OPTIONS = (
    ("--quick", dict(action="store_true", help="tiny model, 1 seed: CI smoke run")),
    ("--seeds", dict(type=int, default=None, help="default 2 (quick: 1)")),
    ("--steps", dict(type=int, default=None, help="training steps per run")),
    ("--first-seed", dict(type=int, default=0, help="seeds first-seed .. first-seed + seeds - 1")),
    ("--jobs", dict(type=int, default=1, help="parallel processes, 1 thread each")),
    ("--out", dict(type=Path, default=None, help="default docs/bench (quick: docs/bench/quick)")),
    ("--coalitions", dict(action="store_true", help="f colluding members of n, f up to n/2")),
    ("--model", dict(default=None, help="a job's model URI (builtin:tiny) for the runs")),
    ("--shaped", dict(action="store_true", help="attacks shaped to the rule, n = 7, 10, 16")),
    ("--clip", dict(type=float, default=None, help="the bound's multiple of the median norm")),
    ("--trust-shift", dict(type=int, default=None, help="2^-N for senders below cos_trust")),
    ("--support", dict(type=float, default=None, help="share of senders a coefficient needs")),
    ("--outer-lr", dict(type=float, default=None, help="DeMo's outer lr (default 1.0)")),
    ("--inner-lr", dict(type=float, default=None, help="the members' inner AdamW lr")),
    ("--max-train", dict(type=int, default=None, help="bytes of training corpus, all members")),
    ("--topk", dict(type=int, default=None, help="coefficients kept per 64x64 chunk (k2d)")),
    ("--block", dict(type=int, default=None, help="shards dealt in blocks of N bytes (0: cut)")),
    ("--majority", dict(action="store_true", help="entries against their coefficient's sign out")),
    ("--weighted", dict(action="store_true", help="the mean divides by the senders' weights")),
    ("--graded", dict(action="store_true", help="trust shifts graded by cosine (the median's)")),
    ("--attacks", dict(nargs="+", default=None, help="--shaped: these attacks only")),
    ("--from-runs", dict(type=Path, nargs="+", help="--shaped: report these runs (json, jsonl)")),
    ("--sizes", dict(type=int, nargs="+", default=None, help="--shaped: these n only")),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kw in OPTIONS:
        ap.add_argument(flag, **kw)
    a = ap.parse_args(argv)
    a.out = a.out or Path("docs/bench/quick" if a.quick else "docs/bench")
    setup = setups(a.quick)
    setup = replace(setup, steps=a.steps) if a.steps else setup
    seeds = list(range(a.first_seed, a.first_seed + (a.seeds or (1 if a.quick else 2))))
    t0 = time.time()
    if a.model:
        setup = replace(setup, uri=a.model)
    for name in ("clip", "trust_shift", "support", "outer_lr", "inner_lr", "max_train", "block"):
        if getattr(a, name) is not None:
            setup = replace(setup, **{name: getattr(a, name)})
    if a.topk is not None:
        setup = replace(setup, k=a.topk)
    for name in ("majority", "weighted", "graded"):
        if getattr(a, name):
            setup = replace(setup, **{name: True})
    P = make_model(setup).numel()
    if a.coalitions:
        return coalitions(setup, seeds, a, P, t0)
    if a.shaped:
        return shaped(setup, seeds, a, P, t0)
    todo = jobs(setup, seeds)
    print(f"bench_robust: {P:,} params, N in {setup.members}, {len(todo)} runs", flush=True)
    recs = summarize(setup, run_all(todo, a.jobs))
    big = setup.model if a.quick else GPTConfig(d=256, n_layer=4, n_head=4, ctx=128)
    times = timing(big, setup.members)
    md = report(setup, P, len(seeds), recs, times, time.time() - t0)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "robust.md").write_text(md)
    doc = dict(setup=_meta(setup, P), rows=recs, timing=times)
    (a.out / "robust.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(md)
    print(f"wrote {a.out}/robust.json, robust.md")
    return 0


def coalitions(setup: Setup, seeds: list[int], a: argparse.Namespace, P: int, t0: float) -> int:
    todo = coalition_jobs(setup, seeds)
    print(f"bench_robust --coalitions: {P:,} params, {len(todo)} runs", flush=True)
    rows = coalition_rows(run_all(todo, a.jobs))
    c = setup.model
    md = (
        f"Model: {setup.uri or f'byte-level GPT d={c.d} layers={c.n_layer} ctx={c.ctx}'}, "
        f"{P:,} params; DeMo local "
        f"K={setup.K}, k={setup.k}, {setup.bits}-bit; {setup.steps} steps; seeds {len(seeds)}; "
        f"the last f members collude every round; RobustConfig defaults; "
        f"wall {time.time() - t0:.0f}s.\n\n"
        + coalition_table(rows)
        + "\n"
        + coalition_verdict(rows)
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "coalitions.md").write_text(md)
    doc = dict(setup=_meta(setup, P), rows=rows)
    (a.out / "coalitions.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(md)
    return 0


def shaped(setup: Setup, seeds: list[int], a: argparse.Namespace, P: int, t0: float) -> int:
    if a.from_runs:  # runs of several invocations (one seed each, say) in one report
        results = [r for f in a.from_runs for r in _runs(f)]
        seeds = sorted({r["seed"] for r in results})
    else:
        attacks = tuple(a.attacks or SHAPED_ATTACKS)
        todo = shaped_jobs(setup, seeds, tuple(a.sizes or SHAPED_SIZES), attacks)
        print(f"bench_robust --shaped: {P:,} params, {len(todo)} runs", flush=True)
        results = run_all(todo, a.jobs)
    rows = shaped_rows(results)
    c = setup.model
    md = (
        f"Model: {setup.uri or f'byte-level GPT d={c.d} layers={c.n_layer} ctx={c.ctx}'}, "
        f"{P:,} params; DeMo local K={setup.K}, k={setup.k}, {setup.bits}-bit, outer lr "
        f"{setup.outer_lr:g}, inner lr {setup.inner_lr:g}, {setup.max_train:,} training bytes; "
        f"{setup.steps} "
        f"steps; seeds {len(seeds)}; the last f members collude every round; RobustConfig "
        f"defaults but clip={setup.clip:g} (bound off: clip=0); held-out loss; "
        f"wall {time.time() - t0:.0f}s.\n\n" + shaped_table(rows) + "\n" + shaped_verdict(rows)
    )
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "shaped.md").write_text(md)
    doc = dict(setup=_meta(setup, P), rows=rows, runs=results)
    (a.out / "shaped.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(md)
    return 0


def _runs(path: Path) -> list[dict]:
    """The runs of a shaped.json report, or of a BENCH_ROBUST_RUNS jsonl file."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)["runs"]


def _meta(setup: Setup, P: int) -> dict:
    c = setup.model
    return dict(
        params=P,
        model=dict(d=c.d, n_layer=c.n_layer, n_head=c.n_head, ctx=c.ctx),
        K=setup.K,
        k=setup.k,
        bits=setup.bits,
        steps=setup.steps,
        bsz=setup.bsz,
        outer_lr=setup.outer_lr,
        inner_lr=setup.inner_lr,
        max_train=setup.max_train,
        block=setup.block,
        robust=RobustConfig(
            clip=setup.clip,
            trust_shift=setup.trust_shift,
            support=setup.support,
            majority=setup.majority,
            weighted=setup.weighted,
            graded=setup.graded,
        ).__dict__,
    )


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())

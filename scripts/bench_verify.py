"""Replay spot checks: how likely a free-riding member is caught, what honest members risk, and
what the checks cost, on the models jobs train (`builtin:tiny`; `--model builtin:small`).

N members train in lockstep with DeMo (local mode, the job defaults K = 2, top-4, 1 bit), each
on its own batches. Every round each member commits to `digest(private_state)` before it
trains, as the protocol asks; from round 1 on the last f members cheat every round:

    stale       re-send its own packet of the previous round (no compute)
    copy        send another (honest) member's packet of the previous round (no compute)
    noise=X     its honest packet plus Gaussian noise of X times the honest packet's norm on the
                transmitted coefficients, re-quantized (X = 0.5, 1, 2)
    signflip    its honest packet negated (honest scale)
    random      no compute: a codec-valid random packet of the honest shape

A cheater that does not compute still commits to its real state (the one it holds), so a
replay from that state gives the packet it should have sent.

Spot-check model. After round r every member holds the same new shared state; its sha256
(`state_digest`) seeds the round's assignment (`assign`): member i is checked with
probability `rate`, by a checker drawn from the same hash. Nobody knows the assignment when
it commits (the state depends on every member's committed packet) and nobody sets it alone.
The checker verifies the fetched private state against the commitment, replays the round with
`dtrain_node.optim.reproduce` and compares bytes; a mismatch is a catch.

Measured here:
  - detection: every cheating packet and every honest packet is replayed (rate 1.0), at the
    member's thread count: cheaters' packets must all mismatch, honest ones never; honest
    packets are replayed again at another thread count (bytes, else top-k indices and signs);
  - the checks the assignment makes at `--rate` over the real runs' shared states;
  - catch probability within one round and one epoch (the job defaults: steps_per_epoch /
    sync_interval rounds) by Monte Carlo over `--seeds` epochs of the same assignment (fresh
    shared-state digests per seed and round) with the measured detections, against the closed
    form 1 - (1 - rate * d)^rounds (d: the measured detection rate, 1.0 here);
  - the economics at the chosen rate (Params defaults: operator share, fabrication slash,
    minimum stake) and the overhead (replay time / member round time x rate; private state
    bytes a checker fetches per check).

    python scripts/bench_verify.py            # docs/bench/verify.{json,md}, ~6 minutes on 2 cores
    python scripts/bench_verify.py --quick    # 4 members, 2 cheating rounds, about a minute
    python scripts/bench_verify.py --model builtin:small --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "node"))
sys.path.insert(0, str(ROOT / "sdk"))

from dtrain.models import JobSpec, Params  # noqa: E402
from dtrain_node.optim import codec  # noqa: E402
from dtrain_node.optim import reproduce as rp  # noqa: E402
from dtrain_node.optim.attacks import noise as random_packet  # noqa: E402
from dtrain_node.optim.attacks import signflip  # noqa: E402
from dtrain_node.optim.codec import Spec  # noqa: E402
from dtrain_node.optim.compress import CompressConfig, Sparse, quantize  # noqa: E402
from dtrain_node.optim.optimizer import DeMo, DeMoConfig  # noqa: E402
from dtrain_node.train.start import start_model  # noqa: E402

MODES = ("stale", "copy", "noise=0.5", "noise=1", "noise=2", "signflip", "random")
NO_COMPUTE = ("stale", "copy", "random")
_JOB = JobSpec.__dataclass_fields__
K = _JOB["sync_interval"].default  # 2: `dtrain job submit --sync`
STEPS_PER_EPOCH = _JOB["steps_per_epoch"].default  # 100: `dtrain job submit --steps`
ROUNDS_PER_EPOCH = STEPS_PER_EPOCH // K  # 50
TOPK = _JOB["topk_per_chunk"].default
BITS = _JOB["quant_bits"].default
RATE = 0.09  # the default spot-check rate (see `economics`)
TARGET = 0.99  # catch probability per epoch the rate must reach
THREADS, OTHER_THREADS = 1, 2


@dataclass(frozen=True)
class Setup:
    uri: str
    members: tuple[int, ...]
    cheaters: tuple[int, ...]
    rounds: int  # trained rounds per run; round 0 is honest, rounds 1.. cheat
    bsz: int
    ctx: int
    rate: float
    seeds: int  # Monte Carlo epochs


def setup(quick: bool, uri: str, rounds: int | None, rate: float, seeds: int | None) -> Setup:
    if quick:
        return Setup(uri, (4,), (1,), rounds or 3, 2, 32, rate, seeds or 4000)
    return Setup(uri, (6, 8), (1, 2), rounds or 16, 4, 128, rate, seeds or 20000)


# ------------------------------------------------------------------ spot-check assignment


def state_digest(shared: list[torch.Tensor]) -> bytes:
    """sha256 of the shared state (every member computes the same bytes)."""
    h = hashlib.sha256(b"dtrain/shared-state/1")
    for t in shared:
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.digest()


def _draw(seed: bytes, i: int) -> bytes:
    return hashlib.sha256(b"dtrain/spot-check/1" + seed + i.to_bytes(4, "big")).digest()


def assign(seed: bytes, n: int, rate: float) -> dict[int, int]:
    """The round's checks: checked member -> its checker (never itself), from the seed alone."""
    out = {}
    for i in range(n):
        h = _draw(seed, i)
        if int.from_bytes(h[:8], "big") < rate * 2**64:
            c = int.from_bytes(h[8:16], "big") % (n - 1)
            out[i] = c + (c >= i)
    return out


# ------------------------------------------------------------------ cheating packets


def add_noise(spec: Spec, pkt: bytes, x: float, seed: int) -> bytes:
    """The honest packet plus Gaussian noise of x times its norm (per tensor, on the
    transmitted coefficients), re-quantized at the same indices."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in codec.decode(spec, pkt):
        v = s.lvl.double() * 2.0**s.exp
        n = torch.randn(v.shape, generator=g, dtype=torch.float64)
        v = v + n * (x * v.norm() / n.norm().clamp_min(1e-300))
        lvl, exp = quantize(v.float(), spec.cfg.bits)
        out.append(Sparse(s.idx.clone(), lvl, exp))
    return codec.encode(spec, out)


def cheat(mode: str, spec: Spec, honest: bytes, prev: bytes, other: bytes, seed: int) -> bytes:
    if mode == "stale":
        return prev
    if mode == "copy":
        return other
    if mode == "signflip":
        return signflip(spec, honest)
    if mode == "random":
        return random_packet(spec, honest, seed)
    if mode.startswith("noise="):
        return add_noise(spec, honest, float(mode.partition("=")[2]), seed)
    raise ValueError(f"unknown mode {mode!r}")


# ------------------------------------------------------------------ the real runs


def _cfg() -> DeMoConfig:
    return DeMoConfig(
        mode="local", sync_interval=K, lr=1.0, compress=CompressConfig(k2d=TOPK, k1d=1, bits=BITS)
    )


def _models(uri: str, n: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)
    first = start_model(uri).fresh()
    out = [first]
    for _ in range(n - 1):
        m = start_model(uri).fresh()
        m.load_state_dict(first.state_dict())
        out.append(m)
    return out


def _loss(model):
    return lambda ids: model(input_ids=ids, labels=ids).loss


def _batches(s: Setup, w: int, r: int) -> list[torch.Tensor]:
    """Member w's batches for round r (its own shard: a seed of its own)."""
    g = torch.Generator().manual_seed(1_000_003 * w + r)
    return [torch.randint(0, 256, (s.bsz, s.ctx), generator=g) for _ in range(K)]


def private_bytes(state: rp.PrivateState) -> int:
    """What a checker fetches per check: error feedback and the AdamW moments (bench_replay)."""
    ts = [state["e"]["mat"], state["e"]["vec"]]
    ts += [v for s in state["inner"]["state"].values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in ts)


def _same_selection(spec: Spec, a: bytes, b: bytes) -> bool:
    for x, y in zip(codec.decode(spec, a), codec.decode(spec, b), strict=True):
        if not torch.equal(x.idx, y.idx) or not torch.equal(x.lvl.sign(), y.lvl.sign()):
            return False
    return True


class Checker:
    """Another process's model and optimizer: fetches (state, commitment), replays, compares."""

    def __init__(self, uri: str) -> None:
        (self.model,) = _models(uri, 1)
        self.opt = DeMo(self.model.named_parameters(), _cfg(), sender="checker")
        self.loss = _loss(self.model)
        self.replay_s: list[float] = []

    def replay(self, shared, state, commitment: bytes, batches) -> bytes:
        if rp.digest(state) != commitment:  # the fetched state is not the committed one
            raise AssertionError("private state does not match its commitment")
        t0 = time.perf_counter()
        got = rp.reproduce(self.opt, shared, state, batches, self.loss)
        self.replay_s.append(time.perf_counter() - t0)
        return got


def run(s: Setup, n: int, f: int, mode: str, checker: Checker, threads_check: bool) -> dict:
    """One lockstep run of n members, the last f cheating with `mode` from round 1 on."""
    torch.set_num_threads(THREADS)
    models = _models(s.uri, n)
    opts = [DeMo(m.named_parameters(), _cfg(), sender=f"m{w}") for w, m in enumerate(models)]
    losses = [_loss(m) for m in models]
    bad = set(range(n - f, n))
    spec = opts[0].spec
    rec = dict(n=n, cheaters=f, mode=mode, rounds=s.rounds)
    rec.update(cheats=0, caught=0, sent_honest=0, honest_checks=0, honest_mismatch=0)
    rec.update(other_threads_checks=0, other_threads_exact=0, other_threads_selection=0)
    rec.update(sampled_checks=0, sampled_cheats=0, sampled_caught=0, sampled_honest_mismatch=0)
    rec["detections"] = []  # per cheating packet: 1 if the replay mismatched
    train_s, prev, state_bytes = [], [None] * n, 0
    for r in range(s.rounds):
        shared = [t.clone() for t in opts[0].theta_sync]
        states = [rp.private_state(o) for o in opts]
        commits = [rp.digest(st) for st in states]
        honest, sent = [], []
        for w in range(n):
            t0 = time.perf_counter()
            for b in _batches(s, w, r):
                losses[w](b).backward()
                opts[w].inner_step()
            honest.append(opts[w].prepare())
            train_s.append(time.perf_counter() - t0)
        donor = min(set(range(n)) - bad)
        for w in range(n):
            cheating = w in bad and r > 0
            pkt = (
                cheat(mode, spec, honest[w], prev[w], prev[donor], 7919 * r + w)
                if cheating
                else honest[w]
            )
            sent.append((opts[w].sender, pkt))
        prev = honest
        st = opts[0].apply(sent)
        for o in opts[1:]:
            o.apply_aggregate(st.aggregate)
        checks = assign(state_digest(opts[0].theta_sync), n, s.rate)
        state_bytes = max(state_bytes, private_bytes(states[-1]))
        for w in range(n):
            got = checker.replay(shared, states[w], commits[w], _batches(s, w, r))
            mismatch = got != sent[w][1]
            cheating = w in bad and r > 0
            if cheating and sent[w][1] == honest[w]:
                rec["sent_honest"] += 1  # the "cheat" came out as the honest packet: no cheat
                cheating = False
            if cheating:
                rec["cheats"] += 1
                rec["caught"] += mismatch
                rec["detections"].append(int(mismatch))
            else:
                rec["honest_checks"] += 1
                rec["honest_mismatch"] += mismatch
            if w in checks:
                rec["sampled_checks"] += 1
                rec["sampled_cheats"] += cheating
                rec["sampled_caught"] += cheating and mismatch
                rec["sampled_honest_mismatch"] += (not cheating) and mismatch
            if threads_check and not cheating:
                torch.set_num_threads(OTHER_THREADS)
                other = checker.replay(shared, states[w], commits[w], _batches(s, w, r))
                torch.set_num_threads(THREADS)
                rec["other_threads_checks"] += 1
                rec["other_threads_exact"] += other == sent[w][1]
                rec["other_threads_selection"] += other == sent[w][1] or _same_selection(
                    spec, other, sent[w][1]
                )
    rec["train_s"] = train_s
    rec["private_state_bytes"] = state_bytes
    rec["packet_bytes"] = spec.packet_bytes
    rec["params"] = sum(p.numel() for p in models[0].parameters())
    return rec


# ------------------------------------------------------------------ Monte Carlo and closed form


def selections(n: int, rate: float, seeds: int, rounds: int) -> np.ndarray:
    """sel[seed, round, member]: checked under `assign`, over fresh shared-state digests (one
    per seed and round: a sha256 standing in for the states other jobs reach)."""
    sel = np.zeros((seeds, rounds, n), dtype=bool)
    for sd in range(seeds):
        for r in range(rounds):
            d = hashlib.sha256(f"dtrain/verify-sim/{n}/{sd}/{r}".encode()).digest()
            for i in assign(d, n, rate):
                sel[sd, r, i] = True
    return sel


def catch_probabilities(sel: np.ndarray, f: int, detections: list[int]) -> dict:
    """Monte Carlo: the last f members cheat every round; a checked cheating round is caught
    when its replay mismatched (detections, cycled over the rounds)."""
    seeds, rounds, n = sel.shape
    det = np.resize(np.array(detections or [0], dtype=bool), rounds)
    caught = sel[:, :, n - f :] & det[None, :, None]  # (seeds, rounds, f)
    d = float(np.mean(detections)) if detections else 0.0
    return dict(
        round_sim=float(caught.mean()),
        epoch_sim=float(caught.any(axis=1).mean()),
        detection=d,
        samples_round=int(caught.size),
        samples_epoch=int(seeds * f),
    )


def closed_form(rate: float, rounds: int, d: float = 1.0) -> float:
    return 1 - (1 - rate * d) ** rounds


def min_rate(target: float, rounds: int) -> float:
    return 1 - (1 - target) ** (1 / rounds)


def economics(rate: float, rounds: int) -> dict:
    """Cheating pays `(1 - q) * pay` and loses `q * slash` (caught: slashed at the fabrication
    rate and not paid for the epoch); it also saves at most the compute cost C <= pay of the
    skipped work. Negative expected value against honest work iff
        q * (pay + slash) > C,   sufficient with C <= pay:   q * slash > (1 - q) * pay,
    pay = operator_bps * price, slash = fabrication_slash_bps * stake >= that of min_stake."""
    p = Params.__dataclass_fields__
    op_bps = p["operator_bps"].default
    fab_bps = p["fabrication_slash_bps"].default
    min_stake = p["min_stake"].default
    q = closed_form(rate, rounds)
    slash = min_stake * fab_bps / 10_000
    # the highest price per operator-epoch for which cheating loses, at the minimum stake
    max_price = q * slash / ((1 - q) * op_bps / 10_000)
    return dict(
        operator_bps=op_bps,
        fabrication_slash_bps=fab_bps,
        min_stake_wei=min_stake,
        rounds_per_epoch=rounds,
        rate=rate,
        catch_per_epoch=q,
        min_rate_for_target=min_rate(TARGET, rounds),
        slash_at_min_stake_eth=slash / 1e18,
        max_price_per_operator_epoch_eth=max_price / 1e18,
    )


# ------------------------------------------------------------------ the bench


def bench(s: Setup, log=print) -> dict:
    checker = Checker(s.uri)
    runs = []
    for n in s.members:
        for f in s.cheaters:
            for mode in MODES:
                t0 = time.time()
                first = n == s.members[0] and f == s.cheaters[0] and mode == MODES[0]
                r = run(s, n, f, mode, checker, threads_check=first)
                log(
                    f"  n={n} f={f} {mode:9s}: caught {r['caught']}/{r['cheats']}, honest "
                    f"mismatches {r['honest_mismatch']}/{r['honest_checks']} "
                    f"({time.time() - t0:.0f}s)",
                    flush=True,
                )
                runs.append(r)
    rows = []
    for n in s.members:
        sel = selections(n, s.rate, s.seeds, ROUNDS_PER_EPOCH)
        for f in s.cheaters:
            for mode in MODES:
                (r,) = [x for x in runs if (x["n"], x["cheaters"], x["mode"]) == (n, f, mode)]
                cp = catch_probabilities(sel, f, r["detections"])
                rows.append(
                    dict(
                        n=n,
                        cheaters=f,
                        mode=mode,
                        computes=mode not in NO_COMPUTE,
                        cheats=r["cheats"],
                        caught=r["caught"],
                        sent_honest=r["sent_honest"],
                        honest_checks=r["honest_checks"],
                        honest_mismatch=r["honest_mismatch"],
                        sampled_checks=r["sampled_checks"],
                        sampled_cheats=r["sampled_cheats"],
                        sampled_caught=r["sampled_caught"],
                        **cp,
                        round_closed=closed_form(s.rate, 1, cp["detection"]),
                        epoch_closed=closed_form(s.rate, ROUNDS_PER_EPOCH, cp["detection"]),
                    )
                )
    train = [x for r in runs for x in r["train_s"]]
    round_s, replay_s = statistics.median(train), statistics.median(checker.replay_s)
    sampled = sum(r["sampled_checks"] for r in runs)
    member_rounds = sum(r["n"] * r["rounds"] for r in runs)
    last = runs[-1]
    overhead = dict(
        member_round_s=round_s,
        replay_s=replay_s,
        replay_per_round=replay_s / round_s,
        compute_fraction=s.rate * replay_s / round_s,
        sampled_checks=sampled,
        member_rounds=member_rounds,
        sampled_fraction=sampled / member_rounds,
        private_state_bytes_per_check=last["private_state_bytes"],
        batch_bytes_per_check=K * s.bsz * s.ctx * 8,
        packet_bytes=last["packet_bytes"],
        fetched_bytes_per_member_round=s.rate * last["private_state_bytes"],
    )
    honest = dict(
        checks=sum(r["honest_checks"] for r in runs),
        mismatches=sum(r["honest_mismatch"] for r in runs),
        sampled_mismatches=sum(r["sampled_honest_mismatch"] for r in runs),
        threads=THREADS,
        other_threads=OTHER_THREADS,
        other_threads_checks=sum(r["other_threads_checks"] for r in runs),
        other_threads_exact=sum(r["other_threads_exact"] for r in runs),
        other_threads_same_selection=sum(r["other_threads_selection"] for r in runs),
    )
    return dict(
        model=s.uri,
        params=last["params"],
        K=K,
        steps_per_epoch=STEPS_PER_EPOCH,
        rounds_per_epoch=ROUNDS_PER_EPOCH,
        rounds_trained=s.rounds,
        batch=[s.bsz, s.ctx],
        rate=s.rate,
        seeds=s.seeds,
        rows=rows,
        honest=honest,
        overhead=overhead,
        economics=economics(s.rate, ROUNDS_PER_EPOCH),
    )


def table(res: dict) -> str:
    head = (
        "| n | cheaters | mode | computes | caught when replayed | caught in 1 round, sim "
        "| closed form | caught in 1 epoch, sim | closed form | sampled checks (cheats caught) |\n"
        "|---:|---:|---|---|---:|---:|---:|---:|---:|---:|\n"
    )
    return head + "".join(
        f"| {r['n']} | {r['cheaters']} | {r['mode']} | {'yes' if r['computes'] else 'no'} "
        f"| {r['caught']}/{r['cheats']} | {r['round_sim']:.4f} | {r['round_closed']:.4f} "
        f"| {r['epoch_sim']:.4f} | {r['epoch_closed']:.4f} "
        f"| {r['sampled_checks']} ({r['sampled_caught']}/{r['sampled_cheats']}) |\n"
        for r in res["rows"]
    )


def markdown(res: dict, cmd: str) -> str:
    h, o, e = res["honest"], res["overhead"], res["economics"]
    return (
        f"Replay spot checks (scripts/bench_verify.py): {res['model']} "
        f"({res['params']:,} parameters), K={res['K']}, batch {res['batch'][0]}x{res['batch'][1]}, "
        f"{res['rounds_trained']} trained rounds per run (round 0 honest), rate "
        f"{res['rate']:g}, epoch = {res['steps_per_epoch']} steps / K = "
        f"{res['rounds_per_epoch']} rounds, {res['seeds']:,} simulated epochs per row. "
        f"`{cmd}`\n\n"
        + table(res)
        + f"\nHonest replays: {h['mismatches']} mismatches in {h['checks']:,} checks at "
        f"{h['threads']} thread (as the member); at {h['other_threads']} threads "
        f"{h['other_threads_exact']}/{h['other_threads_checks']} byte-exact, "
        f"{h['other_threads_same_selection']}/{h['other_threads_checks']} same top-k indices "
        f"and signs.\n\n"
        f"Overhead at rate {res['rate']:g}: a replay takes {o['replay_s']:.3f} s against "
        f"{o['member_round_s']:.3f} s for a member's round ({o['replay_per_round']:.2f}x), so "
        f"checks cost {100 * o['compute_fraction']:.1f}% of training compute (sampled: "
        f"{o['sampled_checks']} checks in {o['member_rounds']} member-rounds, "
        f"{100 * o['sampled_fraction']:.1f}%); a check fetches "
        f"{o['private_state_bytes_per_check'] / 2**20:.2f} MiB of private state (the batches "
        f"are {o['batch_bytes_per_check'] / 2**10:.0f} KiB of token ids, or indices into the "
        f"dataset), {o['fetched_bytes_per_member_round'] / 2**20:.2f} MiB per member-round on "
        f"average against a {o['packet_bytes'] / 2**10:.1f} KiB packet.\n\n"
        f"Economics: q = 1 - (1 - {e['rate']:g})^{e['rounds_per_epoch']} = "
        f"{e['catch_per_epoch']:.4f} per epoch (>= {TARGET} needs rate >= "
        f"{e['min_rate_for_target']:.4f}); cheating loses when q x slash > (1 - q) x pay, "
        f"pay = {e['operator_bps'] / 100:g}% of the price, slash = "
        f"{e['fabrication_slash_bps'] / 100:g}% of stake >= {e['slash_at_min_stake_eth']:g} "
        f"ETH at the minimum stake: true for any price up to "
        f"{e['max_price_per_operator_epoch_eth']:.1f} ETH per operator-epoch.\n"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 members, 1 cheater, 3 rounds")
    ap.add_argument("--model", default="builtin:tiny")
    ap.add_argument("--rounds", type=int, default=None, help="trained rounds per run")
    ap.add_argument("--rate", type=float, default=RATE)
    ap.add_argument("--seeds", type=int, default=None, help="simulated epochs per row")
    ap.add_argument("--members", type=int, nargs="+", default=None, help="default 6 8")
    ap.add_argument("--cheaters", type=int, nargs="+", default=None, help="default 1 2")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    s = setup(a.quick, a.model, a.rounds, a.rate, a.seeds)
    if a.members or a.cheaters:
        s = replace(
            s, members=tuple(a.members or s.members), cheaters=tuple(a.cheaters or s.cheaters)
        )
    out = a.out or ROOT / "docs" / "bench" / ("quick" if a.quick else "")
    res = bench(s)
    cmd = "python scripts/bench_verify.py" + " ".join(["", *(argv or sys.argv[1:])]).rstrip()
    md = markdown(res, cmd)
    stem = "verify" if s.uri == "builtin:tiny" else "verify_" + s.uri.split(":")[-1]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

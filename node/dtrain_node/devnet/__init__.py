"""The whole story on one machine: `make demo`.

Starts anvil, deploys the BSM, registers operators and stakers, submits a continued
pre-training job (small Llama-style model, offline corpus of Python stdlib sources), launches one
operator node per OS process (real libp2p gossip between them), lets a late operator join at an
epoch boundary, makes one operator fabricate its checkpoint and one go offline mid-epoch, then
prints and writes (demo-result.json) per epoch the members, the quorum hash, who was paid and
who was slashed and why, every account's balance change against the 40/20/20/20 split, the
held-out loss before and after, the upload bytes per sync against a dense all-reduce, and the
final checkpoint with its on-chain hash. Exits non-zero when any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ETH = 10**18
REASONS = ["fabricated checkpoint", "offline mid-epoch", "failed to sync", "external"]


@dataclass
class Proc:
    name: str
    address: str
    popen: subprocess.Popen
    data_dir: Path
    faults: list[str] = field(default_factory=list)


def spawn_node(
    name: str,
    key: str,
    address: str,
    rpc: str,
    contract: str,
    job_id: int,
    data_dir: Path,
    faults: list[str],
    round_deadline: float,
    linger: float,
) -> Proc:
    data_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "dtrain.cli",
        "--rpc-url",
        rpc,
        "--contract",
        contract,
        "--key",
        key,
        "--json",
        "node",
        "run",
        "--data-dir",
        str(data_dir),
        "--job",
        str(job_id),
        "--round-deadline",
        str(round_deadline),
        "--linger",
        str(linger),
        "--no-withdraw",
    ]
    for f in faults:
        cmd += ["--fault", f]
    out = open(data_dir / "stdout.log", "w")  # noqa: SIM115 - lives as long as the process
    # Several nodes share the machine's cores: one thread each avoids oversubscription.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    p = subprocess.Popen(
        cmd,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    return Proc(name, address, p, data_dir, faults)


def stop_all(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            os.killpg(p.popen.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()


class Cluster:
    """A local chain, a deployed BSM, one CPT job and operator nodes as OS processes (for the
    end-to-end tests and the node benchmark)."""

    def __init__(
        self,
        tmp: Path,
        operators: int,
        epochs: int = 1,
        steps: int = 10,
        sync: int = 5,
        epoch_duration: int = 150,
        round_deadline: float = 30.0,
        method: str = "cpt",
    ) -> None:
        self.tmp, self.n, self.method = tmp, operators, method
        self.epochs, self.steps, self.sync = epochs, steps, sync
        self.epoch_duration, self.round_deadline = epoch_duration, round_deadline
        self.procs: list[Proc] = []

    def __enter__(self) -> Cluster:
        from dtrain import BSM, JobSpec, LocalChain, Method, Params
        from dtrain_node.train import checkpoint, corpus
        from dtrain_node.train import models as hf

        self.chain = LocalChain(accounts=8).start()
        acc = self.chain.accounts
        self.treasury, self.developer, self.caller = acc[5], acc[6], acc[7]
        self.ops = acc[1 : 1 + self.n]
        self.bsm = BSM.deploy(
            self.chain.url,
            acc[0].key,
            Params(treasury=self.treasury.address, developer=self.developer.address),
        )
        if self.method == "cpt":
            data = self.tmp / "corpus.txt"
            digest = corpus.build_stdlib_corpus(data, max_bytes=200_000)
        else:
            data, digest = make_dataset(self.tmp, self.method)
        job_id = self.bsm.next_job_id()
        init = hf.build(hf.PRESETS["tiny"], seed=job_id)
        self.spec = JobSpec(
            price_per_operator_epoch=ETH // 100,
            total_epochs=self.epochs,
            steps_per_epoch=self.steps,
            sync_interval=self.sync,
            min_operators=self.n,
            max_operators=self.n,
            method=Method[self.method.upper()],
            model_hash=checkpoint.canonical_hash(dict(init.state_dict())),
            model_uri="builtin:tiny",
            dataset_hash=digest,
            dataset_uri=str(data),
            epoch_duration=self.epoch_duration,
        )
        self.job_id = self.bsm.with_account(self.caller.key).create_job(self.spec)
        return self

    def spawn(self, i: int, faults: list[str] | None = None) -> Proc:
        o = self.ops[i]
        p = spawn_node(
            f"op{i + 1}",
            o.key,
            o.address,
            self.chain.url,
            self.bsm.address,
            self.job_id,
            self.tmp / f"op{i + 1}",
            faults or [],
            self.round_deadline,
            linger=0,
        )
        self.procs.append(p)
        return p

    def wait(self, cond: Any, timeout: float, what: str) -> None:
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if cond():
                return
            crashed = [p.name for p in self.procs if p.popen.poll() not in (None, 0, -9)]
            if crashed:
                raise AssertionError(
                    f"node(s) {crashed} failed while waiting for {what}: " + self.logs()
                )
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: " + self.logs())

    def ended(self) -> bool:
        return self.bsm.job(self.job_id).state.status.name in ("COMPLETED", "FAILED")

    def metrics(self, i: int) -> list[dict[str, Any]]:
        path = self.tmp / f"op{i + 1}" / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def logs(self) -> str:
        out = []
        for p in self.procs:
            f = p.data_dir / "stdout.log"
            if f.is_file():
                out.append(f"--- {p.name}\n" + "\n".join(f.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def __exit__(self, *exc: object) -> None:
        stop_all(self.procs)
        self.chain.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--operators", type=int, default=3, help="operators at the start")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="training steps per epoch")
    ap.add_argument("--sync", type=int, default=4, help="DeMo sync every K steps")
    ap.add_argument("--epoch-duration", type=int, default=150, help="seconds per epoch deadline")
    ap.add_argument("--round-deadline", type=float, default=30.0)
    ap.add_argument(
        "--method",
        choices=["cpt", "sft", "dpo", "grpo"],
        default="cpt",
        help="training method of the job",
    )
    ap.add_argument("--no-faults", action="store_true", help="every operator honest")
    ap.add_argument("--no-late-join", action="store_true", help="no operator joins later")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--run-dir", type=Path, default=None)
    a = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the chain and the nodes are always stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from dtrain import BSM, JobSpec, LocalChain, Method, Params
    from dtrain.models import JobStatus
    from dtrain_node.train import checkpoint
    from dtrain_node.train import models as hf

    run_dir = (a.run_dir or Path.cwd() / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    checks: list[tuple[str, bool, str]] = []

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append((name, bool(ok), detail))

    procs: list[Proc] = []
    with LocalChain(accounts=14) as chain:
        acc = chain.accounts
        treasury, developer, caller = acc[10], acc[11], acc[9]
        stakers = [acc[12], acc[13]]
        n_ops = a.operators + (0 if a.no_late_join else 1)
        ops = acc[1 : 1 + n_ops]
        bsm = BSM.deploy(
            chain.url,
            acc[0].key,
            Params(treasury=treasury.address, developer=developer.address, unbonding_period=3600),
        )
        print(f"chain {chain.url}  contract {bsm.address}")

        # Operators register up front so stakers can delegate; nodes then publish their
        # libp2p addresses (updateOperator) when they start.
        for o in ops:
            bsm.with_account(o.key).register_operator(ETH, b"\0" * 32, [], "cpu", 0)
        delegations = {
            stakers[0].address: (ops[0].address, 2 * ETH),
            stakers[1].address: (ops[1].address, ETH),
        }
        for s in stakers:
            target, amount = delegations[s.address]
            bsm.with_account(s.key).delegate(target, amount)

        data, dataset_hash = make_dataset(run_dir, a.method)
        job_id = bsm.next_job_id()
        cfg = hf.PRESETS["tiny"]
        init = hf.build(cfg, seed=job_id)
        model_hash = checkpoint.canonical_hash(dict(init.state_dict()))
        price = ETH // 100
        spec = JobSpec(
            price_per_operator_epoch=price,
            total_epochs=a.epochs,
            steps_per_epoch=a.steps,
            sync_interval=a.sync,
            min_operators=a.operators,
            max_operators=a.operators + 1,
            method=Method[a.method.upper()],
            model_hash=model_hash,
            model_uri="builtin:tiny",
            dataset_hash=dataset_hash,
            dataset_uri=str(data),
            topk_per_chunk=4,
            quant_bits=2,
            epoch_duration=a.epoch_duration,
        )
        wallets0 = {x.address: bsm.w3.eth.get_balance(x.address) for x in acc}
        job_id = bsm.with_account(caller.key).create_job(spec)
        print(
            f"job {job_id}: {a.method.upper()}, {a.epochs} epochs x {a.steps} steps, "
            f"sync every {a.sync}, "
            f"{sum(p.numel() for p in init.parameters()):,} parameters, "
            f"escrow {spec.escrow / ETH:g} ETH"
        )

        faults: dict[int, list[str]] = {}
        if not a.no_faults:
            faults[1] = ["fabricate", "epoch=1"]  # op2 lies about its checkpoint in epoch 1
            # op3 vanishes before the last round of epoch 2
            faults[2] = [f"offline={a.steps // a.sync - 1}", "epoch=2"]
        for i in range(a.operators):
            procs.append(
                spawn_node(
                    f"op{i + 1}",
                    ops[i].key,
                    ops[i].address,
                    chain.url,
                    bsm.address,
                    job_id,
                    run_dir / f"op{i + 1}",
                    faults.get(i, []),
                    a.round_deadline,
                    linger=60,
                )
            )
        members_by_epoch: dict[int, list[str]] = {}
        late_started = a.no_late_join
        t_end = time.monotonic() + a.timeout
        try:
            while time.monotonic() < t_end:
                j = bsm.job(job_id)
                if j.state.status == JobStatus.RUNNING:
                    members_by_epoch[j.state.epoch] = list(j.members)
                if not late_started and j.state.status == JobStatus.RUNNING:
                    late = ops[a.operators]
                    procs.append(
                        spawn_node(
                            f"op{a.operators + 1}",
                            late.key,
                            late.address,
                            chain.url,
                            bsm.address,
                            job_id,
                            run_dir / f"op{a.operators + 1}",
                            [],
                            a.round_deadline,
                            linger=60,
                        )
                    )
                    late_started = True
                if j.state.status.is_ended:
                    break
                crashed = [
                    p
                    for p in procs
                    if p.popen.poll() not in (None, 0)
                    and not any(f.startswith("offline") for f in p.faults)
                ]
                if crashed:
                    print("node failed:", [(p.name, p.popen.returncode) for p in crashed])
                    break
                time.sleep(0.5)
            job = bsm.job(job_id)
            check(
                "job completed",
                job.state.status == JobStatus.COMPLETED,
                job.state.status.name.lower(),
            )
            result = report(
                bsm,
                job,
                spec,
                ops,
                stakers,
                delegations,
                treasury,
                developer,
                caller,
                members_by_epoch,
                procs,
                check,
                init,
                wallets0,
            )
            # The caller fetches the final checkpoint from the operators and loads it.
            out = run_dir / "final-model"
            fetched = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "dtrain.cli",
                    "--rpc-url",
                    chain.url,
                    "--contract",
                    bsm.address,
                    "--json",
                    "job",
                    "fetch",
                    str(job_id),
                    "--out",
                    str(out),
                ],
                capture_output=True,
                text=True,
                timeout=180,
            )
            check(
                "caller fetched the final checkpoint",
                fetched.returncode == 0,
                fetched.stderr.strip()[-300:],
            )
            if fetched.returncode == 0:
                result["final_model_dir"] = str(out)
                result.update(evaluate_export(out, spec, job_id, check))
        finally:
            stop_all(procs)

    result["checks"] = [{"check": n, "ok": ok, "detail": d} for n, ok, d in checks]
    path = run_dir / "demo-result.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print()
    for n, ok, d in checks:
        print(f"  [{'ok' if ok else 'FAIL'}] {n}" + (f"  ({d})" if d and not ok else ""))
    print(f"\nresult: {path}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def report(
    bsm,
    job,
    spec,
    ops,
    stakers,
    delegations,
    treasury,
    developer,
    caller,
    members_by_epoch,
    procs,
    check,
    init,
    wallets0,
) -> dict[str, Any]:
    """Per-epoch table and the balance check, recomputed here from the events alone."""
    P = spec.price_per_operator_epoch
    events = bsm.events(job_id=job.id)
    epochs: list[dict[str, Any]] = []
    for e in range(spec.total_epochs):
        fin = [x for x in events if x.name == "EpochFinalized" and x.args["epoch"] == e]
        paid = [
            x.args["operator"] for x in events if x.name == "OperatorPaid" and x.args["epoch"] == e
        ]
        slashed = [
            {
                "address": x.args["operator"],
                "reason": REASONS[x.args["reason"]],
                "amount": x.args["amount"],
                "reporter": x.args["reporter"],
            }
            for x in events
            if x.name == "Slashed" and x.args["epoch"] == e
        ]
        epochs.append(
            {
                "epoch": e,
                "members": members_by_epoch.get(e, []),
                "quorum_hash": "0x" + fin[0].args["checkpoint"].hex() if fin else None,
                "paid": paid,
                "slashed": slashed,
            }
        )
    names = {o.address: f"op{i + 1}" for i, o in enumerate(ops)}
    names.update({s.address: f"staker{i + 1}" for i, s in enumerate(stakers)})
    names.update(
        {treasury.address: "treasury", developer.address: "developer", caller.address: "caller"}
    )

    # Expected credits from the events: 40% operator, 20% pool by shares (reward per share,
    # as the contract rounds), 20% treasury, 20% developer, slashes 10% to the reporter and the
    # rest to the caller, unearned escrow back to the caller.
    expected: dict[str, int] = dict.fromkeys(names, 0)
    shares = {o.address: {o.address: ETH} for o in ops}
    for s, (op, amount) in delegations.items():
        shares[op][s] = amount
    rps = dict.fromkeys(shares, 0)
    n_paid = 0
    for ep in epochs:
        for op in ep["paid"]:
            n_paid += 1
            expected[op] += P * 40 // 100
            rps[op] += (P * 20 // 100) * ETH // sum(shares[op].values())
            expected[treasury.address] += P * 20 // 100
            expected[developer.address] += P * 20 // 100
        if ep["slashed"]:
            # One finalize settles the epoch: 10% of what it slashed from others to its sender,
            # the rest to the caller.
            reporter = ep["slashed"][0]["reporter"]
            total = sum(s["amount"] for s in ep["slashed"])
            others = sum(s["amount"] for s in ep["slashed"] if s["address"] != reporter)
            bounty = others * 10 // 100
            expected[reporter] = expected.get(reporter, 0) + bounty
            expected[caller.address] += total - bounty
    for op, holders in shares.items():
        for who, sh in holders.items():
            expected[who] += sh * rps[op] // ETH
    if job.state.status.is_ended:
        expected[caller.address] += spec.escrow - n_paid * P  # unearned escrow refunded

    balances = []
    all_ok = True
    for addr, name in names.items():
        credit = bsm.credit_of(addr) + sum(bsm.pending_rewards(o.address, addr) for o in ops)
        ok = credit == expected.get(addr, 0)
        all_ok &= ok
        balances.append(
            {
                "account": name,
                "address": addr,
                "expected": expected.get(addr, 0),
                "credited": credit,
                "ok": ok,
                "wallet_before": wallets0.get(addr),
            }
        )
    check("every account's credit matches 40/20/20/20 and the slashes", all_ok)

    paid_total = sum(len(ep["paid"]) for ep in epochs)
    slashed_reasons = sorted({s["reason"] for ep in epochs for s in ep["slashed"]})
    check("operators were paid", paid_total > 0, str(paid_total))
    faulty = [p for p in procs if p.faults]
    if faulty:
        check("fabricated checkpoint slashed", "fabricated checkpoint" in slashed_reasons)
        check("offline operator slashed", "offline mid-epoch" in slashed_reasons)
    late = procs[-1] if len(procs) > 3 else None
    if late is not None:
        joined = any(late.address in ep["members"] for ep in epochs[1:])
        check(
            "late operator joined at a boundary",
            joined and late.address not in epochs[0]["members"],
        )
    onchain = job.state.checkpoint
    check("final checkpoint on-chain", any(onchain), "0x" + onchain.hex())

    # Communication: packet bytes per sync from the nodes' metrics vs a dense ring all-reduce.
    sent = []
    for p in procs:
        mpath = p.data_dir / "metrics.jsonl"
        if mpath.is_file():
            for line in mpath.read_text().splitlines():
                r = json.loads(line)
                if r.get("kind") == "round":
                    sent.append(r["bytes_out"])
    n_params = sum(t.numel() for t in init.parameters())
    n = max(len(ep["members"]) for ep in epochs) or 1
    dense_bf16 = 2 * (n - 1) / n * n_params * 2
    per_sync = sorted(sent)[len(sent) // 2] if sent else 0
    comm = {
        "upload_bytes_per_sync": per_sync,
        "dense_bf16_allreduce_bytes": int(dense_bf16),
        "ratio_vs_bf16": round(dense_bf16 / per_sync, 1) if per_sync else None,
        "params": n_params,
    }
    check(
        "DeMo upload far below dense bf16",
        per_sync and dense_bf16 / per_sync > 50,
        json.dumps(comm),
    )

    print_table(epochs, balances, names, comm)
    return {
        "job_id": job.id,
        "status": job.state.status.name.lower(),
        "final_checkpoint": "0x" + onchain.hex(),
        "epochs": epochs,
        "balances": balances,
        "communication": comm,
    }


def make_dataset(run_dir: Path, method: str) -> tuple[Path, bytes]:
    """The job's dataset file and its sha256: stdlib sources for CPT, generated tasks with
    checkable answers for the others."""
    from dtrain_node.train import corpus, tasks

    if method == "cpt":
        path = run_dir / "corpus.txt"
        return path, corpus.build_stdlib_corpus(path, max_bytes=600_000)
    problems = {
        "sft": lambda: tasks.addition(600, digits=2, seed=0),
        "dpo": lambda: tasks.reversal(600, length=3, seed=0),
        "grpo": lambda: tasks.last_letter(600, length=4, seed=0),
    }[method]()
    path = run_dir / f"{method}.jsonl"
    return path, tasks.make_dataset(path, method, problems)


def evaluate_export(out: Path, spec: Any, job_id: int, check: Any) -> dict[str, Any]:
    """Loads the caller's copy with transformers, evaluates it against the initial model with
    the job's method (held-out loss for CPT/SFT, preference accuracy for DPO, reward for GRPO)
    and generates text."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_node.train.backend import TrainJob, make_backend

    backend = make_backend(
        TrainJob(
            job_id, spec.method.name.lower(), spec.model_uri, spec.dataset_uri, spec.dataset_hash
        )
    )
    before = backend.evaluate()
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    backend.model.load_state_dict(model.state_dict())
    after = backend.evaluate()
    with torch.no_grad():
        ids = tok("def " if spec.method.name == "CPT" else "3+4=", return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=24, do_sample=False)
    sample = tok.decode(gen[0])
    if "heldout_loss" in after:
        check(
            "held-out loss went down",
            after["heldout_loss"] < before["heldout_loss"],
            f"{before['heldout_loss']:.3f} -> {after['heldout_loss']:.3f}",
        )
    check("final checkpoint loads with transformers and generates", len(gen[0]) > len(ids[0]))
    print(f"\nevaluation before {before} after {after}; sample: {sample!r}")
    return {
        "eval_before": before,
        "eval_after": after,
        "sample": sample,
        **(
            {
                "heldout_loss_before": before["heldout_loss"],
                "heldout_loss_after": after["heldout_loss"],
            }
            if "heldout_loss" in after
            else {}
        ),
    }


def print_table(epochs, balances, names, comm) -> None:
    def n(a: str) -> str:
        return names.get(a, a[:10])

    print("\nepoch  members                 quorum hash        paid                  slashed")
    for ep in epochs:
        slashed = (
            ", ".join(
                f"{n(s['address'])} ({s['reason']}, {s['amount'] / ETH:g} ETH)"
                for s in ep["slashed"]
            )
            or "-"
        )
        print(
            f"{ep['epoch']:>5}  {' '.join(n(m) for m in ep['members']):<22}  "
            f"{(ep['quorum_hash'] or 'no quorum')[:18]:<18} "
            f"{' '.join(n(m) for m in ep['paid']):<21} {slashed}"
        )
    print("\naccount     expected credit   credited          ok")
    for b in balances:
        print(
            f"{b['account']:<11} {b['expected'] / ETH:<17.6f} {b['credited'] / ETH:<17.6f} "
            f"{'yes' if b['ok'] else 'NO'}"
        )
    print(
        f"\nupload per sync {comm['upload_bytes_per_sync']:,} B vs dense bf16 all-reduce "
        f"{comm['dense_bf16_allreduce_bytes']:,} B ({comm['ratio_vs_bf16']}x less)"
    )


"""Held-out metric of each training method before/after a fixed step budget: one worker (plain
AdamW) vs 3 in-process workers with DeMo sync (local mode, lockstep rounds).

Every worker takes the same number of steps, so 3 workers see 3x the data for the same wall-clock
budget on 3 machines. Writes docs/bench/methods.{json,md} (--quick: docs/bench/quick/).

    nice .venv/bin/python scripts/bench_methods.py --quick

`--devnet BACKEND:METHOD,...` (torchtune:sft, torchtune:dpo, axolotl:sft) runs instead one devnet
job per entry (a local chain, 2 operator nodes as processes) on a GPT-2 folder (`dtrain model
init gpt2`): the caller fetches the export, reloads it with `from_pretrained` and scores the
held-out loss the job reported. axolotl:sft is the job of an axolotl YAML config (alpaca records,
LoRA) read by `dtrain.axolotl`. Its rows replace the same backend and method's rows in
docs/bench/methods.json and the devnet table of docs/bench/methods.md.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dtrain_node.optim.optimizer import DeMo, DeMoConfig, lockstep
from dtrain_node.train import corpus, tasks
from dtrain_node.train.backend import TrainJob, make_backend

ROOT = Path(__file__).resolve().parent.parent
K = 4  # inner steps per DeMo sync


@dataclass(frozen=True)
class Setup:
    method: str
    task: str
    metric: str
    higher_is_better: bool
    inner_lr: float
    steps: int


def setups(quick: bool) -> list[Setup]:
    s = 1 if quick else 4
    return [
        Setup("cpt", "stdlib sources, ctx 128", "heldout_loss", False, 3e-3, 40 * s),
        Setup("sft", "2-digit addition", "heldout_loss", False, 3e-3, 60 * s),
        Setup("dpo", "reversal of 4 letters", "preference_accuracy", True, 1e-3, 40 * s),
        Setup("grpo", "last letter of 4, G=8", "mean_reward", True, 3e-3, 24 * s),
    ]


def dataset(method: str, work: Path, quick: bool) -> tuple[str, bytes]:
    n = 1000 if quick else 4000
    if method == "cpt":
        path = work / "cpt.txt"
        return str(path), corpus.build_stdlib_corpus(path, 300_000 if quick else 2_000_000)
    path = work / f"{method}.jsonl"
    probs = {
        "sft": lambda: tasks.addition(n, digits=2, seed=0),
        "dpo": lambda: tasks.reversal(n, length=4, seed=0),
        "grpo": lambda: tasks.last_letter(n, length=4, seed=0),
    }[method]()
    return str(path), tasks.make_dataset(path, method, probs)


def run(setup: Setup, workers: int, uri: str, h: bytes) -> dict:
    batch = 16 if setup.method != "cpt" else 8
    job = TrainJob(
        job_id=7,
        method=setup.method,
        model_uri="builtin:tiny",
        dataset_uri=uri,
        dataset_hash=h,
        batch_size=batch,
    )
    bs = [make_backend(job) for _ in range(workers)]
    n = bs[0].n_items()
    its = [b.batches(torch.arange(w, n, workers), job.batch_size, w) for w, b in enumerate(bs)]
    before = bs[0].evaluate()
    t0 = time.perf_counter()
    if workers == 1:
        opt = torch.optim.AdamW(bs[0].model.parameters(), lr=setup.inner_lr, betas=(0.9, 0.95))
        for _ in range(setup.steps):
            bs[0].loss(next(its[0])).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    else:
        cfg = DeMoConfig(mode="local", sync_interval=K, lr=1.0, inner_lr=setup.inner_lr)
        opts = [DeMo(b.model.named_parameters(), cfg, sender=w) for w, b in enumerate(bs)]
        for _ in range(setup.steps // K):
            for b, o, it in zip(bs, opts, its, strict=True):
                for _ in range(K):
                    b.loss(next(it)).backward()
                    o.inner_step()
            lockstep(opts)
    seconds = time.perf_counter() - t0
    after = bs[0].evaluate()
    return {
        "method": setup.method,
        "task": setup.task,
        "workers": workers,
        "steps_per_worker": setup.steps,
        "metric": setup.metric,
        "higher_is_better": setup.higher_is_better,
        "before": before[setup.metric],
        "after": after[setup.metric],
        "before_all": before,
        "after_all": after,
        "train_seconds": round(seconds, 2),
    }


def table(records: list[dict]) -> str:
    lines = [
        "| method | task | workers | steps/worker | metric | before | after | other metrics after "
        "| train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        other = ", ".join(f"{k} {v:.3f}" for k, v in r["after_all"].items() if k != r["metric"])
        lines.append(
            f"| {r['method']} | {r['task']} | {r['workers']} | {r['steps_per_worker']} | "
            f"{r['metric']} | {r['before']:.3f} | {r['after']:.3f} | {other or '-'} | "
            f"{r['train_seconds']:.1f} |"
        )
    return "\n".join(lines) + "\n"


DEVNET_TASKS = {
    ("torchtune", "sft"): "2-digit addition",
    ("torchtune", "dpo"): "reversal of 4 letters",
    ("axolotl", "sft"): "2-digit addition, alpaca records, LoRA r=8 (axolotl YAML)",
}
DEVNET_STEPS, DEVNET_SYNC = 32, 2  # steps per worker (one epoch), DeMo sync every K steps
TORCHTUNE_RECIPE = 'backend = "torchtune"\nbatch_size = 8\nseq_len = 64\ninner_lr = {lr}\n'
AXOLOTL_CONFIG = """\
base_model: ./gpt2
datasets:
  - path: alpaca.jsonl
    type: alpaca
sequence_len: 128
micro_batch_size: 4
gradient_accumulation_steps: 2
learning_rate: 0.03
lr_scheduler: constant
optimizer: adamw_torch
adam_beta2: 0.95
adapter: lora
lora_r: 8
lora_alpha: 16
lora_target_modules: [c_attn, c_proj]
val_set_size: 0.1
num_epochs: 1
output_dir: ./outputs
"""


def devnet_files(backend: str, method: str, work: Path) -> tuple[str, str, str]:
    """(model folder, dataset, recipe) of a devnet job: a GPT-2 folder, the method's task and
    a torchtune recipe, or an axolotl config converted by dtrain.axolotl."""
    from dtrain_node.train.toy_models import save

    model = save("gpt2", work / "gpt2")
    if backend == "axolotl":
        from dtrain import axolotl

        rows = [
            {
                "instruction": "Add the two numbers.",
                "input": p.prompt.rstrip("="),
                "output": p.answer,
            }
            for p in tasks.addition(600, digits=2, seed=0)
        ]
        tasks.write_jsonl(work / "alpaca.jsonl", rows)
        (work / "axolotl.yml").write_text(AXOLOTL_CONFIG)
        c = axolotl.convert(work / "axolotl.yml", work / "job", backend="builtin")
        return c.job.model, str(c.dataset), str(c.recipe)
    probs = {
        "sft": lambda: tasks.addition(600, digits=2, seed=0),
        "dpo": lambda: tasks.reversal(600, length=4, seed=0),
    }[method]()
    data = work / f"{method}.jsonl"
    tasks.make_dataset(data, method, probs)
    recipe = work / "recipe.toml"
    recipe.write_text(TORCHTUNE_RECIPE.format(lr=3e-3 if method == "sft" else 5e-3))
    return str(model), str(data), str(recipe)


def export_loss(spec, out: Path) -> dict[str, float]:
    """The held-out metrics of the export at `out`, reloaded with from_pretrained, scored by the
    job's backend on the job's held-out split (DPO against the job's base as reference)."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from dtrain_node.train.job import TrainJob, load_recipe

    recipe = dataclasses.replace(load_recipe(spec.recipe_hash, spec.recipe_uri), lora_rank=0)
    method = spec.method.name.lower()
    job = TrainJob(1, method, spec.model_uri, spec.dataset_uri, spec.dataset_hash, recipe=recipe)
    backend = make_backend(job)
    backend.model.load_state_dict(AutoModelForCausalLM.from_pretrained(out).state_dict())
    return backend.evaluate()


def devnet_run(backend: str, method: str, work: Path) -> dict:
    """One devnet job of 2 members: the held-out loss it reported and its export's."""
    from dtrain_node.devnet import Cluster
    from dtrain_node.devnet.final_model import fetch

    model, data, recipe = devnet_files(backend, method, work)
    opts = dict(method=method, model=model, dataset=data, recipe=recipe, epochs=1)
    opts |= dict(steps=DEVNET_STEPS, sync=DEVNET_SYNC, epoch_duration=600, round_deadline=60.0)
    with Cluster(work / "devnet", operators=2, **opts) as c:
        t0 = time.perf_counter()
        for i in range(2):
            c.spawn(i, linger=300.0)
        c.wait(c.ended, 1200, "the job to end")
        seconds = time.perf_counter() - t0
        status = c.bsm.job(c.job_id).state.status.name
        start = next(r for r in c.metrics(0) if r["kind"] == "epoch_start")
        trained = [r for r in c.metrics(0) if r["kind"] == "epoch_trained"][-1]
        fetched = fetch(c.chain.url, c.bsm.address, c.job_id, work / "final")
        if fetched.returncode != 0:
            raise RuntimeError(f"job fetch failed: {fetched.stderr[-500:]}")
        exported = export_loss(c.spec, work / "final")
    keys = [k for k in exported if k in trained]
    return {
        "method": method,
        "backend": backend,
        "mode": "devnet",
        "model": "GPT-2 folder (dtrain model init gpt2)",
        "task": DEVNET_TASKS[(backend, method)],
        "workers": 2,
        "steps_per_worker": DEVNET_STEPS,
        "metric": "heldout_loss",
        "higher_is_better": False,
        "status": status,
        "before": start["heldout_loss"],
        "after": trained["heldout_loss"],
        "before_all": {k: start[k] for k in keys},
        "after_all": {k: trained[k] for k in keys},
        "export_heldout_loss": exported["heldout_loss"],
        "export_abs_diff": abs(exported["heldout_loss"] - trained["heldout_loss"]),
        "train_seconds": round(seconds, 1),
    }


def devnet_table(records: list[dict]) -> str:
    lines = [
        "| backend | method | task | members | steps/member | job status | held-out loss before "
        "| after (job) | export reloaded | abs diff | job wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(
            f"| {r['backend']} | {r['method']} | {r['task']} | {r['workers']} | "
            f"{r['steps_per_worker']} | {r['status']} | {r['before']:.4f} | {r['after']:.4f} | "
            f"{r['export_heldout_loss']:.4f} | {r['export_abs_diff']:.1e} | "
            f"{r['train_seconds']:.0f} |"
        )
    return "\n".join(lines) + "\n"


DEVNET_HEADING = "## Devnet jobs per backend"


def devnet_all(entries: list[str], out: Path) -> None:
    """Runs each BACKEND:METHOD devnet job; its row replaces the same backend and method's."""
    path = out / "methods.json"
    records = json.loads(path.read_text()) if path.is_file() else []
    for entry in entries:
        backend, method = entry.split(":")
        with tempfile.TemporaryDirectory() as tmp:
            r = devnet_run(backend, method, Path(tmp))
        print(json.dumps(r), flush=True)
        key = (backend, method, "devnet")
        records = [x for x in records if (x.get("backend"), x["method"], x.get("mode")) != key]
        records.append(r)
        path.write_text(json.dumps(records, indent=1) + "\n")
    md = out / "methods.md"
    text = md.read_text().split(DEVNET_HEADING)[0].rstrip("\n") if md.is_file() else ""
    rows = [x for x in records if x.get("mode") == "devnet"]
    note = (
        f"One devnet job per row (local chain, 2 operator nodes, 1 epoch of {DEVNET_STEPS} steps, "
        f"DeMo sync every {DEVNET_SYNC}); the caller fetches the export, reloads it with "
        "from_pretrained and scores the job's held-out split (`--devnet`).\n\n"
    )
    md.write_text(f"{text}\n\n{DEVNET_HEADING}\n\n{note}{devnet_table(rows)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="small budget, under 5 minutes")
    ap.add_argument("--methods", default="cpt,sft,dpo,grpo")
    ap.add_argument("--devnet", default="", help="BACKEND:METHOD,... devnet jobs instead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.devnet:
        devnet_all(args.devnet.split(","), ROOT / "docs" / "bench")
        return
    out = ROOT / "docs" / "bench" / ("quick" if args.quick else "")
    out.mkdir(parents=True, exist_ok=True)
    records = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for s in setups(args.quick):
            if s.method not in args.methods.split(","):
                continue
            uri, h = dataset(s.method, Path(tmp), args.quick)
            for workers in (1, 3):
                r = run(s, workers, uri, h)
                records.append(r)
                print(
                    f"{s.method} workers={workers} {s.metric}: {r['before']:.3f} -> "
                    f"{r['after']:.3f} ({r['train_seconds']:.1f} s)",
                    flush=True,
                )
    path = out / "methods.json"
    kept = [x for x in json.loads(path.read_text()) if x.get("mode")] if path.is_file() else []
    path.write_text(json.dumps(records + kept, indent=1) + "\n")  # devnet rows kept
    header = (
        f"Training methods, builtin:tiny, {'quick' if args.quick else 'full'} budget, "
        f"DeMo local mode K={K} (3 workers) vs plain AdamW (1 worker); total "
        f"{time.perf_counter() - t0:.0f} s on this machine.\n\n"
    )
    md = out / "methods.md"
    devnet = md.read_text().partition(DEVNET_HEADING) if md.is_file() else ("", "", "")
    md.write_text(header + table(records) + (f"\n{devnet[1]}{devnet[2]}" if devnet[1] else ""))
    print(table(records))


if __name__ == "__main__":
    main()

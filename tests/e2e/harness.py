"""A local chain, a deployed BSM, a CPT job and operator nodes as OS processes."""

from __future__ import annotations

import importlib.util
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtrain import BSM, JobSpec, LocalChain, Method, Params
from dtrain_node import checkpoint, corpus, hf

ROOT = Path(__file__).resolve().parents[2]
ETH = 10**18

_spec = importlib.util.spec_from_file_location("devnet", ROOT / "scripts" / "devnet.py")
devnet = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(devnet)  # type: ignore[union-attr]


class Cluster:
    def __init__(
        self,
        tmp: Path,
        operators: int,
        epochs: int = 1,
        steps: int = 10,
        sync: int = 5,
        epoch_duration: int = 120,
        round_deadline: float = 10.0,
    ) -> None:
        self.tmp, self.n = tmp, operators
        self.epochs, self.steps, self.sync = epochs, steps, sync
        self.epoch_duration, self.round_deadline = epoch_duration, round_deadline
        self.procs: list[Any] = []

    def __enter__(self) -> Cluster:
        self.chain = LocalChain(accounts=8).start()
        acc = self.chain.accounts
        self.treasury, self.developer, self.caller = acc[5], acc[6], acc[7]
        self.ops = acc[1 : 1 + self.n]
        self.bsm = BSM.deploy(
            self.chain.url,
            acc[0].key,
            Params(treasury=self.treasury.address, developer=self.developer.address),
        )
        data = self.tmp / "corpus.txt"
        digest = corpus.build_stdlib_corpus(data, max_bytes=200_000)
        job_id = self.bsm.next_job_id()
        init = hf.build(hf.PRESETS["tiny"], seed=job_id)
        self.spec = JobSpec(
            price_per_operator_epoch=ETH // 100,
            total_epochs=self.epochs,
            steps_per_epoch=self.steps,
            sync_interval=self.sync,
            min_operators=self.n,
            max_operators=self.n,
            method=Method.CPT,
            model_hash=checkpoint.canonical_hash(dict(init.state_dict())),
            model_uri="builtin:tiny",
            dataset_hash=digest,
            dataset_uri=str(data),
            epoch_duration=self.epoch_duration,
        )
        self.job_id = self.bsm.with_account(self.caller.key).create_job(self.spec)
        return self

    def spawn(self, i: int, faults: list[str] | None = None) -> Any:
        o = self.ops[i]
        p = devnet.spawn_node(
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

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
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
        devnet.stop_all(self.procs)
        self.chain.stop()

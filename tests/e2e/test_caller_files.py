"""End to end with a caller's own files: the caller serves a GPT-2-architecture model folder, an
SFT chat dataset and a recipe from its machine (`dtrain job submit --serve`), two operator nodes
(OS processes) fetch all three over libp2p by hash, train, and the job completes; the caller
fetches the final model, which transformers loads with its tokenizer and which generates."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dtrain.models import JobStatus
from dtrain_node.devnet import Cluster
from dtrain_node.train.toy_models import save

pytestmark = pytest.mark.slow

RECIPE = """\
batch_size = 4
seq_len = 64
inner_lr = 0.003
seed = 5
"""


def sft_chat(path: Path) -> Path:
    with path.open("w") as f:
        for a in range(15):
            for b in range(15):
                msgs = [
                    {"role": "user", "content": f"{a}+{b}="},
                    {"role": "assistant", "content": str(a + b)},
                ]
                f.write(json.dumps({"messages": msgs}) + "\n")
    return path


class Output:
    """A process's output lines as they come (read on a thread), to wait on."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc, self.lines = proc, []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        def found() -> re.Match[str] | None:
            return next((m for x in self.lines if (m := re.search(pattern, x))), None)

        with self._cond:
            ok = self._cond.wait_for(lambda: found() or self.proc.poll() is not None, timeout)
            m = found()
        assert ok and m, f"no line {pattern!r}:\n" + "\n".join(self.lines)
        return m


@pytest.mark.timeout(900)
def test_caller_serves_its_model_dataset_and_recipe_operators_fetch_and_train(tmp_path) -> None:
    model = save("gpt2", tmp_path / "my-model")
    data = sft_chat(tmp_path / "sft.jsonl")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    home = tmp_path / "caller-home"  # the caller's ~/.dtrain (its data peer key and cache)
    with Cluster(tmp_path, operators=2, create_job=False) as c:
        base = [sys.executable, "-m", "dtrain.cli", "--rpc-url", c.chain.url]
        base += ["--contract", c.bsm.address, "--key", c.caller.key]
        env = {**os.environ, "HOME": str(home)}
        args = ["job", "submit", "--method", "sft", "--model-uri", str(model)]
        args += ["--dataset-uri", str(data), "--recipe", str(recipe), "--serve"]
        args += ["--serve-port", "0", "--operators", "2:2", "--steps", "6", "--sync", "3"]
        args += ["--price", "0.01ether", "--epoch-duration", "10m"]
        submit = subprocess.Popen(
            [*base, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        try:
            out = Output(submit)
            c.job_id = int(out.wait_for(r"job (\d+) created", 300).group(1))
            spec = c.bsm.job(c.job_id).spec
            for uri in (spec.model_uri, spec.dataset_uri, spec.recipe_uri):
                assert uri.startswith("p2p:/ip4/") and "/p2p/" in uri, uri  # the caller's peer
            for i in (0, 1):
                c.spawn(i, linger=600)
            c.wait(lambda: c.bsm.job(c.job_id).state.status.is_ended, 600, "the job to end")
            assert c.bsm.job(c.job_id).state.status == JobStatus.COMPLETED, c.logs()
            # The caller stops serving by itself once the job has ended.
            assert submit.wait(timeout=60) == 0, "\n".join(out.lines)
        finally:
            if submit.poll() is None:
                submit.kill()
        for i in (0, 1):  # each node fetched the three files into its own cache, verified
            cache = c.tmp / f"op{i + 1}" / "cache"
            assert len(list((cache / "sha256").glob("[0-9a-f]" * 64))) == 3, c.logs()
            assert len([d for d in (cache / "models").iterdir() if d.is_dir()]) == 1
        for i in (0, 1):  # both trained through DeMo rounds and revealed their vote
            kinds = [m["kind"] for m in c.metrics(i)]
            assert "epoch_start" in kinds and "round" in kinds and "revealed" in kinds, kinds
        fetched = tmp_path / "final"
        deadline = time.monotonic() + 180
        r = subprocess.run(
            [*base, "job", "fetch", str(c.job_id), "--out", str(fetched)],
            capture_output=True,
            text=True,
            env=env,
            timeout=max(1.0, deadline - time.monotonic()),
        )
        assert r.returncode == 0, r.stdout + r.stderr
        final = c.bsm.job(c.job_id).state.checkpoint.hex()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dtrain_node.train.finetune import Coder, greedy

    trained = AutoModelForCausalLM.from_pretrained(fetched).eval()
    tok = AutoTokenizer.from_pretrained(fetched)
    assert (fetched / "CHECKPOINT_SHA256").read_text().strip() == final
    start = AutoModelForCausalLM.from_pretrained(model)
    moved = [n for n, p in trained.state_dict().items() if not p.equal(start.state_dict()[n])]
    assert moved  # training changed the weights
    got = greedy(trained, Coder(tok), [[{"role": "user", "content": "3+4="}]], max_new=4)
    assert isinstance(got[0], str)

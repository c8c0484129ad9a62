"""Train, then serve: two operator nodes (in threads, loopback transport) train a 2-epoch job
of the built-in tiny model on the session's anvil and export its final checkpoint; then
`dtrain serve JOB` runs as a real subprocess over that export, checked against the on-chain
hash, and the official `openai` client uses it as a user would."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from harness.chain import ETH, revert
from harness.loopback import LoopbackHub
from openai import OpenAI
from safetensors.torch import load_file, save_file

from dtrain import BSM, JobSpec, Method, pins
from dtrain.client import NONCES, load_key
from dtrain.devtoken import UNIT, TestUSD
from dtrain.x402 import paying_http_client_sync, settlement_of
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.serve.engine import Sampling, TransformersEngine
from dtrain_node.train import corpus

CALLER, OPERATORS = 4, (1, 2)
CAP = 48  # --max-tokens-cap; the built-in tiny model's context is 128 tokens (bytes)
LOADING = re.compile(r" (dtrain-job-\d+): listening at (http://\S+/v1) while the model loads \(")
LISTENING = re.compile(r"serving (dtrain-job-\d+) \(.*engine transformers\) at (http://\S+/v1): ")


@dataclass(frozen=True)
class Trained:
    """A completed job and its final checkpoint as an operator exported it."""

    bsm: BSM
    job_id: int
    export: Path
    rpc_url: str

    def argv(self, *args: str) -> list[str]:
        base = [sys.executable, "-m", "dtrain.cli", "--rpc-url", self.rpc_url]
        return [*base, "--contract", self.bsm.address, "serve", str(self.job_id), *args]


def _run_nodes(nodes: list[Node], timeout: float = 240) -> list[dict[str, Any]]:
    results: dict[int, Any] = {}

    def run(i: int, node: Node) -> None:
        try:
            results[i] = node.run()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i, n), daemon=True) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for n in nodes:
        n.stop_now.set()
    assert not any(t.is_alive() for t in threads), "a node did not finish the job"
    assert not any(isinstance(r, BaseException) for r in results.values()), results
    return [results[i] for i in range(len(nodes))]


@pytest.fixture(scope="module")
def trained(chain, deployed, accounts, tmp_path_factory) -> Iterator[Trained]:
    """The job, completed and exported; the chain goes back to before it afterwards."""
    w3 = deployed.w3
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    NONCES.forget()
    tmp = tmp_path_factory.mktemp("serve")
    try:
        digest = corpus.build_stdlib_corpus(tmp / "corpus.txt", max_bytes=60_000)
        spec = JobSpec(
            price_per_operator_epoch=ETH // 100,
            total_epochs=2,
            steps_per_epoch=4,
            sync_interval=2,
            min_operators=len(OPERATORS),
            max_operators=len(OPERATORS),
            method=Method.CPT,
            model_hash=pins.model_hash("builtin:tiny"),
            model_uri="builtin:tiny",
            dataset_hash=digest,
            dataset_uri=str(tmp / "corpus.txt"),
            epoch_duration=600,
        )
        job_id = deployed.with_account(accounts[CALLER].key).create_job(spec)
        hub = LoopbackHub()
        nodes = [
            Node(
                NodeConfig(
                    key=accounts[i].key,
                    rpc_url=chain.url,
                    contract=deployed.address,
                    data_dir=tmp / f"op{i}",
                    job_id=job_id,
                    batch_size=4,
                    poll_s=0.1,
                ),
                transport_factory=hub.factory,
            )
            for i in OPERATORS
        ]
        results = _run_nodes(nodes)
        assert [r["status"] for r in results] == ["completed", "completed"]
        yield Trained(deployed, job_id, Path(results[0]["export"]), chain.url)
    finally:
        revert(w3, snap)
        NONCES.forget()


class Server:
    """`dtrain serve` as a subprocess: started, waited on until its listening line."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log = log
        self._err = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self._err, text=True)

    def listening(self, deadline_s: float = 120) -> re.Match[str]:
        """Its first stdout line, once the model is loaded, says it serves; its log said it
        listened before, while the model loaded."""
        line = _first_line(self.proc, deadline_s)
        m = LISTENING.match(line)
        assert m, f"{line!r}\n{self.log.read_text()}"
        loading = LOADING.search(self.log.read_text())
        assert loading and loading.groups() == m.groups(), self.log.read_text()
        health = httpx.get(m.group(2).removesuffix("/v1") + "/health", timeout=30)
        assert health.json() == {"status": "ready", "model": m.group(1)}
        return m

    def stop(self) -> tuple[int, str]:
        """Ctrl-C; (exit status, the rest of stdout)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            out, _ = self.proc.communicate(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
        return self.proc.returncode, out


def _first_line(proc: subprocess.Popen[str], deadline_s: float) -> str:
    """The first stdout line of `proc`, read in a thread to keep a deadline."""
    got: list[str] = []
    assert proc.stdout is not None
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(deadline_s)
    assert got and got[0], f"no line within {deadline_s}s (exit status {proc.poll()})"
    return got[0]


@pytest.mark.timeout(600)
def test_openai_client_against_dtrain_serve_of_a_completed_job(
    trained: Trained, tmp_path: Path
) -> None:
    argv = trained.argv("--model-dir", str(trained.export), "--port", "0")
    server = Server([*argv, "--max-tokens-cap", str(CAP)], tmp_path / "serve.log")
    try:
        model_id, url = server.listening().groups()
        assert model_id == f"dtrain-job-{trained.job_id}"
        client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        _models(client, model_id, trained)
        _completions(client, model_id, trained.export)
        _chat(client, model_id)
        _errors(client, model_id)
        _concurrent(url, model_id)
        _disconnect(url, model_id)
    finally:
        code, out = server.stop()
    assert code == 0, server.log.read_text()
    assert out.strip().endswith("stopped serving")
    log = server.log.read_text()
    assert "completions: " in log and "Traceback" not in log, log


def _models(client: OpenAI, model_id: str, trained: Trained) -> None:
    [m] = client.models.list().data
    on_chain = trained.bsm.job(trained.job_id).state.checkpoint
    assert m.id == model_id and m.model_dump()["checkpoint"] == "0x" + on_chain.hex()


def _completions(client: OpenAI, model_id: str, export: Path) -> None:
    prompt = "import os\nimport sys\n\n\ndef "
    r = client.completions.create(model=model_id, prompt=prompt, max_tokens=24, temperature=0)
    # The same model, loaded here: greedy generation is deterministic.
    local = TransformersEngine(export)
    ids = local.prompt_ids(prompt)
    want = "".join(s.text for s in local.generate(ids, Sampling(24, 0.0), threading.Event()))
    assert r.choices[0].text == want
    assert r.usage is not None and r.usage.prompt_tokens == len(ids) == len(prompt) + 1  # BOS
    streamed = client.completions.create(
        model=model_id, prompt=prompt, max_tokens=24, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == want


def _chat(client: OpenAI, model_id: str) -> None:
    messages = [{"role": "user", "content": "Write a function."}]
    r = client.chat.completions.create(
        model=model_id, messages=messages, max_tokens=16, temperature=0
    )
    answer = r.choices[0].message.content
    assert isinstance(answer, str) and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 16
    stream = client.chat.completions.create(
        model=model_id,
        messages=messages,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == r.usage.total_tokens


def _errors(client: OpenAI, model_id: str) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"model": "gpt-4o"}, "model"),
        ({"prompt": ""}, "prompt"),
        ({"max_tokens": CAP + 1}, "max_tokens"),
        ({"max_tokens": 2**62}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"n": 2}, "n"),
        ({"prompt": "x" * 500}, "prompt"),  # longer than the model's 128-token context
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.completions.create(**{"model": model_id, "prompt": "a", **kwargs})
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == param, (kwargs, body)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_id, messages=[], max_tokens=4)
    r = httpx.post(
        str(client.base_url) + "completions",
        content=b'{"model": ',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def _concurrent(url: str, model_id: str) -> None:
    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    answers: dict[int, str] = {}

    def call(i: int) -> None:
        r = client.completions.create(model=model_id, prompt=f"x{i} = ", max_tokens=12, seed=i)
        answers[i] = r.choices[0].text

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(answers) == list(range(6))


def _disconnect(url: str, model_id: str) -> None:
    body = {"model": model_id, "prompt": "def ", "max_tokens": CAP, "stream": True}
    with httpx.stream("POST", f"{url}/completions", json=body, timeout=60) as r:
        assert next(r.iter_lines()).startswith("data: {")  # then the client goes away
    client = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    r2 = client.completions.create(model=model_id, prompt="class ", max_tokens=4)
    assert r2.choices[0].finish_reason in ("stop", "length")


@pytest.mark.timeout(300)
def test_a_folder_whose_weights_are_not_the_checkpoint_is_refused_in_one_line(
    trained: Trained, tmp_path: Path
) -> None:
    forged = Path(shutil.copytree(trained.export, tmp_path / "forged"))
    weights = load_file(forged / "model.safetensors")
    name = sorted(weights)[-1]
    weights[name] = weights[name] * 1.01  # CHECKPOINT_SHA256 still names the on-chain hash
    save_file(weights, str(forged / "model.safetensors"), metadata={"format": "pt"})
    r = subprocess.run(
        trained.argv("--model-dir", str(forged), "--port", "0"),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 1 and r.stdout == ""
    listened, line = r.stderr.strip().splitlines()  # it listened while verifying, then stopped
    assert LOADING.search(listened), r.stderr
    assert line.startswith("error: ") and "its weights hash to 0x" in line, line
    assert "refusing to serve it" in line


@pytest.mark.timeout(300)
def test_without_model_dir_it_fetches_from_the_operators(trained: Trained) -> None:
    """The nodes have stopped (no linger): the fetch finds nobody serving, and says so in one
    line, as `dtrain job fetch` does."""
    r = subprocess.run(
        trained.argv("--port", "0", "--timeout", "5"), capture_output=True, text=True, timeout=240
    )
    assert r.returncode == 1 and r.stdout == ""
    listened, line = r.stderr.strip().splitlines()  # it listened while fetching, then stopped
    assert LOADING.search(listened), r.stderr
    assert line.startswith(f"error: job {trained.job_id}: nobody serves"), line


@pytest.mark.timeout(300)
def test_dtrain_serve_with_a_price_is_paid_per_call_over_x402(
    trained: Trained, accounts, tmp_path: Path
) -> None:
    """`--price 0.05 --token TestUSD`: the official client unpaid gets a 402 naming the price;
    paying through the x402 httpx client it gets its answer, and the payee holds exactly the
    price, settled by the facilitator account."""
    payer, payee, settler = accounts[5], accounts[6], accounts[7]
    usd = TestUSD.deploy(trained.rpc_url, accounts[0].key)
    usd.mint(payer.address, UNIT)
    argv = trained.argv("--model-dir", str(trained.export), "--port", "0", "--price", "0.05")
    argv += ["--token", usd.address, "--pay-to", payee.address]
    server = Server([*argv, "--facilitator-key", settler.key], tmp_path / "serve.log")
    try:
        model_id, url = server.listening().groups()
        unpaid = OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
        with pytest.raises(openai.APIStatusError) as err:
            unpaid.completions.create(model=model_id, prompt="def ", max_tokens=8)
        assert err.value.status_code == 402
        assert err.value.response.json()["accepts"][0]["amount"] == "50000"
        with paying_http_client_sync(load_key(payer.key), 50_000, usd.address) as http:
            client = OpenAI(base_url=url, api_key="unused", max_retries=0, http_client=http)
            raw = client.completions.with_raw_response.create(
                model=model_id, prompt="def ", max_tokens=8, temperature=0
            )
        settlement = settlement_of(raw.http_response)
        assert raw.parse().choices[0].finish_reason in ("stop", "length")
    finally:
        code, _ = server.stop()
    assert code == 0, server.log.read_text()
    assert settlement is not None and settlement["payer"] == payer.address
    assert (usd.balance_of(payer.address), usd.balance_of(payee.address)) == (UNIT - 50_000, 50_000)
    tx = trained.bsm.w3.eth.get_transaction(settlement["transaction"])
    assert tx["from"] == settler.address and tx["to"] == usd.address
    assert "paid 0.05 TestUSD by " + payer.address in server.log.read_text()


@pytest.mark.timeout(120)
def test_a_price_that_cannot_be_charged_is_refused_in_one_line(trained: Trained, accounts) -> None:
    usd = TestUSD.deploy(trained.rpc_url, accounts[0].key)
    model = ["--model-dir", str(trained.export), "--port", "0"]
    cases = [
        (["--price", "0.05"], 2, "--price needs --token"),
        (["--price", "0.0000001", "--token", usd.address], 1, "not a non-negative multiple"),
        (["--price", "1", "--token", accounts[3].address], 1, "not an EIP-3009 token"),
        (["--price", "0", "--token", usd.address], 2, "must be above 0"),
        (["--price", "0.05", "--token", usd.address], 1, "needs a key that settles payments"),
        (["--token", usd.address], 2, "go with --price"),
    ]
    for args, status, message in cases:
        r = subprocess.run(trained.argv(*model, *args), capture_output=True, text=True, timeout=60)
        assert r.returncode == status and r.stdout == "", (args, r.stderr)
        assert message in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)

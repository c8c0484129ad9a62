"""The demo's paid parts: the devnet stablecoin, a job bought over x402 from `dtrain gateway`,
and the trained model served by an operator that charges each call over x402 (`dtrain serve
--price`). Every server is a real subprocess; payments are real EIP-3009 transfers on anvil."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .report import Checks

TOKEN_PRICE = 10_000  # per operator-epoch, in TestUSD base units: 0.01 TestUSD
CALLER_FUNDS = 100  # whole TestUSD minted to the caller
INFERENCE_PRICE = "0.05"  # TestUSD per chat completion
_URL = re.compile(r" at (http://[0-9.]+:[0-9]+(?:/v1)?)")


@dataclass
class Server:
    """A `dtrain ...` HTTP service started as a subprocess, stopped with SIGTERM (which the
    services handle as Ctrl-C, and which a shell's background job does not ignore)."""

    name: str
    popen: subprocess.Popen
    url: str
    log: Path

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def start(name: str, args: list[str], log: Path) -> Server:
    """Runs `dtrain ARGS`; returns once its listening line (the first stdout line) names its
    URL, or raises when it exits first. Its stderr goes to `log`."""
    cmd = [sys.executable, "-m", "dtrain.cli", *args]
    err = open(log, "w")  # noqa: SIM115 - lives as long as the process
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env
    )
    assert p.stdout is not None
    line = p.stdout.readline()  # blocks until it listens, or EOF when it exits
    m = _URL.search(line)
    if not m:
        p.kill()
        p.wait()
        raise RuntimeError(f"{name} did not start: {line!r} {log.read_text()[-500:]}")
    return Server(name, p, m.group(1), log)


def set_up_token(chain: Any, bsm: Any, deployer: Any, developer: Any, caller: Any) -> Any:
    """TestUSD deployed, allowed for jobs by the developer, CALLER_FUNDS minted to the caller,
    and Multicall3's address served (the x402 facilitator reads through it)."""
    from dtrain.devtoken import UNIT, TestUSD
    from dtrain.x402 import install_multicall

    usd = TestUSD.deploy(chain.url, deployer.key)
    usd.mint(caller.address, CALLER_FUNDS * UNIT)
    bsm.with_account(developer.key).set_payment_token(usd.address)
    install_multicall(bsm.w3)
    return usd


@dataclass
class Market:
    """Where the demo's x402 payments happen: the chain, the BSM, TestUSD, the account that
    settles payments (and pays their gas), and the run directory for the servers' logs."""

    rpc: str
    contract: str
    usd: Any
    facilitator: Any
    run_dir: Path

    def dtrain(self, key: str, *args: str) -> list[str]:
        return ["--rpc-url", self.rpc, "--contract", self.contract, "--key", key, *args]

    def buy_job(self, spec: Any, gateway: Any, caller: Any) -> tuple[int, dict[str, Any]]:
        """Starts `dtrain gateway` (the gateway account is paid), then the caller buys the job
        from it over x402; the gateway stops once the job exists."""
        from dtrain.client import load_key
        from dtrain.paidjobs import buy_job as buy

        args = self.dtrain(gateway.key, "gateway", "--token", self.usd.address, "--port", "0")
        args += ["--facilitator-key", self.facilitator.key]
        gw = start("gateway", args, self.run_dir / "gateway.log")
        try:
            bought = buy(gw.url, spec, load_key(caller.key), spec.escrow, self.usd.address)
        finally:
            gw.stop()
        print(
            f"job {bought.job_id} bought over x402 from the gateway at {gw.url}: "
            f"{spec.escrow / 10**6:g} TestUSD paid in {bought.settlement_tx[:12]}.., "
            f"job created in {bought.create_tx[:12]}.."
        )
        return bought.job_id, {
            "gateway": gw.url,
            "settlement_tx": bought.settlement_tx,
            "create_tx": bought.create_tx,
            "escrow": bought.escrow,
            "owner": bought.payer,
        }

    def serve_and_chat(
        self, job_id: int, model_dir: Path, operator: Any, caller: Any, checks: Checks
    ) -> dict[str, Any]:
        """The operator serves the caller's verified copy of the final model with `dtrain
        serve --price`; the caller asks one chat completion unpaid, then pays for one over
        x402. Checks the 402, the answer, and that exactly the price moved."""
        price = int(float(INFERENCE_PRICE) * 10**6)
        args = self.dtrain(operator.key, "serve", str(job_id), "--model-dir", str(model_dir))
        args += ["--port", "0", "--price", INFERENCE_PRICE, "--token", self.usd.address]
        args += ["--facilitator-key", self.facilitator.key]
        srv = start("serve", args, self.run_dir / "serve.log")
        before = self.usd.balance_of(operator.address), self.usd.balance_of(caller.address)
        try:
            unpaid, paid = _chat_twice(srv.url, job_id, caller, price, self.usd.address)
        finally:
            srv.stop()
        after = self.usd.balance_of(operator.address), self.usd.balance_of(caller.address)
        answer = paid.json()["choices"][0]["message"]["content"] if paid.status_code == 200 else ""
        checks.add("unpaid chat completion answered 402", unpaid.status_code == 402, unpaid.text)
        checks.add(
            "the trained model answered a paid chat completion",
            paid.status_code == 200 and isinstance(answer, str),
            paid.text[:300],
        )
        checks.add(
            "inference paid over x402: the serving operator got exactly the price",
            after[0] - before[0] == price and before[1] - after[1] == price,
            f"operator {before[0]} -> {after[0]}, caller {before[1]} -> {after[1]}",
        )
        print(f"\nchat completion from {srv.url} (paid {INFERENCE_PRICE} TestUSD): {answer!r}")
        return {
            "url": srv.url,
            "price": price,
            "payee": operator.address,
            "payer": caller.address,
            "answer": answer,
            "settlement_tx": _settlement_tx(paid),
        }


def _chat_twice(url: str, job_id: int, caller: Any, price: int, token: str) -> tuple[Any, Any]:
    """One chat completion without paying, then the same one paid (at most `price`)."""
    import httpx

    from dtrain.client import load_key
    from dtrain.x402 import paying_http_client_sync

    body = {
        "model": f"dtrain-job-{job_id}",
        "messages": [{"role": "user", "content": "def add(a, b):"}],
        "max_tokens": 24,
    }
    unpaid = httpx.post(url + "/chat/completions", json=body, timeout=120)
    with paying_http_client_sync(load_key(caller.key), price, token, timeout=300) as client:
        paid = client.post(url + "/chat/completions", json=body)
    return unpaid, paid


def _settlement_tx(response: Any) -> str:
    from dtrain.x402 import settlement_of

    return str((settlement_of(response) or {}).get("transaction", ""))

"""What the paying caller sees, from the network alone (no operator's files): `dtrain job watch`
prints each round of a GRPO job from the members' signed gossip (step, loss, tokens, mean
reward and accuracy, the job's ETA), and `dtrain job status` says why an operator passed the
job by. Operator nodes, the watcher and the status call are OS processes on a real anvil."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_caller_files import Output

from dtrain.models import JobStatus
from dtrain_node.devnet import Cluster
from dtrain_node.devnet.cluster import NodeConfig, Proc, node_command

pytestmark = pytest.mark.slow

ROUND_LINE = (
    r"progress: epoch 0 \(epochs 0\.\.0\) round {n}/3 \| step {step} \| loss [\d.]+ \| "
    r"tokens [\d,]+"
)


def cli(c: Cluster) -> list[str]:
    return [
        sys.executable,
        "-m",
        "dtrain.cli",
        "--rpc-url",
        c.chain.url,
        "--contract",
        c.bsm.address,
    ]


@pytest.mark.timeout(600)
def test_job_watch_prints_every_grpo_round_from_gossip_with_reward_and_eta(tmp_path) -> None:
    with Cluster(tmp_path, operators=2, method="grpo", steps=6, sync=2, epochs=1) as c:
        watch = subprocess.Popen(
            [*cli(c), "job", "watch", str(c.job_id)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,  # nothing of the operators' there: their data dirs are elsewhere
            start_new_session=True,
        )
        web = subprocess.Popen(  # the job's page, fed by the same gossip
            [*cli(c), "job", "watch", str(c.job_id), "--web", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            out, page = Output(watch), Output(web)
            url = page.wait_for(r"(http://\S+) \(Ctrl-C stops\)", 60).group(1)
            for i in (0, 1):
                c.spawn(i, linger=120)
            c.wait(c.ended, 480, "the job to end")
            assert c.bsm.job(c.job_id).state.status == JobStatus.COMPLETED, c.logs()
            members = {c.ops[0].address, c.ops[1].address}
            assert watch.wait(timeout=60) == 0, "\n".join(out.lines)
            data = poll_page(
                url, lambda d: [len(s["points"]) for s in d["loss"]["series"]] == [3, 3]
            )
        finally:
            for p in (watch, web):
                if p.poll() is None:
                    p.kill()
    # no --metrics given: the page's loss curve and the last round come from gossip
    assert data["loss"]["sources"] == ["gossip"], data["loss"]
    assert {s["member"] for s in data["loss"]["series"]} == members
    last = data["progress"]
    assert (last["round"], last["rounds"], last["members"]) == (2, 3, 2), last
    assert set(last["metrics"]) == {"reward", "accuracy"}, last
    lines = [x for x in out.lines if x.startswith("progress:")]
    text = "\n".join(out.lines)
    for n in (1, 2, 3):
        assert re.search(ROUND_LINE.format(n=n, step=2 * n), text), text
    assert len(lines) == 3, text  # one line per round, none twice
    for line in lines:
        assert re.search(r"\| reward [\d.]+ \| accuracy [\d.]+ \| 2/2 members", line), line
    assert all("ETA" in x for x in lines), lines
    assert "JobCompleted" in text  # the chain's events still come, in the same stream
    # 3 rounds x 2 members, each note once; gossip brought them (asking the members for what
    # they hold is the backstop for what gossip lost)
    notes = re.search(r"^(\d+) signed progress notes \((.*)\)$", text, re.M)
    assert notes and notes.group(1) == "6", text
    by_gossip = re.search(r"(\d+) by gossip", notes.group(2))
    assert by_gossip and int(by_gossip.group(1)) >= 1, notes.group(0)


@pytest.mark.timeout(300)
def test_job_status_says_an_operator_refused_the_job_because_its_ask_is_above_the_price(
    tmp_path,
) -> None:
    with Cluster(tmp_path, operators=2, referees=1) as c:
        account = c.referees[0]  # not a member: its ask is 1 ETH, the job pays 0.01 ETH
        config = NodeConfig(c.chain.url, c.bsm.address, c.job_id, 30.0, linger=600)
        data_dir = tmp_path / "pricey"
        data_dir.mkdir()
        cmd = [*node_command(config, account.key, data_dir, []), "--min-price", "1ether"]
        log = open(data_dir / "stdout.log", "w")  # noqa: SIM115 - lives as long as the node
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        popen = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        c.procs.append(Proc("pricey", account.address, popen, data_dir))
        c.wait(lambda: refused(data_dir), 180, "the node to refuse the job")
        r = subprocess.run(
            [*cli(c), "job", "status", str(c.job_id)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert "1 operator refused: ask above price" in r.stdout, r.stdout + c.logs()
        why = "ask above price: job price 0.01 ETH below the operator's ask 1 ETH"
        assert f"{account.address}  {why}" in r.stdout, r.stdout
        assert c.bsm.job(c.job_id).state.status == JobStatus.OPEN  # no state changed on chain
        assert account.address not in c.bsm.job(c.job_id).members
        # The node is gone: its refusal stays readable, from the chain (`JobDeclined`).
        popen.terminate()
        assert popen.wait(60) is not None
        (declined,) = [e.args for e in c.bsm.events(names=["JobDeclined"], job_id=c.job_id)]
        assert declined["operator"] == account.address
        r = subprocess.run(
            [*cli(c), "job", "status", str(c.job_id)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0 and f"{account.address}  {why}" in r.stdout, r.stdout


def poll_page(url: str, done: Callable[[dict[str, Any]], bool], timeout: float = 60) -> dict:
    """The page's JSON once `done` holds of it (or the last one read, at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(url + "api/job", timeout=10) as r:
            data = json.loads(r.read())
        if done(data) or time.monotonic() > deadline:
            return data
        time.sleep(0.5)


def refused(data_dir: Path) -> bool:
    path = data_dir / "metrics.jsonl"
    return path.is_file() and '"kind": "refused"' in path.read_text()

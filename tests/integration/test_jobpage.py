"""The job page of a real job: two operator nodes (in threads, loopback transport) train a
2-epoch job of the built-in tiny model on the session's anvil and are paid; then
`dtrain job watch --web` serves its JSON and headless Chromium renders its page. What both
show is checked against the chain's own balances."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from harness import default_sigint
from harness.browser import chromium_page
from harness.chain import ETH, revert
from harness.loopback import LoopbackHub

from dtrain import BSM, JobSpec, Method, pins
from dtrain.cli import main as cli_main
from dtrain.client import NONCES
from dtrain.jobpage import JobPage, JobPageServer
from dtrain.progress import RoundLine
from dtrain.units import format_eth
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.train import corpus

CALLER, OPERATORS = 4, (1, 2)
EPOCHS, STEPS, SYNC = 2, 4, 2
PARTS = ("operator", "stakers", "protocol", "developer")


@dataclass(frozen=True)
class Done:
    """A completed job and its members' data directories."""

    bsm: BSM
    job_id: int
    members: list[str]
    data_dirs: list[Path]
    rpc_url: str


def _submit(bsm: BSM, dataset: Path, digest: bytes) -> int:
    spec = JobSpec(
        price_per_operator_epoch=ETH // 100,
        total_epochs=EPOCHS,
        steps_per_epoch=STEPS,
        sync_interval=SYNC,
        min_operators=len(OPERATORS),
        max_operators=len(OPERATORS),
        method=Method.CPT,
        model_hash=pins.model_hash("builtin:tiny"),  # as `dtrain job submit` pins it
        model_uri="builtin:tiny",
        dataset_hash=digest,
        dataset_uri=str(dataset),
        epoch_duration=600,
    )
    return bsm.create_job(spec)


def _run_nodes(nodes: list[Node], timeout: float = 240) -> None:
    errors: list[BaseException] = []

    def run(node: Node) -> None:
        try:
            node.run()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(n,), daemon=True) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for n in nodes:
        n.stop_now.set()
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "a node did not finish the job"


@pytest.fixture(scope="module")
def done(chain, deployed, accounts, tmp_path_factory) -> Iterator[Done]:
    """The job, completed; the chain goes back to before it afterwards."""
    w3 = deployed.w3
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    NONCES.forget()
    tmp = tmp_path_factory.mktemp("jobpage")
    try:
        digest = corpus.build_stdlib_corpus(tmp / "corpus.txt", max_bytes=60_000)
        job_id = _submit(deployed.with_account(accounts[CALLER].key), tmp / "corpus.txt", digest)
        hub, dirs = LoopbackHub(), [tmp / f"op{i}" for i in OPERATORS]
        nodes = [
            Node(
                NodeConfig(
                    key=accounts[i].key,
                    rpc_url=chain.url,
                    contract=deployed.address,
                    data_dir=d,
                    job_id=job_id,
                    batch_size=4,
                    poll_s=0.1,
                    withdraw=False,  # the credits stay on chain, to check the page against
                    export=False,
                ),
                transport_factory=hub.factory,
            )
            for i, d in zip(OPERATORS, dirs, strict=True)
        ]
        _run_nodes(nodes)
        members = [accounts[i].address for i in OPERATORS]
        yield Done(deployed, job_id, members, dirs, chain.url)
    finally:
        revert(w3, snap)
        NONCES.forget()


def chain_totals(bsm: BSM, members: list[str]) -> dict[str, int]:
    """What the job paid, read from the contract's balances (nobody withdrew or claimed): the
    members' credit, their pools' reward reserves, the treasury's and developer's credit."""
    p = bsm.params()
    return {
        "operator": sum(bsm.credit_of(m) for m in members),
        "stakers": sum(bsm.pool(m).reward_reserve for m in members),
        "protocol": bsm.credit_of(p.treasury),
        "developer": bsm.credit_of(p.developer),
    }


def _wait_for_line(stream: Any, deadline_s: float) -> str:
    """The first line of `stream` (a subprocess pipe), read in a thread to keep a deadline."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(deadline_s)
    assert got and got[0], f"no line within {deadline_s}s"
    return got[0]


@pytest.mark.timeout(300)
def test_watch_web_serves_the_job_as_on_chain_until_ctrl_c(done: Done, tmp_path: Path) -> None:
    """The second member's --metrics is a folder that does not exist yet: the page serves, says
    it waits for it, and draws its curve once it appears."""
    late = tmp_path / "not-yet" / "op2"
    argv = [sys.executable, "-m", "dtrain.cli", "--rpc-url", done.rpc_url]
    argv += ["--contract", done.bsm.address, "job", "watch", str(done.job_id), "--web"]
    argv += ["--port", "0", "--metrics", str(done.data_dirs[0]), "--metrics", str(late)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )
    try:
        line = _wait_for_line(proc.stdout, 60)
        m = re.fullmatch(rf"job {done.job_id}: (http://127\.0\.0\.1:\d+/) \(Ctrl-C stops\)\n", line)
        assert m, line
        with urllib.request.urlopen(m.group(1) + "api/job", timeout=30) as r:
            before = json.load(r)
        assert before["loss"]["waiting"] == [str(late)]
        assert [s["member"] for s in before["loss"]["series"]] == [done.members[0]]
        shutil.copytree(done.data_dirs[1], late)  # the second member's node has started
        with urllib.request.urlopen(m.group(1) + "api/job", timeout=30) as r:
            data = json.load(r)
        assert data["loss"]["waiting"] == []
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    assert proc.returncode == 0, err
    assert (out, err) == ("", f"stopped serving the page of job {done.job_id}\n")

    job = data["job"]
    assert (job["state"], job["epochs_done"], job["epochs_total"]) == ("completed", 2, 2)
    assert job["price"] == {"wei": str(ETH // 100), "text": "0.01 ETH"}
    for e in data["epochs"]:
        assert e["status"] == "finalized" and sorted(e["members"]) == sorted(done.members)
        assert sorted(e["paid"]) == sorted(done.members) and e["slashed"] == []
    assert data["slashes"] == [] and data["refund"]["text"] == "0 ETH"
    total = data["payouts"]["total"]
    want = chain_totals(done.bsm, done.members)
    assert {k: int(total[k]["wei"]) for k in PARTS} == want
    assert int(total["total"]["wei"]) == EPOCHS * len(done.members) * ETH // 100
    series = {s["member"]: s["points"] for s in data["loss"]["series"]}
    assert sorted(series) == sorted(done.members)
    rounds = EPOCHS * STEPS // SYNC
    for points in series.values():
        assert [p["step"] for p in points] == [SYNC * (i + 1) for i in range(rounds)]
        assert all(p["loss"] > 0 for p in points)


@pytest.mark.timeout(300)
def test_job_page_in_chromium_shows_curve_payouts_members_and_state(
    done: Done, tmp_path: Path
) -> None:
    page_data = JobPage(done.bsm, done.job_id, done.data_dirs)
    with JobPageServer(page_data, port=0) as server, chromium_page() as page:
        page.goto(server.url)
        page.wait_for_selector("body[data-block]", timeout=30_000)
        assert page.inner_text("#state") == "completed"
        assert "2/2 done" in page.inner_text("#summary")

        curves = page.query_selector_all("#loss-chart polyline.series")
        drawn = {c.get_attribute("data-member"): c.get_attribute("points") for c in curves}
        assert sorted(drawn) == sorted(done.members)
        for points in drawn.values():
            assert len(points.split()) == EPOCHS * STEPS // SYNC >= 2

        listed = page.eval_on_selector_all("#members li", "els => els.map(e => e.dataset.member)")
        assert sorted(listed) == sorted(done.members)

        rows = page.query_selector_all("#payouts tbody tr")
        assert sorted(r.get_attribute("data-operator") for r in rows) == sorted(done.members)
        total = page.query_selector_all("#payouts tfoot tr td[data-wei]")
        shown = [int(td.get_attribute("data-wei")) for td in total]
        want = chain_totals(done.bsm, done.members)
        assert shown[:4] == [want[k] for k in PARTS]
        assert [td.inner_text() for td in total[:4]] == [format_eth(w) for w in shown[:4]]
        assert page.inner_text("#slash-note") == "No slashes."

        png = tmp_path / "job-page.png"
        page.screenshot(path=str(png), full_page=True)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


SHOWN = ("#job-id", "#method", "#state", "#headline", "#progress", "#summary", "#members",
         "#epochs", "#payouts", "#payout-note", "#slash-note", "#loss-note", "#legend")  # fmt: skip
# The last round line as the gossip feed hands it to the page (`dtrain job watch --web`).
LAST_ROUND = RoundLine(epoch=1, epochs=2, round=1, rounds=2, attempt=2, step=8, loss=4.81234,
                       tokens=4096, tokens_seen=16384, reported=2, members=2,
                       metrics={"reward": 0.25}, eta_s=3725.4)  # fmt: skip


@pytest.mark.timeout(300)
def test_job_page_without_scripts_shows_the_job_as_the_script_draws_it(
    done: Done, tmp_path: Path
) -> None:
    """A browser that runs no script (a plain headless screenshot) gets the job in the page's
    HTML: id, state, epochs, members, money and the loss curves, the same texts the script
    draws."""
    page_data = JobPage(done.bsm, done.job_id, done.data_dirs)
    page_data.progress = LAST_ROUND.as_dict()["progress"]
    with JobPageServer(page_data, port=0) as server:
        with chromium_page(javascript=False) as page:
            page.goto(server.url)
            assert page.get_attribute("body", "data-view") == "server"
            assert page.get_attribute("body", "data-block") is None  # set by the script only
            assert page.inner_text("#job-id") == str(done.job_id)
            assert page.inner_text("#state") == "completed"
            assert page.title() == f"dtrain job {done.job_id}: completed"
            # the job completed: its last round without the ETA it had (1 h 2 min)
            assert page.inner_text("#progress") == replace(LAST_ROUND, eta_s=None).text()
            assert "ETA" not in page.inner_text("#progress")
            assert "2/2 done" in page.inner_text("#summary")
            listed = [
                li.get_attribute("data-member") for li in page.query_selector_all("#members li")
            ]
            assert sorted(listed) == sorted(done.members)
            assert len(page.query_selector_all("#epochs tbody tr")) == EPOCHS
            total = page.query_selector_all("#payouts tfoot tr td[data-wei]")
            want = chain_totals(done.bsm, done.members)
            assert [int(td.get_attribute("data-wei")) for td in total[:4]] == [
                want[k] for k in PARTS
            ]
            curves = page.query_selector_all("#loss-chart polyline.series")
            drawn = {c.get_attribute("data-member"): c.get_attribute("points") for c in curves}
            assert sorted(drawn) == sorted(done.members)
            assert all(len(p.split()) == EPOCHS * STEPS // SYNC for p in drawn.values())
            static_heldout = _heldout_curves(page)
            assert sorted(static_heldout) == sorted(done.members)
            assert all(len(p.split()) == EPOCHS + 1 for p in static_heldout.values())
            static = {sel: page.inner_text(sel) for sel in SHOWN}
            png = tmp_path / "no-script.png"
            page.screenshot(path=str(png), full_page=True)
        with chromium_page() as page:
            page.goto(server.url)
            page.wait_for_selector("body[data-block]", timeout=30_000)
            live = {sel: page.inner_text(sel) for sel in SHOWN}
            assert _heldout_curves(page) == static_heldout  # the script draws the same
    assert static == live
    assert "Dashed: held-out loss at each epoch's start and end." in live["#loss-note"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


def _heldout_curves(page: Any) -> dict[str, str]:
    """Member -> the points of its dashed held-out curve on the page's chart."""
    lines = page.query_selector_all("#loss-chart polyline.heldout")
    return {c.get_attribute("data-member"): c.get_attribute("points") for c in lines}


def test_watch_web_errors_are_one_line(done: Done, tmp_path: Path, capsys) -> None:
    base = ["--rpc-url", done.rpc_url, "--contract", done.bsm.address, "job", "watch"]
    cases = [
        ([str(done.job_id), "--metrics", str(tmp_path)], 2, "Error: --metrics needs --web"),
        (["999", "--web", "--port", "0"], 1, "error: "),
    ]
    for args, code, message in cases:
        assert cli_main([*base, *args]) == code
        out, err = capsys.readouterr()
        assert out == "" and message in err, (args, err)
        if code == 1:  # a usage error (2) shows click's usage lines first
            assert len(err.strip().splitlines()) == 1, err

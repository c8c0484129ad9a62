"""The job page's JSON, assembled from events, a job snapshot and metrics records (pure), and
its server over a canned snapshot; metrics paths that appear later; clients that leave
mid-answer."""

from __future__ import annotations

import json
import socket
import struct
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from dtrain.errors import ConfigError
from dtrain.jobpage import (
    PAGE,
    Curves,
    JobPage,
    JobPageServer,
    assemble,
    first_view,
    metrics_files,
    not_there_yet,
    read_records,
)
from dtrain.jobpage_html import render
from dtrain.models import Event, Job, JobSpec, JobState, JobStatus, Params, SlashReason

ETH = 10**18
PRICE = ETH // 100
A, B, C = ("0x" + c * 40 for c in "abc")
TREASURY, DEVELOPER, CALLER = ("0x" + c * 40 for c in "def")
PARAMS = Params(treasury=TREASURY, developer=DEVELOPER)
CKPT = bytes(range(32))


class Log:
    """Events in block order, each in its own transaction unless told."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def add(self, name: str, tx: str = "", **args: Any) -> Event:
        index = sum(e.tx_hash == tx for e in self.events) if tx else 0
        e = Event(name, args, len(self.events) + 1, tx or f"0x{len(self.events):064x}", index)
        self.events.append(e)
        return e


def job(status: JobStatus, epoch: int, members: tuple[str, ...] = (), epochs: int = 2) -> Job:
    spec = JobSpec(
        price_per_operator_epoch=PRICE,
        total_epochs=epochs,
        steps_per_epoch=4,
        sync_interval=2,
        min_operators=2,
        max_operators=3,
        model_uri="builtin:tiny",
    )
    state = JobState(CALLER, status, epoch, 0, epoch + 1, 0, PRICE, CKPT)
    return Job(id=7, spec=spec, state=state, members=members, block=42)


def settle_epoch(log: Log, epoch: int, paid: list[str], late: str = "") -> None:
    """A finalize transaction paying `paid` (the pool's cut of `late` to the treasury)."""
    tx = f"0xf{epoch:063x}"
    for op in paid:
        log.add("Credited", tx, account=op, amount=PRICE * 4 // 10)
        if op == late:
            log.add("Credited", tx, account=TREASURY, amount=PRICE * 2 // 10)
        log.add("OperatorPaid", tx, jobId=7, epoch=epoch, operator=op, price=PRICE)
    log.add("EpochFinalized", tx, jobId=7, epoch=epoch, checkpoint=CKPT, paidMembers=len(paid))


def two_epochs() -> tuple[list[Event], list[Event]]:
    """Epoch 1: A and B paid, C silent and slashed; epoch 2: A and B paid, B's pool had no
    earning shares (its cut went to the treasury). Returns (job events, Credited events)."""
    log = Log()
    log.add("EpochStarted", jobId=7, epoch=0, attempt=1, memberCount=3)
    for op in (A, B):
        log.add("CheckpointCommitted", jobId=7, epoch=0, operator=op, commitment=CKPT)
    log.add(
        "Slashed",
        operator=C,
        jobId=7,
        epoch=0,
        reason=int(SlashReason.DROPOUT),
        amount=ETH // 20,
        reporter=A,
    )
    settle_epoch(log, 0, [A, B])
    log.add("EpochStarted", jobId=7, epoch=1, attempt=2, memberCount=2)
    settle_epoch(log, 1, [A, B], late=B)
    log.add("JobCompleted", jobId=7, finalCheckpoint=CKPT, refund=2 * PRICE)
    credited = [e for e in log.events if e.name == "Credited"]
    return [e for e in log.events if e.name != "Credited"], credited


def test_payouts_split_each_paid_operator_epoch_as_the_contract_does() -> None:
    events, credited = two_epochs()
    p = assemble(job(JobStatus.COMPLETED, 2), events, credited, PARAMS)["payouts"]
    rows = {r["address"]: r for r in p["rows"]}
    assert list(rows) == [A, B]
    assert rows[A]["epochs"] == 2 and rows[B]["epochs"] == 2
    assert rows[A]["operator"] == {"wei": str(8 * PRICE // 10), "text": "0.008 ETH"}
    assert rows[A]["stakers"]["wei"] == str(4 * PRICE // 10)
    # B's second pool cut went to the treasury: protocol, not stakers.
    assert rows[B]["stakers"]["wei"] == str(2 * PRICE // 10)
    assert rows[B]["protocol"]["wei"] == str(6 * PRICE // 10)
    assert rows[A]["developer"]["text"] == "0.004 ETH"
    total = p["total"]
    assert total["epochs"] == 4 and total["total"]["wei"] == str(4 * PRICE)
    parts = ("operator", "stakers", "protocol", "developer")
    assert sum(int(total[k]["wei"]) for k in parts) == 4 * PRICE
    assert p["split_bps"] == {
        "operator": 4000,
        "stakers": 2000,
        "protocol": 2000,
        "developer": 2000,
    }


def test_epochs_members_slashes_and_refund_from_events() -> None:
    events, credited = two_epochs()
    d = assemble(job(JobStatus.COMPLETED, 2), events, credited, PARAMS)
    e1, e2 = d["epochs"]
    assert (e1["epoch"], e1["status"], e1["attempts"]) == (0, "finalized", 1)
    assert e1["members"] == [A, B, C]  # C never voted: a member all the same, slashed
    assert e1["paid"] == [A, B] and e1["slashed"] == [C]
    assert e1["checkpoint"] == "0x" + CKPT.hex()
    assert e2["members"] == [A, B] and e2["slashed"] == []
    assert d["slashes"] == [
        {
            "operator": C,
            "epoch": 0,
            "reason": "dropout",
            "amount": {"wei": str(ETH // 20), "text": "0.05 ETH"},
            "reporter": A,
        }
    ]
    assert d["refund"]["text"] == "0.02 ETH"
    j = d["job"]
    assert (j["state"], j["epochs_done"], j["epochs_total"], j["method"]) == (
        "completed",
        2,
        2,
        "CPT",
    )
    assert j["price"]["text"] == "0.01 ETH"
    assert d["block"] == 42


def test_running_epoch_shows_the_current_members_and_a_failed_attempt() -> None:
    log = Log()
    log.add("EpochStarted", jobId=7, epoch=0, attempt=1, memberCount=2)
    log.add("CheckpointCommitted", jobId=7, epoch=0, operator=A, commitment=CKPT)
    log.add("EpochFailed", jobId=7, epoch=0, failedEpochs=1)
    log.add("EpochStarted", jobId=7, epoch=0, attempt=2, memberCount=2)
    d = assemble(job(JobStatus.RUNNING, 0, members=(A, B)), log.events, [], PARAMS)
    e1, e2 = d["epochs"]
    assert (e1["status"], e1["attempts"], e1["members"]) == ("running", 2, [A, B])
    assert e2["status"] == "not started"
    assert d["payouts"]["rows"] == [] and d["payouts"]["total"]["total"]["wei"] == "0"
    assert d["refund"] is None and d["members"] == [A, B]


def rnd(node: str, epoch: int, r: int, loss: float, job_id: int = 7) -> dict[str, Any]:
    return {"kind": "round", "node": node, "job": job_id, "epoch": epoch, "round": r,
            "loss": loss}  # fmt: skip


def test_loss_curve_per_member_by_step_of_this_job_only() -> None:
    records = [
        {"kind": "epoch_start", "node": A, "job": 7, "epoch": 0},
        rnd(A, 0, 0, 5.0),
        rnd(A, 0, 1, 4.0),
        rnd(A, 0, 1, 3.9),  # a retried attempt's round replaces the first one's
        rnd(A, 1, 0, 3.5),
        rnd(B, 0, 0, 5.1),
        rnd(B, 0, 0, 9.9, job_id=8),
    ]
    d = assemble(job(JobStatus.RUNNING, 1, (A, B)), [], [], PARAMS, Curves(records, ["op1", "op2"]))
    series = {s["member"]: s["points"] for s in d["loss"]["series"]}
    assert [(p["step"], p["loss"]) for p in series[A]] == [(2, 5.0), (4, 3.9), (6, 3.5)]
    assert series[A][2] == {"step": 6, "epoch": 1, "round": 1, "loss": 3.5}
    assert [p["loss"] for p in series[B]] == [5.1]
    assert d["loss"]["sources"] == ["op1", "op2"]


def test_heldout_curve_at_each_epochs_start_and_end_per_member() -> None:
    """The held-out loss each member measured at an epoch's start and end; the next epoch's
    start from the same checkpoint replaces the end at that step; other jobs' records and
    records without the measurement are left out."""
    spe = job(JobStatus.RUNNING, 1).spec.steps_per_epoch

    def held(kind: str, node: str, epoch: int, loss: float | None, job_id: int = 7) -> dict:
        r = {"kind": kind, "node": node, "job": job_id, "epoch": epoch}
        return r if loss is None else {**r, "heldout_loss": loss}

    records = [
        held("epoch_start", A, 0, 5.0),
        rnd(A, 0, 0, 4.8),
        held("epoch_trained", A, 0, 4.1),
        held("epoch_start", A, 1, 4.0),  # the same checkpoint, measured again: replaces 4.1
        held("epoch_trained", A, 1, 3.5),
        held("epoch_start", B, 0, None),  # a backend that measures nothing
        held("epoch_trained", B, 0, 9.0, job_id=8),
    ]
    d = assemble(job(JobStatus.RUNNING, 1, (A, B)), [], [], PARAMS, Curves(records, ["op1"]))
    (a,) = d["loss"]["heldout"]
    assert a["member"] == A
    assert [(p["step"], p["loss"]) for p in a["points"]] == [(0, 5.0), (spe, 4.0), (2 * spe, 3.5)]
    html = render(PAGE, d)
    assert html.count('class="heldout"') == 1 and "Dashed: held-out loss" in html


def test_metrics_paths_are_data_dirs_or_files(tmp_path: Path) -> None:
    (tmp_path / "op1").mkdir()
    (tmp_path / "op1" / "metrics.jsonl").write_text('{"kind": "round"}\n{"kind": "ro')
    (tmp_path / "m.jsonl").write_text('{"kind": "joined"}\n')
    files = metrics_files([tmp_path / "op1", tmp_path / "m.jsonl"])
    assert files == [tmp_path / "op1" / "metrics.jsonl", tmp_path / "m.jsonl"]
    # A line being written is skipped; a data dir without its file yet reads as nothing.
    assert read_records(files) == [{"kind": "round"}, {"kind": "joined"}]
    (tmp_path / "op2").mkdir()
    assert read_records(metrics_files([tmp_path / "op2"])) == []
    assert not_there_yet([tmp_path / "op1", tmp_path / "late"]) == [tmp_path / "late"]


class Chain:
    """What `JobPage` reads of the chain: job 7 running epoch 2 with A and B, no events."""

    w3 = SimpleNamespace(eth=SimpleNamespace(block_number=50))

    def job(self, job_id: int) -> Job:
        return job(JobStatus.RUNNING, 1, (A, B))

    def params(self) -> Params:
        return PARAMS

    def job_token(self, job_id: int) -> str | None:
        return None

    def events(self, *args: Any) -> list[Event]:
        return []


def test_a_metrics_dir_that_does_not_exist_yet_is_waited_for(tmp_path: Path) -> None:
    """`--metrics DIR` of a node that has not created its data directory yet: the page serves,
    says it waits for DIR, and draws DIR's curve once the node writes it."""
    here, late = tmp_path / "op1", tmp_path / "not-yet" / "op2"
    here.mkdir()
    (here / "metrics.jsonl").write_text(json.dumps(rnd(A, 0, 0, 5.0)) + "\n")
    page = JobPage(Chain(), 7, [here, late])  # type: ignore[arg-type]
    loss = page.snapshot()["loss"]
    assert loss["waiting"] == [str(late)]
    assert [s["member"] for s in loss["series"]] == [A]

    late.mkdir(parents=True)  # the node starts: its data dir, then its metrics
    assert page.snapshot()["loss"]["waiting"] == []
    (late / "metrics.jsonl").write_text(json.dumps(rnd(B, 0, 0, 5.1)) + "\n")
    loss = page.snapshot()["loss"]
    assert loss["waiting"] == [] and [s["member"] for s in loss["series"]] == [A, B]
    assert loss["sources"] == [str(here / "metrics.jsonl"), str(late / "metrics.jsonl")]


def test_page_is_self_contained() -> None:
    """Offline: nothing loaded from elsewhere (the only URL is the SVG namespace)."""
    assert "src=" not in PAGE and "href=" not in PAGE and "@import" not in PAGE
    assert PAGE.count("http") == 1 and "http://www.w3.org/2000/svg" in PAGE


class Canned:
    def __init__(self, snapshot: dict[str, Any]) -> None:
        self._snapshot = snapshot

    def snapshot(self) -> dict[str, Any]:
        if "error" in self._snapshot:
            raise ConfigError(self._snapshot["error"])
        return self._snapshot


def _get(url: str) -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def full_snapshot() -> dict[str, Any]:
    return assemble(job(JobStatus.COMPLETED, 2, (A, B)), *two_epochs(), PARAMS)


def test_server_serves_the_page_and_the_json() -> None:
    snap = full_snapshot()
    with JobPageServer(Canned(snap), port=0) as server:  # type: ignore[arg-type]
        assert server.url.startswith("http://127.0.0.1:")
        code, kind, body = _get(server.url)
        assert (code, kind) == (200, "text/html; charset=utf-8")
        assert body.decode() == render(PAGE, snap) != PAGE
        code, kind, body = _get(server.url + "api/job")
        assert (code, kind, json.loads(body)) == (200, "application/json", snap)
        assert _get(server.url + "nothing")[0] == 404
    with JobPageServer(Canned({"error": "RPC down"}), port=0) as server:  # type: ignore[arg-type]
        code, _, body = _get(server.url + "api/job")
        assert code == 502 and json.loads(body) == {"error": "ConfigError: RPC down"}
        code, _, body = _get(server.url)  # the empty page, saying why; its script retries
        assert code == 200 and "cannot read the job: ConfigError: RPC down" in body.decode()
        assert '<span id="state" class="badge loading">loading</span>' in body.decode()


def test_first_view_holds_the_job_without_any_script() -> None:
    """The HTML itself names the job, its state, epochs, members and money; no slot is left."""
    html = first_view(Canned(full_snapshot()))  # type: ignore[arg-type]
    assert "{{" not in html and '<body data-view="server">' in html
    assert '<span id="job-id">7</span>' in html and "<title>dtrain job 7: completed</title>" in html
    assert '<span id="state" class="badge completed">completed</span>' in html
    assert "epoch 2/2 done \u00b7 0.01 ETH per operator-epoch \u00b7 3 operators took part" in html
    assert html.count('<tr data-epoch="') == 2 and html.count('<tr data-operator="') == 2
    assert f'<li data-member="{A}">' in html and f'<li data-member="{C}">' in html
    assert f'<td class="num" data-wei="{4 * PRICE}">0.04 ETH</td>' in html  # total paid
    assert "<td>dropout</td>" in html and '<table id="slashes">' in html
    assert "No metrics given" in html and 'class="series"' not in html  # no curve to draw


def test_first_view_draws_each_members_loss_curve() -> None:
    d = full_snapshot()
    d["loss"]["series"] = [
        {"member": A, "points": [{"step": 2, "epoch": 0, "round": 1, "loss": 5.0},
                                 {"step": 4, "epoch": 0, "round": 2, "loss": 4.25}]},
        {"member": B, "points": []},
    ]  # fmt: skip
    html = render(PAGE, d)
    assert html.count('<polyline class="series"') == 1 and f'data-member="{A}"' in html
    assert html.count("<circle ") == 2 and "epoch 0 round 2: 4.25</title>" in html
    assert "(2 rounds, last 4.25)" in html  # the legend, as the script writes it


def test_first_view_escapes_what_the_job_names() -> None:
    """A job's URIs are whatever its caller wrote on chain: text on the page, never markup."""
    snap = full_snapshot()
    snap["job"]["model_uri"] = '<img src=x onerror="alert(1)">'
    html = render(PAGE, snap)
    assert "<img" not in html and "&lt;img src=x onerror=" in html


def test_a_taken_port_is_one_config_error() -> None:
    with (
        JobPageServer(Canned({}), port=0) as server,  # type: ignore[arg-type]
        pytest.raises(ConfigError, match=r"cannot serve on 127\.0\.0\.1:"),
    ):
        JobPageServer(Canned({}), port=server.server_address[1])  # type: ignore[arg-type]


class Slow:
    """A page whose JSON is large (more than the socket buffers hold) and is made only once the
    test lets it."""

    def __init__(self) -> None:
        self.asked, self.go = threading.Event(), threading.Event()

    def snapshot(self) -> dict[str, Any]:
        self.asked.set()
        assert self.go.wait(30)
        return {"blob": "x" * (32 << 20)}


def test_a_client_leaving_mid_answer_ends_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    """The client reads the start of the answer, then resets the connection: the server's
    write fails mid-answer, which is counted, not printed; the next client is served."""
    page = Slow()
    with JobPageServer(page, port=0) as server:  # type: ignore[arg-type]
        host, port = server.server_address[:2]
        client = socket.create_connection((host, port), timeout=30)
        client.sendall(b"GET /api/job HTTP/1.1\r\nHost: localhost\r\n\r\n")
        assert page.asked.wait(30)
        page.go.set()
        assert client.recv(4096).startswith(b"HTTP/1.0 200 OK")  # the answer has begun
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset: the rest of the answer has nowhere to go
        assert server.wait_disconnects(1, 30)
        assert server.disconnects == 1
        code, _, body = _get(server.url + "api/job")
        assert code == 200 and json.loads(body)["blob"] == "x" * (32 << 20)
    _, err = capfd.readouterr()
    assert "Traceback" not in err and "Error" not in err, err


@pytest.mark.parametrize(
    ("status", "epoch", "final"),
    [
        (JobStatus.COMPLETED, 2, 1),  # the last of two
        (JobStatus.CANCELLED, 1, 0),  # its last paid epoch: the one it finalized
        (JobStatus.CANCELLED, 0, None),  # cancelled before any epoch was paid
        (JobStatus.RUNNING, 1, None),
        (JobStatus.FAILED, 1, 0),  # failed after a paid epoch: that epoch's
        (JobStatus.FAILED, 0, None),
    ],
)
def test_final_epoch_is_the_last_paid_one_of_an_ended_job(
    status: JobStatus, epoch: int, final: int | None
) -> None:
    assert job(status, epoch).final_epoch == final

"""A job's page in the browser: `dtrain job watch JOB --web`.

A small local HTTP server (stdlib, one thread per request) serves `GET /`, one self-contained
HTML page (inline CSS and JS, no network) with the job already drawn in it (`jobpage_html`: a
browser without scripts shows it too), and `GET /api/job`, the job as JSON, which the page
polls to redraw it. The JSON is assembled from on-chain reads and events (`assemble`, pure)
and from the members' metrics files for the loss curve (each node appends a `round` record with
the mean training loss of every sync round to `metrics.jsonl` in its data directory). A metrics
path that does not exist yet (a node that has not created its data directory) is waited for: it
reads as nothing, and the page says it waits for it, until it appears.

A client that leaves before its answer is sent (a closed tab, a cancelled poll) ends its request
quietly: counted (`JobPageServer.disconnects`) and logged at debug level, no traceback.

Payouts follow the contract's split of a paid operator-epoch (`_pay`, `_payShared`): the
operator's and the stake pool's cuts, the developer's cut and the rest to the protocol
treasury; a pool's cut goes to the treasury instead when no share of the pool earned yet or the
epoch was finalized too late, which the `Credited` event logged just before its `OperatorPaid`
says. Amounts travel as strings of base units (wei does not fit a JavaScript number) next to
their text, in ether or, for a job escrowed in a token, in the token.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from .client import BSM, JOB_EVENTS
from .errors import ConfigError, DtrainError
from .jobpage_html import COLORS, render
from .models import Event, Job, JobStatus, Params, SlashReason
from .units import format_eth

log = logging.getLogger("dtrain.jobpage")

METRICS_FILE = "metrics.jsonl"
POLL_S = 3  # how often the page asks for the job again
BPS = 10_000
SETTLED_BY = {"EpochFinalized": "finalized", "JobAborted": "aborted"}
ENDS = ("JobCompleted", "JobFailed", "JobCancelled", "JobAborted")  # each with its refund
VOTERS = ("CheckpointCommitted", "CheckpointRevealed", "OperatorPaid", "Slashed")


# ---------------------------------------------------------------------------- the JSON (pure)


Fmt = Callable[[int], str]


@dataclass(frozen=True)
class Unit:
    """What a job's amounts are in: ether (`token` None) or a token, and how to write them."""

    token: str | None
    format: Fmt


ETHER = Unit(None, format_eth)


def _amount(wei: int, fmt: Fmt = format_eth) -> dict[str, str]:
    """An amount in base units (wei, or the job's token's) as a string, and its text."""
    return {"wei": str(wei), "text": fmt(wei)}


@dataclass(frozen=True)
class Cuts:
    """One paid operator-epoch split as the contract splits it."""

    operator: int
    stakers: int
    protocol: int
    developer: int

    @classmethod
    def of(cls, price: int, params: Params, stakers_to_treasury: bool = False) -> Cuts:
        operator = price * params.operator_bps // BPS
        stakers = price * params.staker_bps // BPS
        developer = price * params.developer_bps // BPS
        protocol = price - operator - stakers - developer
        if stakers_to_treasury:
            stakers, protocol = 0, protocol + stakers
        return cls(operator, stakers, protocol, developer)

    def __add__(self, other: Cuts) -> Cuts:
        return Cuts(
            self.operator + other.operator,
            self.stakers + other.stakers,
            self.protocol + other.protocol,
            self.developer + other.developer,
        )

    @property
    def total(self) -> int:
        return self.operator + self.stakers + self.protocol + self.developer

    def as_json(self, fmt: Fmt = format_eth) -> dict[str, Any]:
        names = ("operator", "stakers", "protocol", "developer", "total")
        return {n: _amount(getattr(self, n), fmt) for n in names}


NO_CUTS = Cuts(0, 0, 0, 0)


def _stakers_to_treasury(
    paid: Event, credited: Mapping[tuple[str, int], Event], treasury: str, stakers_cut: int
) -> bool:
    """The pool's cut of `paid` went to the treasury: `_pay` credited it there just before
    emitting `OperatorPaid`."""
    before = credited.get((paid.tx_hash, paid.log_index - 1))
    return (
        stakers_cut > 0
        and before is not None
        and before.args["account"] == treasury
        and before.args["amount"] == stakers_cut
    )


def payouts(
    events: Sequence[Event], credited: Sequence[Event], params: Params, fmt: Fmt = format_eth
) -> dict[str, Any]:
    """Per paid operator (`address`): operator-epochs paid and each party's cut of them; and
    the totals."""
    by_position = {(c.tx_hash, c.log_index): c for c in credited}
    rows: dict[str, tuple[int, Cuts]] = {}
    for e in events:
        if e.name != "OperatorPaid":
            continue
        price, op = e.args["price"], e.args["operator"]
        late = _stakers_to_treasury(
            e, by_position, params.treasury, price * params.staker_bps // BPS
        )
        epochs, sums = rows.get(op, (0, NO_CUTS))
        rows[op] = (epochs + 1, sums + Cuts.of(price, params, late))
    total = sum((c for _, c in rows.values()), NO_CUTS)
    return {
        "rows": [{"address": op, "epochs": n, **c.as_json(fmt)} for op, (n, c) in rows.items()],
        "total": {"epochs": sum(n for n, _ in rows.values()), **total.as_json(fmt)},
        "split_bps": {
            "operator": params.operator_bps,
            "stakers": params.staker_bps,
            "protocol": params.protocol_bps,
            "developer": params.developer_bps,
        },
        "treasury": params.treasury,
        "developer": params.developer,
    }


def slashes(events: Sequence[Event]) -> list[dict[str, Any]]:
    return [
        {
            "operator": e.args["operator"],
            "epoch": e.args["epoch"],
            "reason": SlashReason(e.args["reason"]).label,
            "amount": _amount(e.args["amount"]),
            "reporter": e.args["reporter"],
        }
        for e in events
        if e.name == "Slashed"
    ]


def _addresses(items: Iterable[str]) -> list[str]:
    """Each address once, in one order on every row."""
    return sorted(set(items), key=str.lower)


def _epoch_status(job: Job, epoch: int, mine: Sequence[Event]) -> str:
    settled = [SETTLED_BY[e.name] for e in mine if e.name in SETTLED_BY]
    if settled:
        return settled[-1]
    running = job.state.status == JobStatus.RUNNING and job.state.epoch == epoch
    if running:
        return "running"
    if any(e.name == "EpochStarted" for e in mine):
        return "failed"
    return "not started"


def epochs(job: Job, events: Sequence[Event]) -> list[dict[str, Any]]:
    """Every epoch of the job (counted from 0): its state, members, who was paid and slashed."""
    out = []
    for epoch in range(job.spec.total_epochs):
        mine = [e for e in events if e.args.get("epoch") == epoch]
        status = _epoch_status(job, epoch, mine)
        # Once settled, every member voted, was paid or was slashed (a silent one as a dropout).
        members = _addresses(
            job.members
            if status == "running"
            else (e.args["operator"] for e in mine if e.name in VOTERS)
        )
        finalized = [e for e in mine if e.name == "EpochFinalized"]
        out.append(
            {
                "epoch": epoch,
                "status": status,
                "attempts": sum(e.name == "EpochStarted" for e in mine),
                "members": members,
                "paid": _addresses(e.args["operator"] for e in mine if e.name == "OperatorPaid"),
                "slashed": _addresses(e.args["operator"] for e in mine if e.name == "Slashed"),
                "checkpoint": "0x" + finalized[-1].args["checkpoint"].hex() if finalized else None,
            }
        )
    return out


def _refund(events: Sequence[Event], fmt: Fmt = format_eth) -> dict[str, str] | None:
    ends = [e for e in events if e.name in ENDS]
    return _amount(ends[-1].args["refund"], fmt) if ends else None


def epochs_done(job: Job) -> int:
    """Epochs settled with a quorum (the chain's epoch counter)."""
    return job.state.epoch


def loss_series(records: Iterable[Mapping[str, Any]], job: Job) -> list[dict[str, Any]]:
    """Per member, its training loss at the end of each sync round, by training step (a retried
    epoch's rounds replace the failed attempt's)."""
    rounds, sync = job.spec.rounds_per_epoch, job.spec.sync_interval
    by_member: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        if r.get("kind") != "round" or r.get("job") != job.id or "node" not in r:
            continue
        step = (r["epoch"] * rounds + r["round"] + 1) * sync
        point = {"step": step, "epoch": r["epoch"], "round": r["round"] + 1, "loss": r["loss"]}
        by_member.setdefault(r["node"], {})[step] = point
    return _by_step(by_member)


def _by_step(by_member: Mapping[str, Mapping[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each member's points in step order, members sorted."""
    return [
        {"member": m, "points": [pts[s] for s in sorted(pts)]}
        for m, pts in sorted(by_member.items())
    ]


def heldout_series(records: Iterable[Mapping[str, Any]], job: Job) -> list[dict[str, Any]]:
    """Per member, its held-out loss at each epoch's start and end (`epoch_start` and
    `epoch_trained` metrics), by training step; a later record at a step replaces an earlier
    one (a retried epoch, or the next epoch's start from the same checkpoint)."""
    spe = job.spec.steps_per_epoch
    by_member: dict[str, dict[int, dict[str, Any]]] = {}
    for r in records:
        kind = r.get("kind")
        if kind not in ("epoch_start", "epoch_trained") or r.get("job") != job.id:
            continue
        if "node" not in r or not isinstance(r.get("heldout_loss"), (int, float)):
            continue
        step = (r["epoch"] + (kind == "epoch_trained")) * spe
        point = {"step": step, "epoch": r["epoch"], "loss": r["heldout_loss"]}
        by_member.setdefault(r["node"], {})[step] = point
    return _by_step(by_member)


@dataclass(frozen=True)
class Curves:
    """The members' metrics records, the files they were read from, and the given paths that
    do not exist yet (waited for)."""

    records: Iterable[Mapping[str, Any]] = ()
    sources: Sequence[str] = ()
    waiting: Sequence[str] = ()


def assemble(
    job: Job,
    events: Sequence[Event],
    credited: Sequence[Event],
    params: Params,
    curves: Curves = Curves(),
    block: int = 0,
    unit: Unit = ETHER,
) -> dict[str, Any]:
    """The page's JSON: `events` are the job's (block order), `credited` the `Credited` (or,
    for a job in `token`, `TokenCredited`) events of the transactions that paid its members,
    `curves` the members' metrics. `unit` writes the job's amounts (ether, or the token's
    units); the seat bond is always ether."""
    s, st, fmt = job.spec, job.state, unit.format
    return {
        "block": block or job.block,
        "job": {
            "id": job.id,
            "method": s.method.name,
            "state": st.status.name.lower(),
            "caller": st.caller,
            "token": unit.token,
            "price": _amount(s.price_per_operator_epoch, fmt),
            "escrow": _amount(st.escrow, fmt),
            "seat_bond": _amount(s.seat_bond),
            "epochs_done": epochs_done(job),
            "epochs_total": s.total_epochs,
            "steps_per_epoch": s.steps_per_epoch,
            "sync_interval": s.sync_interval,
            "min_operators": s.min_operators,
            "max_operators": s.max_operators,
            "model_uri": s.model_uri,
            "dataset_uri": s.dataset_uri,
            "checkpoint": "0x" + st.checkpoint.hex(),
        },
        "members": list(job.members),
        "pending_joins": list(job.pending_joins),
        "epochs": epochs(job, events),
        "payouts": payouts(events, credited, params, fmt),
        "slashes": slashes(events),
        "refund": _refund(events, fmt),
        "loss": {
            "sources": list(curves.sources),
            "waiting": list(curves.waiting),
            "series": loss_series(curves.records, job),
            "heldout": heldout_series(curves.records, job),
        },
    }


# ---------------------------------------------------------------------------- metrics files


def metrics_file(path: Path) -> Path:
    """A node's metrics file: `path` itself, or `metrics.jsonl` in a node's data directory. Asked
    again on every read: a path that does not exist yet may appear as either."""
    return path / METRICS_FILE if path.is_dir() else path


def metrics_files(paths: Iterable[Path]) -> list[Path]:
    """The metrics files of `paths` (node data directories or metrics files) as they are now."""
    return [metrics_file(p) for p in paths]


def not_there_yet(paths: Iterable[Path]) -> list[Path]:
    """The metrics paths that do not exist yet: waited for (a node creates its data directory
    when it starts), read as nothing until they appear."""
    return [p for p in paths if not p.exists()]


def read_records(files: Iterable[Path]) -> list[dict[str, Any]]:
    """Every JSON record of `files` (a missing file, or a line being written, is skipped)."""
    out = []
    for f in files:
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


# ---------------------------------------------------------------------------- chain reads


def _unit_of(bsm: BSM, job_id: int) -> Unit:
    token = bsm.job_token(job_id)
    if not token:
        return ETHER
    from . import erc20

    t = erc20.contract(bsm.w3, token)
    decimals, symbol = int(t.functions.decimals().call()), str(t.functions.symbol().call())
    return Unit(token, lambda x: erc20.format_units(x, decimals, symbol))


class JobPage:
    """What the page shows of one job, read from the chain (events incrementally) and the
    members' metrics files on every `snapshot`."""

    def __init__(self, bsm: BSM, job_id: int, metrics: Sequence[Path] = ()) -> None:
        self.bsm, self.job_id = bsm, job_id
        self.metrics = list(metrics)  # as given: each resolved again on every snapshot
        self.bsm.job(job_id)  # an unknown job fails here, before serving
        self._params = bsm.params()
        self._unit = _unit_of(bsm, job_id)
        self._events: list[Event] = []
        self._credited: list[Event] = []
        self._next_block = 0
        self._lock = threading.Lock()
        self.gossip: list[dict[str, Any]] = []  # the members' signed progress, as round records
        self.progress: dict[str, Any] | None = None  # the last round line, with the job's ETA

    def add_note(self, body: Mapping[str, Any]) -> None:
        """A member's checked progress note (dtrain.progress) as a point of its loss curve."""
        keys = ("epoch", "round", "loss")
        record = {"kind": "round", "job": self.job_id, "node": body["sender"]}
        with self._lock:
            self.gossip.append({**record, **{k: body[k] for k in keys}})

    def _catch_up(self) -> int:
        head = self.bsm.w3.eth.block_number
        if head >= self._next_block:
            new = self.bsm.events(self._next_block, head, JOB_EVENTS, self.job_id)
            credit = "TokenCredited" if self._unit.token else "Credited"
            for block in sorted({e.block for e in new if e.name == "OperatorPaid"}):
                self._credited += self.bsm.events(block, block, [credit])
            self._events += new
            self._next_block = head + 1
        return head

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            head = self._catch_up()
            events, credited, gossip = list(self._events), list(self._credited), list(self.gossip)
        job = self.bsm.job(self.job_id)
        data = assemble(
            job,
            events,
            credited,
            self._params,
            Curves(
                read_records(metrics_files(self.metrics)) + gossip,
                [str(f) for f in metrics_files(self.metrics)] + (["gossip"] if gossip else []),
                [str(p) for p in not_there_yet(self.metrics)],
            ),
            block=head,
            unit=self._unit,
        )
        data["progress"] = self.progress
        if self.progress and job.state.status.is_ended:  # nothing left to wait for
            data["progress"] = {**self.progress, "eta_s": None}
        return data


# ---------------------------------------------------------------------------- the server


def first_view(page: JobPage) -> str:
    """The page with the job in it (its first view, drawn before any script runs); the chain
    unreadable, the empty page saying why (its script tries again)."""
    try:
        data = page.snapshot()
    except (DtrainError, OSError, ValueError) as exc:
        return render(PAGE, None, f"cannot read the job: {type(exc).__name__}: {exc}")
    return render(PAGE, data)


class _Handler(BaseHTTPRequestHandler):
    server: JobPageServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/":
            self._send(200, "text/html; charset=utf-8", first_view(self.server.page).encode())
        elif path == "/api/job":
            try:
                body, code = self.server.page.snapshot(), 200
            except (DtrainError, OSError, ValueError) as exc:
                body, code = {"error": f"{type(exc).__name__}: {exc}"}, 502
            self._send(code, "application/json", json.dumps(body).encode())
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found\n")

    def _send(self, code: int, content_type: str, body: bytes) -> None:
        try:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)
        except ConnectionError as exc:  # the client left mid-answer: nothing to answer anymore
            self.close_connection = True
            self.server.client_left(self.path, exc)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the terminal shows the URL and the exit line only."""


class JobPageServer(ThreadingHTTPServer):
    """Serves `page` on host:port (port 0: a free one) from `start()` until `close()`."""

    daemon_threads = True

    def __init__(self, page: JobPage, host: str = "127.0.0.1", port: int = 0) -> None:
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}") from None
        self.page = page
        self.disconnects = 0  # clients that left before their answer was sent
        self._left = threading.Condition()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/"

    def client_left(self, what: str, exc: BaseException) -> None:
        """A client left before its answer (to `what`) was sent: counted, logged at debug."""
        log.debug("a client left before its answer to %s: %s", what, type(exc).__name__)
        with self._left:
            self.disconnects += 1
            self._left.notify_all()

    def wait_disconnects(self, n: int, timeout: float | None = None) -> bool:
        """Whether `n` clients have left mid-answer, waiting up to `timeout` seconds."""
        with self._left:
            return self._left.wait_for(lambda: self.disconnects >= n, timeout)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client gone while its request was read or answered ends quietly; anything else
        is reported as socketserver does (a traceback on stderr)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            self.client_left(f"a request from {client_address[0]}", exc)
            return
        super().handle_error(request, client_address)

    def start(self) -> JobPageServer:
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join()
        self.server_close()

    def __enter__(self) -> JobPageServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


PAGE = (
    """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{{title}}</title>
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 24px 32px; color: #1d2330;
         background: #f6f7f9; }
  h1 { font-size: 22px; margin: 0 0 4px; }
  h2 { font-size: 16px; margin: 24px 0 8px; }
  .card { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 14px 18px;
          margin-bottom: 16px; }
  .badge { display: inline-block; padding: 2px 10px; border-radius: 12px; font-size: 13px;
           font-weight: 600; background: #e3e8ef; vertical-align: middle; }
  .badge.completed { background: #d6f5df; color: #116329; }
  .badge.running, .badge.open { background: #dbeafe; color: #1e4fa3; }
  .badge.failed, .badge.cancelled { background: #fde2e1; color: #a1231b; }
  dl { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 0; }
  dt { color: #5b6576; } dd { margin: 0; overflow-wrap: anywhere; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid #e6e9ee; }
  th { color: #5b6576; font-weight: 600; font-size: 13px; }
  td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
  tfoot td { font-weight: 700; border-top: 2px solid #c9ced6; }
  code, .addr { font-family: ui-monospace, monospace; font-size: 12.5px; }
  .swatch { display: inline-block; width: 12px; height: 12px; border-radius: 2px;
            margin-right: 6px; vertical-align: -1px; }
  .note { color: #5b6576; }
  #members li { margin: 2px 0; }
  #headline { font-size: 15px; margin: 2px 0; }
  .row { display: flex; gap: 16px; flex-wrap: wrap; }
  .row > .card { flex: 1 1 420px; min-width: 0; }
  .who { white-space: nowrap; margin-right: 10px; display: inline-block; }
  svg text { font: 11px system-ui, sans-serif; fill: #5b6576; }
</style>
</head>
<body data-view="{{view}}">
<h1>Job <span id="job-id">{{job_id}}</span> <span id="method">{{method}}</span>
  <span id="state" class="badge {{state}}">{{state}}</span></h1>
<div id="headline">{{headline}}</div>
<div id="progress">{{progress}}</div>
<div class="note" id="updated">{{updated}}</div>
<div class="card"><h2>Loss curve</h2>
  <svg id="loss-chart" width="100%" viewBox="0 0 1000 300">{{loss_chart}}</svg>
  <div id="legend">{{legend}}</div><div class="note" id="loss-note">{{loss_note}}</div>
</div>
<div class="card"><h2>Payouts</h2>
  <table id="payouts"><thead><tr><th>operator</th><th class="num">epochs paid</th>
  <th class="num">operator</th><th class="num">stakers</th><th class="num">protocol</th>
  <th class="num">developer</th><th class="num">total</th></tr></thead>
  <tbody>{{payout_rows}}</tbody><tfoot>{{payout_total}}</tfoot></table>
  <div class="note" id="payout-note">{{payout_note}}</div></div>
<div class="card"><h2>Epochs</h2>
  <table id="epochs"><thead><tr><th>epoch</th><th>state</th><th>members</th><th>paid</th>
  <th>slashed</th><th>checkpoint</th></tr></thead><tbody>{{epoch_rows}}</tbody></table></div>
<div class="card"><h2>Slashes</h2>
  <table id="slashes"{{slashes_hidden}}><thead><tr><th>operator</th><th>epoch</th><th>reason</th>
  <th class="num">amount</th><th>finalized by</th></tr></thead><tbody>{{slash_rows}}</tbody></table>
  <div class="note" id="slash-note">{{slash_note}}</div></div>
<div class="row">
  <div class="card"><h2>Members</h2><ul id="members">{{members}}</ul></div>
  <div class="card"><h2>Job</h2><dl id="summary">{{summary}}</dl></div>
</div>
<script>
"use strict";
const POLL_MS = """
    + str(POLL_S * 1000)
    + """;
const COLORS = """
    + json.dumps(COLORS)
    + """;
const SVG = "http://www.w3.org/2000/svg";
const $ = (sel) => document.querySelector(sel);
const short = (a) => a.slice(0, 6) + "\\u2026" + a.slice(-4);

function el(tag, attrs, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4))
                                      : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c);
  return node;
}
function cell(text, cls) { return el("td", cls ? {class: cls} : {}, text); }
function amount(a) { return el("td", {class: "num", "data-wei": a.wei}, a.text); }
function addr(a) { return el("span", {class: "addr", title: a}, a); }
function member(m) {
  return el("span", {class: "who"},
    el("span", {class: "swatch", style: `background:${colorOf[m] || "#999"}`}), addr(m));
}
function fill(node, ...children) { node.replaceChildren(...children); }

let colorOf = {};
function colors(data) {
  const all = [...data.members];
  for (const e of data.epochs) all.push(...e.members);
  for (const s of data.loss.series) all.push(s.member);
  for (const m of all) {
    if (!(m in colorOf)) colorOf[m] = COLORS[Object.keys(colorOf).length % COLORS.length];
  }
}

function taking(d) {
  const ended = ["completed", "failed", "cancelled"].includes(d.job.state);
  const took = new Set(d.epochs.flatMap((e) => e.members)).size;
  return ended ? `${took} operators took part` : `${d.members.length} members now`;
}

const SPANS = [["d", 86400], ["h", 3600], ["min", 60], ["s", 1]];
function span(seconds) {  // dtrain.units.format_span
  let left = Math.abs(Math.trunc(seconds));
  const parts = [];
  for (const [unit, size] of SPANS) {
    const n = Math.floor(left / size);
    left -= n * size;
    if (n || parts.length) parts.push([n, unit]);
    if (parts.length === 2) break;
  }
  return parts.filter(([n]) => n).map(([n, u]) => `${n} ${u}`).join(" ") || "0 s";
}
function progressLine(p) {  // dtrain.progress.RoundLine.text
  const parts = [`epoch ${p.epoch} (epochs 0..${p.epochs - 1}) round ${p.round + 1}/${p.rounds}`,
    `step ${p.step}`, `loss ${p.loss.toFixed(4)}`,
    `tokens ${p.tokens_seen.toLocaleString("en-US")}`,
    ...Object.entries(p.metrics).map(([k, v]) => `${k.replaceAll("_", " ")} ${v.toFixed(4)}`),
    `${p.reported}/${p.members} members`];
  if (p.eta_s !== null && p.eta_s !== undefined) parts.push(`ETA ${span(Math.round(p.eta_s))}`);
  return "progress: " + parts.join(" | ");
}

function summary(d) {
  const j = d.job;
  $("#job-id").textContent = j.id;
  $("#method").textContent = j.method;
  const state = $("#state");
  state.textContent = j.state;
  state.className = "badge " + j.state;
  const rows = [
    ["epochs", `${j.epochs_done}/${j.epochs_total} done`],
    ["price", `${j.price.text} per operator-epoch`],
    ["members", `${j.min_operators} to ${j.max_operators} per epoch`],
    ["steps", `${j.steps_per_epoch} per epoch, sync every ${j.sync_interval}`],
    ["escrow", `${j.escrow.text} unearned`],
    ["seat bond", j.seat_bond.text],
    ["model", j.model_uri || "-"],
    ["dataset", j.dataset_uri || "-"],
    ["checkpoint", j.checkpoint],
    ["caller", j.caller],
  ];
  if (d.refund) rows.push(["refund", `${d.refund.text} to the caller`]);
  $("#headline").textContent = `epoch ${j.epochs_done}/${j.epochs_total} done \u00b7 ` +
    `${j.price.text} per operator-epoch \u00b7 ${taking(d)} \u00b7 ` +
    `paid so far ${d.payouts.total.total.text}`;
  fill($("#summary"), ...rows.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function members(d) {
  const all = [...new Set([...d.members, ...d.epochs.flatMap((e) => e.members)])];
  const current = new Set(d.members);
  const items = all.map((m) => el("li", {"data-member": m},
    el("span", {class: "swatch", style: `background:${colorOf[m]}`}), addr(m),
    current.has(m) ? " (member now)" : ""));
  for (const m of d.pending_joins) items.push(el("li", {"data-member": m}, addr(m), " (joining)"));
  fill($("#members"), ...(items.length ? items : [el("li", {}, "nobody yet")]));
}

function chart(d) {
  const svg = $("#loss-chart"), series = d.loss.series.filter((s) => s.points.length);
  const heldout = (d.loss.heldout || []).filter((s) => s.points.length);
  const W = 1000, H = 300, L = 56, R = 16, T = 12, B = 36;
  const pts = series.flatMap((s) => s.points);
  const drawn = pts.concat(heldout.flatMap((s) => s.points));
  const parts = [];
  const note = $("#loss-note");
  const waiting = d.loss.waiting && d.loss.waiting.length ?
    " Waiting for " + d.loss.waiting.join(", ") + " to appear (a node creates its --data-dir " +
    "when it starts)." : "";
  if (!d.loss.sources.length) {
    note.textContent = "No metrics given: the curve comes from the members' metrics files " +
      "(`dtrain job watch " + d.job.id + " --web --metrics NODE_DATA_DIR`, once per member; " +
      "each node writes metrics.jsonl in its --data-dir).";
  } else if (!pts.length) {
    note.textContent = "No training rounds of this job yet in " + d.loss.sources.join(", ") +
      "." + waiting;
  } else {
    const dashed = (d.loss.heldout || []).some((s) => s.points.length) ?
      " Dashed: held-out loss at each epoch's start and end." : "";
    note.textContent = "Training loss at each sync round, from " + d.loss.sources.join(", ") +
      "." + dashed + waiting;
  }
  const stepsTotal = d.job.steps_per_epoch * d.job.epochs_total;
  const x0 = 0, x1 = Math.max(stepsTotal, ...drawn.map((p) => p.step), 1);
  let y0 = Math.min(...drawn.map((p) => p.loss)), y1 = Math.max(...drawn.map((p) => p.loss));
  if (!drawn.length) { y0 = 0; y1 = 1; }
  const pad = (y1 - y0) * 0.08 || 0.5;
  y0 -= pad; y1 += pad;
  const X = (s) => L + (s - x0) / (x1 - x0) * (W - L - R);
  const Y = (v) => T + (y1 - v) / (y1 - y0) * (H - T - B);
  parts.push(el("svg:rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "#fbfcfd",
                             stroke: "#dde1e7"}));
  for (let i = 0; i <= 4; i++) {
    const v = y0 + (y1 - y0) * i / 4;
    parts.push(el("svg:line", {x1: L, x2: W - R, y1: Y(v), y2: Y(v), stroke: "#eceff3"}));
    const t = el("svg:text", {x: L - 6, y: Y(v) + 4, "text-anchor": "end"}, v.toFixed(3));
    parts.push(t);
  }
  for (let e = 0; e <= d.job.epochs_total; e++) {
    const s = e * d.job.steps_per_epoch, x = X(s);
    parts.push(el("svg:line", {x1: x, x2: x, y1: T, y2: H - B, stroke: "#c9ced6",
                               "stroke-dasharray": e && e < d.job.epochs_total ? "4 3" : ""}));
    parts.push(el("svg:text", {x: x, y: H - B + 14, "text-anchor": "middle"}, String(s)));
    if (e < d.job.epochs_total) {
      parts.push(el("svg:text", {x: X(s + d.job.steps_per_epoch / 2), y: T + 14,
                                 "text-anchor": "middle"}, "epoch " + e));
    }
  }
  parts.push(el("svg:text", {x: L + (W - L - R) / 2, y: H - 4, "text-anchor": "middle"},
                "training step"));
  parts.push(el("svg:text", {x: 14, y: T + (H - T - B) / 2, "text-anchor": "middle",
                             transform: `rotate(-90 14 ${T + (H - T - B) / 2})`}, "loss"));
  for (const s of series) {
    const color = colorOf[s.member];
    parts.push(el("svg:polyline", {class: "series", "data-member": s.member,
      "data-points": s.points.length, fill: "none", stroke: color, "stroke-width": 2,
      points: s.points.map((p) => `${X(p.step).toFixed(1)},${Y(p.loss).toFixed(1)}`).join(" ")}));
    for (const p of s.points) {
      const dot = el("svg:circle", {cx: X(p.step), cy: Y(p.loss), r: 3, fill: color});
      const tip = `${short(s.member)} epoch ${p.epoch} round ${p.round}: ${p.loss}`;
      dot.append(el("svg:title", {}, tip));
      parts.push(dot);
    }
  }
  for (const s of heldout) {  // dashed: held-out loss at each epoch's start and end
    const line = el("svg:polyline", {class: "heldout", "data-member": s.member,
      "data-points": s.points.length, fill: "none", stroke: colorOf[s.member],
      "stroke-width": 1.5, "stroke-dasharray": "6 4",
      points: s.points.map((p) => `${X(p.step).toFixed(1)},${Y(p.loss).toFixed(1)}`).join(" ")});
    const last = s.points[s.points.length - 1];
    line.append(el("svg:title", {}, `${short(s.member)} held-out loss: ${last.loss}`));
    parts.push(line);
  }
  fill(svg, ...parts);
  fill($("#legend"), ...series.map((s) => el("span", {class: "who"},
    el("span", {class: "swatch", style: `background:${colorOf[s.member]}`}), addr(s.member),
    ` (${s.points.length} rounds, last ${s.points[s.points.length - 1].loss})`)));
}

function who(m) {
  return el("span", {class: "who", title: m},
    el("span", {class: "swatch", style: `background:${colorOf[m] || "#999"}`}), short(m));
}
function list(xs) { return el("td", {}, ...(xs.length ? xs.map(who) : ["-"])); }

function epochTable(d) {
  fill($("#epochs tbody"), ...d.epochs.map((e) => el("tr", {"data-epoch": e.epoch},
    cell(String(e.epoch)), cell(e.status + (e.attempts > 1 ? ` (${e.attempts} attempts)` : "")),
    list(e.members), list(e.paid), list(e.slashed),
    el("td", {}, el("code", {}, e.checkpoint ? e.checkpoint.slice(0, 18) + "\\u2026" : "-")))));
}

function payoutTable(d) {
  const p = d.payouts, cols = ["operator", "stakers", "protocol", "developer", "total"];
  fill($("#payouts tbody"), ...p.rows.map((r) => el("tr", {"data-operator": r.address},
    el("td", {}, member(r.address)), cell(String(r.epochs), "num"),
    ...cols.map((c) => amount(r[c])))));
  fill($("#payouts tfoot"), el("tr", {"data-total": ""}, cell("total"),
    cell(String(p.total.epochs), "num"), ...cols.map((c) => amount(p.total[c]))));
  const b = p.split_bps, pc = (x) => (x / 100) + "%";
  $("#payout-note").textContent = (p.rows.length ? "" : "Nobody paid yet. ") +
    `Each paid operator-epoch: ${pc(b.operator)} to the operator, ${pc(b.stakers)} to its ` +
    `stake pool, ${pc(b.protocol)} to the protocol treasury ${short(p.treasury)}, ` +
    `${pc(b.developer)} to the developer ${short(p.developer)}.`;
}

function slashTable(d) {
  fill($("#slashes tbody"), ...d.slashes.map((s) => el("tr", {},
    el("td", {}, member(s.operator)), cell(String(s.epoch)), cell(s.reason), amount(s.amount),
    el("td", {}, addr(s.reporter)))));
  $("#slashes").hidden = !d.slashes.length;
  $("#slash-note").textContent = d.slashes.length ? "" : "No slashes.";
}

async function refresh() {
  try {
    const r = await fetch("/api/job", {cache: "no-store"});
    const d = await r.json();
    if (!r.ok) throw new Error(d.error || r.statusText);
    colors(d);
    summary(d); members(d); chart(d); epochTable(d); payoutTable(d); slashTable(d);
    $("#progress").textContent = d.progress ? progressLine(d.progress) : "";
    document.title = `dtrain job ${d.job.id}: ${d.job.state}`;
    $("#updated").textContent = `block ${d.block}, read ${new Date().toLocaleTimeString()}` +
      `; refreshed every ${POLL_MS / 1000} s`;
    document.body.dataset.block = d.block;
  } catch (err) {
    $("#updated").textContent = "cannot read the job: " + err.message;
  }
}
refresh();
setInterval(refresh, POLL_MS);
</script>
</body>
</html>
"""
)

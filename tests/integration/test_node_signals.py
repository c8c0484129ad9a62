"""SIGINT and SIGTERM in every state of the operator node, against the real anvil chain.

The node runs in pytest's main thread (signal handlers only run there) with the loopback
transport; the signals are real (`os.kill` of our own process). Its second member is played by
the test through the SDK (registered, joined, commits and reveals when told), so the node waits
in WAIT, REVEAL and FINALIZE for as long as the test wants. A signal meant for a state is sent
either from inside the node's own call into that state (REGISTER, START, TRAIN, COMMIT: a
wrapper around that call) or by a driver thread once the node logged that it is waiting there
(JOIN, WAIT, REVEAL, FINALIZE, DONE); nothing sleeps to synchronise.

One signal: the node leaves at the next safe point and returns {"left": True, ...} (a member
of a running epoch finishes that epoch's vote first and is not slashed); in DONE it stops
serving the final checkpoint. Two: it returns {"stopped": True} at once, having said what that
costs. The CLI's exit status and its plain output: test_cli_signals at the end.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harness.chain import ETH
from harness.loopback import LoopbackHub
from test_operator import CALLER, submit_tiny_job
from web3 import Web3

from dtrain.client import BSM
from dtrain_node.operator.node import Node, NodeConfig

ME, PEER = 1, 2
EPOCH = "epoch 0 (epochs 0..1)"  # the first of the job's two
EPOCH_RE = re.escape(EPOCH)
LEAVE = {
    "REGISTER": "leaving after registering: no job joined, nothing at stake",
    "JOIN": "leaving now: no job joined, nothing at stake",
    "WAIT": "has not started an epoch with us, so we give our seat and its bond back at once",
    "START": "leaving after this epoch: job {job} keeps our seat until the end of " + EPOCH,
    "TRAIN": "leaving after this epoch: job {job} keeps our seat until the end of " + EPOCH,
    "COMMIT": "leaving after this epoch: job {job} keeps our seat until the end of " + EPOCH,
    "REVEAL": "leaving after this epoch: job {job} keeps our seat until the end of " + EPOCH,
    "FINALIZE": "leaving after this epoch: job {job} keeps our seat until the end of " + EPOCH,
    "DONE": "stopping: job {job} ended; no longer serving its final checkpoint",
}
SLASH = r"slashed 5% of our pool \(0\.05 ETH of 1 ETH\) for dropout"
MEMBER = r"stopping now: we are a member of " + EPOCH_RE + r" of job {job}; if we do not "
VOTED = r"stopping now: our vote for " + EPOCH_RE + r" of job {job} is in"
STOP = {
    "REGISTER": r"stopping now: nothing at stake$",
    "JOIN": r"stopping now: nothing at stake$",
    "WAIT": r"stopping now: we hold a seat in job {job}; once it runs an epoch with us, if we do "
    rf"not commit and reveal it we are {SLASH}",
    "START": MEMBER + r"commit by "
    rf"\d\d:\d\d:\d\d \(in \w+\) and reveal by \d\d:\d\d:\d\d \(in \w+\) we are {SLASH}",
    "COMMIT": MEMBER + r"commit by",
    "REVEAL": MEMBER + r"reveal by "
    r"\d\d:\d\d:\d\d \(in \w+\) we are slashed 10% of our pool \(0\.1 ETH of 1 ETH\) for a "
    r"withheld reveal",
    "FINALIZE": VOTED + r" and we leave at its end|" + VOTED + r", but we stay a member",
}
STOP["TRAIN"] = STOP["START"]


class Lines(logging.Handler):
    """The node's log lines as they come, to wait on."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []
        self.cond = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.cond:
            self.lines.append(record.getMessage())
            self.cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = 120) -> str:
        def found() -> str | None:
            return next((x for x in self.lines if re.search(pattern, x)), None)

        with self.cond:
            assert self.cond.wait_for(found, timeout), f"no line {pattern!r} in {self.lines}"
            return found() or ""

    def has(self, pattern: str) -> bool:
        with self.cond:
            return any(re.search(pattern, x) for x in self.lines)


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger = logging.getLogger("dtrain.node")
    h, level = Lines(), logger.level
    logger.addHandler(h)
    logger.setLevel(logging.INFO)
    saved = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        yield h
    finally:
        logger.removeHandler(h)
        logger.setLevel(level)
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])


def send(n: int) -> None:
    """n signals to ourselves: SIGINT first, then SIGTERM (both mean the same)."""
    for sig in (signal.SIGINT, signal.SIGTERM)[:n]:
        os.kill(os.getpid(), sig)


class Scene:
    """Our node (account ME) and the test-played member PEER of one job."""

    def __init__(self, chain: Any, bsm: BSM, accounts: list, dataset: Any, tmp: Path) -> None:
        self.chain, self.bsm, self.accounts, self.dataset, self.tmp = (
            chain,
            bsm,
            accounts,
            dataset,
            tmp,
        )
        self.me = accounts[ME].address
        self.peer = bsm.with_account(accounts[PEER].key)
        self.hub = LoopbackHub()
        self.job_id: int | None = None
        self.errors: list[BaseException] = []

    def job(self, epochs: int = 2) -> int:
        caller = self.bsm.with_account(self.accounts[CALLER].key)
        self.job_id = submit_tiny_job(caller, self.dataset, operators=2, epochs=epochs)
        return self.job_id

    def peer_joins(self) -> None:
        key = bytes(Web3.keccak(text="test-played peer"))
        self.peer.register_operator(ETH, key, ["/ip4/127.0.0.1/tcp/9"], "cpu", 0)
        self.peer.join_job(self.job_id)

    def node(self, auto: bool = False, linger_s: float = 0.0, factory: Any = None) -> Node:
        cfg = NodeConfig(
            key=self.accounts[ME].key,
            rpc_url=self.chain.url,
            contract=self.bsm.address,
            data_dir=self.tmp / "me",
            job_id=None if auto else self.job_id,
            auto=auto,
            batch_size=4,
            round_deadline_s=0.5,
            poll_s=0.1,
            linger_s=linger_s,
        )
        node = Node(cfg, transport_factory=factory or self.hub.factory)
        node.install_signals()
        return node

    def our_vote(self) -> tuple[bytes, list[int]]:
        recs = [json.loads(x) for x in (self.tmp / "me" / "metrics.jsonl").read_text().splitlines()]
        [trained] = [r for r in recs if r["kind"] == "epoch_trained"]
        return bytes.fromhex(trained["checkpoint"]), trained["participation"]

    def peer_commits(self, votes: Any) -> None:
        """The peer commits the vote we committed (so the epoch is finalized, nobody slashed
        for fabrication)."""
        checkpoint, participation = self.our_vote()
        votes.commit(self.peer, self.job_id, 0, checkpoint, participation)

    def peer_reveals(self, votes: Any) -> None:
        votes.reveal(self.peer, self.job_id, 0)

    def driver(self, steps: Callable[[], None]) -> threading.Thread:
        """Run `steps` beside the node; an error there fails the test."""

        def main() -> None:
            try:
                steps()
            except BaseException as exc:
                self.errors.append(exc)
                os.kill(os.getpid(), signal.SIGTERM)  # (twice: stop the node now)
                os.kill(os.getpid(), signal.SIGTERM)

        t = threading.Thread(target=main, daemon=True)
        t.start()
        return t

    def finish_epoch(self, lines: Lines, votes: Any, after: str = "committed our vote") -> None:
        """Once we committed: the peer commits the same vote, then reveals once we did."""
        lines.wait_for(after)
        self.peer_commits(votes)
        lines.wait_for("revealed our vote")
        self.peer_reveals(votes)


def wrap(obj: Any, name: str, before: Callable[[], None]) -> None:
    """Call `before` each time obj.name is called, first time only, then the original."""
    original = getattr(obj, name)
    done = []

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not done:
            done.append(1)
            before()
        return original(*args, **kwargs)

    setattr(obj, name, wrapped)


def check_outcome(scene: Scene, node: Node, result: dict, state: str, n: int, lines: Lines):
    job = scene.job_id
    if n == 2:
        assert result == {"stopped": True}
        assert lines.has(STOP[state].format(job=job)), lines.lines
        return
    assert lines.has(re.escape(LEAVE[state].format(job=job))), lines.lines
    assert not lines.has("stopping now")
    if state == "DONE":
        assert result["status"] == "completed"
        return
    assert result.get("left") is True, result
    if job is None:
        return
    j = scene.bsm.job(job)
    assert scene.me not in j.members and scene.me not in j.pending_joins
    assert scene.bsm.bonded_of(scene.me) == 0  # the seat bond is free again
    slashed = [e for e in scene.bsm.events(job_id=job) if e.name == "Slashed"]
    assert scene.me not in {e.args["operator"] for e in slashed}
    if state in ("START", "TRAIN", "COMMIT", "REVEAL", "FINALIZE"):  # finished the epoch
        paid = [e for e in scene.bsm.events(job_id=job) if e.name == "OperatorPaid"]
        assert scene.me in {e.args["operator"] for e in paid}


@pytest.fixture
def scene(chain, bsm, accounts, dataset, tmp_path) -> Scene:
    return Scene(chain, bsm, accounts, dataset, tmp_path)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    from dtrain_node.train import corpus

    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


BOTH = pytest.mark.parametrize("n", [1, 2], ids=["once", "twice"])


@pytest.mark.timeout(120)
@BOTH
def test_register(scene: Scene, lines: Lines, n: int) -> None:
    scene.job()
    node = scene.node()
    wrap(node.bsm, "register_operator", lambda: send(n))
    result = node.run()
    check_outcome(scene, node, result, "REGISTER", n, lines)
    assert scene.bsm.operator(scene.me).registered == (n == 1)


@pytest.mark.timeout(120)
@BOTH
def test_join_looking_for_a_job(scene: Scene, lines: Lines, n: int) -> None:
    node = scene.node(auto=True)  # no job on chain: --auto keeps looking
    wrap(node, "_free_stake", lambda: send(n))  # the look at the jobs on chain
    result = node.run()
    check_outcome(scene, node, result, "JOIN", n, lines)
    assert lines.has("JOIN: looking for an open job")


@pytest.mark.timeout(120)
@BOTH
def test_wait(scene: Scene, lines: Lines, n: int) -> None:
    scene.job()  # needs 2 members; only we join: the job waits Open
    node = scene.node()
    wrap(node, "_fail_if_abandoned", lambda: send(n))  # WAIT's poll
    result = node.run()
    check_outcome(scene, node, result, "WAIT", n, lines)
    assert lines.has(f"WAIT: job {scene.job_id} has not started an epoch with us")
    if n == 2:  # stopped now: still holding the seat
        assert scene.me in scene.bsm.job(scene.job_id).members


def _hooked(scene: Scene, state: str, n: int) -> Node:
    """Our node with the signals sent from inside its call into `state`."""
    if state == "TRAIN":

        def factory(cfg: Any, client: BSM, job: int) -> Any:
            t = scene.hub.factory(cfg, client, job)
            t.after_round = lambda res: send(n) if res.round == 0 else None
            return t

        return scene.node(factory=factory)
    node = scene.node()
    if state == "START":
        wrap(node, "_epoch_env", lambda: send(n))
    elif state == "COMMIT":
        wrap(node.bsm, "commit_checkpoint", lambda: send(n))
    return node


@pytest.mark.timeout(180)
@pytest.mark.parametrize("state", ["START", "TRAIN", "COMMIT"])
@BOTH
def test_member_of_a_running_epoch(scene: Scene, lines: Lines, votes, state: str, n: int) -> None:
    scene.job()
    scene.peer_joins()
    node = _hooked(scene, state, n)
    if n == 1:
        scene.driver(lambda: scene.finish_epoch(lines, votes))
    result = node.run()
    assert not scene.errors, scene.errors
    check_outcome(scene, node, result, state, n, lines)
    if n == 1:
        assert lines.has(f"leave of job {scene.job_id} announced")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("state", ["REVEAL", "FINALIZE"])
@BOTH
def test_waiting_for_the_votes(scene: Scene, lines: Lines, votes, state: str, n: int) -> None:
    scene.job()
    scene.peer_joins()
    node = scene.node()

    def steps() -> None:
        lines.wait_for("committed our vote")
        if state == "FINALIZE":
            scene.peer_commits(votes)
            lines.wait_for("FINALIZE: once every member revealed")
        else:
            lines.wait_for("REVEAL: once every member committed")
        send(1)
        lines.wait_for("press Ctrl-C again")
        if n == 2:
            send(2)
            return
        if state == "REVEAL":
            scene.peer_commits(votes)
        lines.wait_for("revealed our vote")
        scene.peer_reveals(votes)

    scene.driver(steps)
    result = node.run()
    assert not scene.errors, scene.errors
    check_outcome(scene, node, result, state, n, lines)


@pytest.mark.timeout(180)
def test_done_lingering(scene: Scene, lines: Lines, votes) -> None:
    scene.job(epochs=1)
    scene.peer_joins()
    node = scene.node(linger_s=3600)

    def steps() -> None:
        scene.finish_epoch(lines, votes)
        lines.wait_for("serving the final checkpoint of job")
        send(1)

    scene.driver(steps)
    result = node.run()
    assert not scene.errors, scene.errors
    check_outcome(scene, node, result, "DONE", 1, lines)


# ---------------------------------------------------------------------- the CLI


PLAIN = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (INFO|WARNING|ERROR) +\S")
TIME = re.compile(r"\d\d:\d\d:\d\d[,.]\d+|\d{4}-\d\d-\d\d")


class Proc:
    """`dtrain node run` as a process; its stderr lines as they come."""

    def __init__(self, argv: list[str]) -> None:
        self.p = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env()
        )
        self.err = Lines()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.p.stderr:
            self.err.emit(logging.makeLogRecord({"msg": line.rstrip("\n")}))

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        self.p.wait(timeout)  # stderr is the reader's: no communicate()
        self.reader.join(10)
        return self.p.returncode, self.p.stdout.read()


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signals", [["SIGINT"], ["SIGINT", "SIGTERM"]], ids=["once", "twice"])
def test_cli_signals(chain, bsm, accounts, dataset, tmp_path, signals) -> None:
    """`dtrain node run` (gossip transport, plain output: stderr is no terminal) waiting for
    its job's second member: one signal gives the seat back and exits 0; two stop it now with
    exit status 128 + the signal and say what that costs. (The two are sent back to back: the
    node leaves within a poll of the first, and two equal signals pending would be one.)"""
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=2)
    argv = [sys.executable, "-m", "dtrain.cli", "--rpc-url", chain.url, "--contract"]
    argv += [bsm.address, "--key", accounts[ME].key, "node", "run"]
    argv += ["--data-dir", str(tmp_path / "me"), "--job", str(job_id)]
    proc = Proc(argv)
    try:
        proc.err.wait_for("WAIT: job")
        for name in signals:
            proc.p.send_signal(signal.Signals[name])
        code, out = proc.finish()
    finally:
        if proc.p.poll() is None:
            proc.p.kill()
    err = proc.err.lines
    logged = [x for x in err if PLAIN.match(x)]
    assert logged and all(len(TIME.findall(x)) == 1 for x in logged), err  # one timestamp
    assert any(f"{signals[0]}: leaving now: job {job_id} has not started" in x for x in err)
    me = accounts[ME].address
    if len(signals) == 1:
        assert code == 0, "\n".join(err)
        assert out.strip() == f"left job {job_id}"
        assert me not in bsm.job(job_id).members and bsm.bonded_of(me) == 0
    else:
        assert code == 128 + signal.SIGTERM, "\n".join(err)
        assert any(
            re.search(f"SIGTERM again: {STOP['WAIT'].format(job=job_id)}", x) for x in err
        ), err
        assert out.strip() == "stopped"
        assert me in bsm.job(job_id).members

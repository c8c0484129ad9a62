"""Operator nodes as OS processes (`dtrain node run`), and `Cluster`: a local chain, a deployed
BSM, one job and its nodes, for the end-to-end tests and the node benchmark."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import forks
from .job import JobOptions, deploy_params, tiny_job
from .plan import node_name

TEST_CORPUS_BYTES = 200_000


@dataclass
class Proc:
    name: str
    address: str
    popen: subprocess.Popen | forks.Forked
    data_dir: Path
    faults: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class NodeConfig:
    """What every node of one job is started with."""

    rpc: str
    contract: str
    job_id: int
    round_deadline: float
    linger: float = 0.0
    keep_final: float = 0.0  # beyond linger, until the caller's receipt (at most)
    step_s: float | None = None  # `--step-seconds` (None: the CLI's default)


def node_command(config: NodeConfig, key: str, data_dir: Path, faults: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "dtrain.cli", "--rpc-url", config.rpc]
    cmd += ["--contract", config.contract, "--key", key, "--json", "node", "run"]
    cmd += ["--data-dir", str(data_dir), "--job", str(config.job_id)]
    cmd += ["--round-deadline", str(config.round_deadline), "--linger", str(config.linger)]
    if config.step_s is not None:
        cmd += ["--step-seconds", str(config.step_s)]
    cmd += ["--keep-final", str(config.keep_final)]
    cmd += ["--no-withdraw"]
    for f in faults:
        cmd += ["--fault", f]
    return cmd


def spawn_node(
    name: str, account: Any, data_dir: Path, config: NodeConfig, faults: list[str]
) -> Proc:
    """Starts `dtrain node run` for `account` (a dev account: address and key) in its own
    process group, its output in data_dir/stdout.log."""
    data_dir.mkdir(parents=True, exist_ok=True)
    out = open(data_dir / "stdout.log", "w")  # noqa: SIM115 - closed once the child has it
    # Several nodes share the machine's cores: one thread each avoids oversubscription.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    p = forks.popen(node_command(config, account.key, data_dir, faults), env, None, out, out)
    out.close()
    return Proc(name, account.address, p, data_dir, faults)


def stop_all(procs: list[Proc]) -> None:
    """Stops every node: a first SIGTERM (a lingering node exits at once, a node mid-epoch
    would finish its epoch), a second one after a short wait (stop now), then SIGKILL."""
    for wait_s in (5, 15):
        for p in procs:
            if p.popen.poll() is None:
                os.killpg(p.popen.pid, signal.SIGTERM)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=wait_s)
    for p in procs:
        if p.popen.poll() is None:
            os.killpg(p.popen.pid, signal.SIGKILL)
            p.popen.wait()


def read_metrics(data_dir: Path) -> list[dict[str, Any]]:
    """A node's metrics.jsonl records (none before it wrote any)."""
    path = data_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _said(p: Proc | None, kind: str, attempt: int) -> bool:
    return p is not None and any(
        m["kind"] == kind and m.get("attempt") == attempt for m in read_metrics(p.data_dir)
    )


def skip_idle_deadline(bsm: Any, job_id: int, procs: list[Proc]) -> int:
    """Moves a devnet chain's clock past the epoch's commit or reveal deadline once nothing is
    left to happen before it: each member yet to commit ran here and went offline for good
    (said `fault_offline` and exited) or gave the attempt up (said `leaving` for it: its
    leave is on chain, it will not vote), and, once reveals are open, each member that committed
    but has not revealed runs here and said it never will (`fault_no_reveal`). The nodes read
    deadlines as max(chain clock, wall clock), so the others go on at once instead of waiting
    for a deadline nobody can act before. The chain time it moved to, or 0 when it left the
    clock alone."""
    from dtrain.models import JobStatus

    job = bsm.job(job_id)
    n, attempt = len(job.members), job.state.attempt
    if job.state.status != JobStatus.RUNNING or not n or job.revealed == n:
        return 0
    now = max(bsm.latest_block_timestamp(), int(time.time()))
    if now > job.reveal_deadline:
        return 0
    ran = {p.address: p for p in procs}  # the latest process of each address
    live = {p.address for p in procs if p.popen.poll() is None}
    subs = {a: bsm.submission_of(job_id, a) for a in job.members}
    silent = [a for a, s in subs.items() if not any(s.commitment)]
    unrevealed = [a for a, s in subs.items() if any(s.commitment) and not any(s.checkpoint)]
    if not silent and not unrevealed:  # every vote is in: the epoch settles now
        return 0
    if not all(
        _gone(ran.get(a), a in live) or _said(ran.get(a), "leaving", attempt) for a in silent
    ):
        return 0
    if silent and now <= job.deadline:
        to = job.deadline + 1  # reveals open after it
    else:
        if not all(a in live and _said(ran[a], "fault_no_reveal", attempt) for a in unrevealed):
            return 0
        to = job.reveal_deadline + 1
    _mine_at(bsm.w3, to)
    return to


def _mine_at(w3: Any, timestamp: int) -> None:
    """Mines a block dated `timestamp`: the chain's clock moves there."""
    w3.provider.make_request("evm_setNextBlockTimestamp", [timestamp])
    w3.provider.make_request("evm_mine", [])


def _gone(p: Proc | None, live: bool) -> bool:
    return not live and _said_ever(p, "fault_offline")


def _said_ever(p: Proc | None, kind: str) -> bool:
    return p is not None and any(m["kind"] == kind for m in read_metrics(p.data_dir))


def tail_logs(procs: list[Proc], lines: int = 15) -> str:
    out = []
    for p in procs:
        f = p.data_dir / "stdout.log"
        if f.is_file():
            out.append(f"--- {p.name}\n" + "\n".join(f.read_text().splitlines()[-lines:]))
    return "\n".join(out)


class Cluster:
    """A local chain, the BSM deployed with the devnet's parameters, one job that takes exactly
    `operators` members (at least 2), and operator nodes as OS processes started with `spawn`
    (for the end-to-end tests and the node benchmark). `options` are the other `JobOptions`
    fields."""

    def __init__(
        self,
        tmp: Path,
        operators: int,
        create_job: bool = True,
        challenge_window: int = 0,
        referees: int = 0,
        seat_draw_window: int = 0,
        step_s: float | None = None,
        **options: Any,
    ) -> None:
        self.tmp = tmp
        self.step_s = step_s  # the nodes' `--step-seconds`
        self.challenge_window = challenge_window
        self.seat_draw_window = seat_draw_window
        self.skip_idle_phases = True  # see `skip_idle_phase`
        self.referee_count = referees  # registered operators outside the job (`spawn_referee`)
        options.setdefault("corpus_bytes", TEST_CORPUS_BYTES)
        self.options = JobOptions(operators, **options)
        self.create_job = create_job  # False: the test submits the job itself (set job_id)
        self.procs: list[Proc] = []
        self.job_id = 0
        self.node_rpc = ""  # the RPC the nodes and referees use, when not the chain's own

    @property
    def rpc(self) -> str:
        return self.node_rpc or self.chain.url

    def __enter__(self) -> Cluster:
        from dtrain import BSM, LocalChain

        o = self.options
        # the deployer, one account a seat, then the treasury, the developer and the caller
        seats = o.operators + o.late_seats
        self.chain = LocalChain(accounts=max(8, seats + self.referee_count + 4)).start()
        acc = self.chain.accounts
        self.treasury, self.developer, self.caller = acc[-3], acc[-2], acc[-1]
        self.ops = acc[1 : 1 + seats]
        self.referees = acc[1 + seats : 1 + seats + self.referee_count]
        self.bsm = BSM.deploy(
            self.chain.url,
            acc[0].key,
            deploy_params(
                self.treasury.address,
                self.developer.address,
                self.challenge_window,
                self.seat_draw_window,
            ),
        )
        if self.challenge_window:
            # a job's juries are drawn from the operators registered when it was created
            for account in self.referees:
                self._register_referee(account)
        if self.create_job:
            self.spec, _ = tiny_job(self.bsm, self.tmp, o)
            self.job_id = self.bsm.with_account(self.caller.key).create_job(self.spec)
        return self

    def spawn(
        self, i: int, faults: list[str] | None = None, linger: float = 0.0, keep_final: float = 0.0
    ) -> Proc:
        return self._spawn(node_name(i), self.ops[i], faults or [], linger, keep_final)

    def spawn_applicant(self, i: int) -> Proc:
        """An operator node for referee account `i` (one more applicant than the job has
        seats, when seats are drawn), named `applicant<i + 1>`."""
        return self._spawn(f"applicant{i + 1}", self.referees[i], [], 0.0)

    def _spawn(
        self, name: str, account: Any, faults: list[str], linger: float, keep: float = 0.0
    ) -> Proc:
        o = self.options
        config = NodeConfig(
            self.rpc, self.bsm.address, self.job_id, o.round_deadline, linger, keep, self.step_s
        )
        p = spawn_node(name, account, self.tmp / name, config, faults)
        self.procs.append(p)
        return p

    def _register_referee(self, account: Any, stake: int = 10**18) -> None:
        if not self.bsm.operator(account.address).registered:
            self.bsm.with_account(account.key).register_operator(
                stake, os.urandom(32), [], "cpu", 0
            )

    def spawn_referee(self, i: int) -> Proc:
        """Starts `dtrain node referee` for referee account `i`: an operator with no seat in the
        job, registered with 1 ETH (with a challenge window, before the job was created)."""
        account = self.referees[i]
        self._register_referee(account)
        name = f"referee{i + 1}"
        data_dir = self.tmp / name
        data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "dtrain.cli", "--rpc-url", self.rpc]
        cmd += ["--contract", self.bsm.address, "--key", account.key, "--json", "node"]
        cmd += ["referee", "--data-dir", str(data_dir)]
        out = open(data_dir / "stdout.log", "w")  # noqa: SIM115 - closed once the child has it
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        popen = forks.popen(cmd, env, None, out, out)
        out.close()
        p = Proc(name, account.address, popen, data_dir)
        self.procs.append(p)
        return p

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Until `cond()`, failing on a crashed node or at `timeout` (wall clock). Meanwhile
        a challenge's first phase that only waits for its end is skipped (`skip_idle_phase`)."""
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            if cond():
                return
            if self.skip_idle_phases:
                self.skip_idle_deadline()
            if self.challenge_window and self.skip_idle_phases:
                self.skip_idle_phase()
            crashed = [
                f"{p.name} (exit {p.popen.returncode})"
                for p in self.procs
                if p.popen.poll() not in (None, 0, -9)
            ]
            if crashed:
                raise AssertionError(
                    f"node(s) {crashed} failed while waiting for {what}: " + self.logs()
                )
            time.sleep(0.5)
        raise AssertionError(f"timed out waiting for {what}: " + self.logs())

    def skip_idle_deadline(self) -> bool:
        """See `skip_idle_deadline` (the module's)."""
        return skip_idle_deadline(self.bsm, self.job_id, self.procs) > 0

    def skip_idle_phase(self) -> bool:
        """Moves the chain's clock to the end of an open challenge's first phase once nothing
        is left to happen in it: every live member node named its files (`files_named`) and
        every drawn referee runs here and prepared its verdict (`verdict_prepared`). The
        nodes read deadlines as max(chain clock, wall clock), so they go on at once; a node
        that has not said so keeps the phase running to its end, as it would without this."""
        job = self.bsm.job(self.job_id)
        attempt = job.state.attempt
        ch = self.bsm.challenge_of(attempt)
        if not ch.open or not ch.referees:
            return False
        end = ch.opened_at + self.challenge_window
        if self.bsm.latest_block_timestamp() >= end or time.time() >= end:
            return False
        by_address = {p.address: p for p in self.procs if p.popen.poll() is None}
        members = [by_address[a] for a in job.members if a in by_address]
        referees = [by_address.get(a) for a in ch.referees]
        if not members or None in referees:
            return False
        said = [(p, "files_named") for p in members] + [(p, "verdict_prepared") for p in referees]
        if not all(_said(p, kind, attempt) for p, kind in said):
            return False
        _mine_at(self.bsm.w3, end)
        return True

    def ended(self) -> bool:
        return self.bsm.job(self.job_id).state.status.is_ended

    def metrics(self, i: int) -> list[dict[str, Any]]:
        return read_metrics(self.tmp / node_name(i))

    def logs(self) -> str:
        return tail_logs(self.procs)

    def __exit__(self, *exc: object) -> None:
        stop_all(self.procs)
        self.chain.stop()

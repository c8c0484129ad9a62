"""The demo's sequence on one local chain: deploy, register the operators, delegate, submit
the job, start the nodes the plan starts with the job, start the late joiner once the job
runs, wait for the job to end (or a node to fail), observe, fetch the final model."""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain.units import format_epoch

from . import paid, report
from .cluster import NodeConfig, Proc, read_metrics, skip_idle_deadline, spawn_node, stop_all
from .final_model import fetch_and_evaluate
from .job import JobOptions, deploy_params, tiny_job
from .money import ETH, Roster, Rules
from .plan import Plan, node_name
from .report import Checks, DemoResult, Observed

if TYPE_CHECKING:
    from dtrain import LocalChain

ACCOUNTS = 16  # dev accounts: 0 deploys, 1.. operators, then these roles
CALLER, TREASURY, DEVELOPER, STAKERS = 9, 10, 11, (12, 13)
GATEWAY, FACILITATOR = 14, 15  # --x402: sells the job; settles x402 payments (pays their gas)
DELEGATIONS = (2 * ETH, ETH)  # staker1 delegates to op1, staker2 to op2
LINGER = 60.0  # seconds a node keeps serving its checkpoint after the job ended
POLL = 0.5


def run(args: argparse.Namespace, plan: Plan, run_dir: Path, checks: Checks) -> DemoResult:
    """The whole story; the chain and every node are stopped when it returns or raises."""
    from dtrain import LocalChain

    with LocalChain(accounts=ACCOUNTS) as chain:
        story = Story(chain, args, plan, run_dir)
        story.set_up()
        try:
            for i in plan.starters:
                story.spawn(i)
            story.watch()
            result = report.build(story.observe(), checks)
            result.purchase = story.purchase
            result.final_model = fetch_and_evaluate(
                chain.url,
                story.bsm.address,
                story.spec,
                story.job_id,
                run_dir / "final-model",
                checks,
            )
            if args.serve and result.final_model:
                result.inference = story.serve(run_dir / "final-model", checks)
            elif args.serve:
                checks.add("the trained model answered a paid chat completion", False, "no model")
            result.print_table()
        finally:
            stop_all(story.procs)
    return result


class Story:
    def __init__(
        self, chain: LocalChain, args: argparse.Namespace, plan: Plan, run_dir: Path
    ) -> None:
        self.chain, self.args, self.plan, self.run_dir = chain, args, plan, run_dir
        # One seat more than the starters, for the late joiner (kept with --no-late-join); as
        # few members per epoch as the story leaves in its last one.
        self.job = JobOptions.from_args(
            args, late_seats=1, min_operators=plan.min_operators(args.epochs)
        )
        acc = chain.accounts
        self.ops = [acc[1 + i] for i in plan.operators]  # by operator index
        self.stakers = [acc[s] for s in STAKERS]
        self.caller = acc[CALLER]
        targets = [self.ops[0], self.ops[min(1, len(self.ops) - 1)]]
        self.roster = Roster(
            operators=[o.address for o in self.ops],
            stakers=[s.address for s in self.stakers],
            treasury=acc[TREASURY].address,
            developer=acc[DEVELOPER].address,
            caller=self.caller.address,
            delegations={
                s.address: (o.address, amount)
                for s, o, amount in zip(self.stakers, targets, DELEGATIONS, strict=True)
            },
        )
        self.procs: list[Proc] = []
        self.usd: Any = None  # TestUSD, with --x402 or --serve
        self.market: Any = None  # paid.Market, with --x402 or --serve
        self.purchase: dict = {}

    def set_up(self) -> None:
        """Deploys the BSM; operators register up front so stakers can delegate (nodes then
        publish their libp2p addresses when they start); submits the job."""
        from dtrain import BSM

        r = self.roster
        self.params = deploy_params(r.treasury, r.developer)
        self.bsm = BSM.deploy(self.chain.url, self.chain.accounts[0].key, self.params)
        print(f"chain {self.chain.url}  contract {self.bsm.address}")
        for o in self.ops:
            self.bsm.with_account(o.key).register_operator(r.self_stake, b"\0" * 32, [], "cpu", 0)
        for s in self.stakers:
            target, amount = r.delegations[s.address]
            self.bsm.with_account(s.key).delegate(target, amount)
        if self.args.x402 or self.args.serve:
            acc = self.chain.accounts
            self.usd = paid.set_up_token(self.chain, self.bsm, acc[0], acc[DEVELOPER], self.caller)
            self.market = paid.Market(
                self.chain.url, self.bsm.address, self.usd, acc[FACILITATOR], self.run_dir
            )
            print(f"TestUSD {self.usd.address} allowed for jobs")
        self.submit_job()

    def submit_job(self) -> None:
        a = self.args
        self.spec, init = tiny_job(self.bsm, self.run_dir, self.job)
        self.n_params = sum(p.numel() for p in init.parameters())
        if a.x402:
            self.spec = dataclasses.replace(self.spec, price_per_operator_epoch=paid.TOKEN_PRICE)
            balance = self.usd.balance_of  # type: ignore[union-attr]
        else:
            balance = self.bsm.w3.eth.get_balance
        self.wallets_before = {x.address: balance(x.address) for x in self.chain.accounts}
        if a.x402:
            gateway = self.chain.accounts[GATEWAY]
            self.job_id, self.purchase = self.market.buy_job(self.spec, gateway, self.caller)
            escrow = f"{self.spec.escrow / 10**6:g} TestUSD"
        else:
            self.job_id = self.bsm.with_account(self.caller.key).create_job(self.spec)
            escrow = f"{self.spec.escrow / ETH:g} ETH"
        print(
            f"job {self.job_id}: {a.method.upper()}, {a.epochs} epochs x {a.steps} steps, "
            f"sync every {a.sync}, {self.n_params:,} parameters, escrow {escrow}"
        )

    def spawn(self, i: int) -> Proc:
        config = NodeConfig(
            self.chain.url, self.bsm.address, self.job_id, self.job.round_deadline, LINGER
        )
        name = node_name(i)
        p = spawn_node(name, self.ops[i], self.run_dir / name, config, self.plan.faults(i))
        self.procs.append(p)
        return p

    def watch(self) -> None:
        """Until the job ends, a node fails or the timeout; starts the late joiner once the
        job runs (it joins at the next epoch boundary)."""
        from dtrain.models import JobStatus

        late = self.plan.late
        t_end = time.monotonic() + self.args.timeout
        seen: tuple = ()
        while time.monotonic() < t_end:
            j = self.bsm.job(self.job_id)
            seen = self.say_progress(j, seen)
            if j.state.status == JobStatus.RUNNING and late is not None:
                p = self.spawn(late)
                print(f"{p.name} starts late: it joins the job at a boundary", flush=True)
                late = None
            if j.state.status.is_ended:
                break
            self.skip_idle_deadline(j.state.epoch)
            crashed = [p for p in self.procs if self.failed(p)]
            if crashed:
                print("node failed:", [(p.name, p.popen.returncode) for p in crashed])
                break
            time.sleep(POLL)

    def say_progress(self, j: Any, seen: tuple) -> tuple:
        """One line whenever the job's status or epoch attempt changes; returns what it saw."""
        now = (j.state.status, j.state.epoch, j.state.attempt)
        if now != seen:
            what = f"job {self.job_id}: {j.state.status.name.lower()}"
            if not j.state.status.is_ended:
                what += (
                    f", {format_epoch(j.state.epoch, self.args.epochs)}, "
                    f"{len(j.members)} members, {len(j.pending_joins)} joining"
                )
            print(what, flush=True)
        return now

    def skip_idle_deadline(self, epoch: int) -> None:
        """A devnet need not wait out a deadline nobody can act before (an offline member's
        commit): the chain's clock moves to it, and the story says so."""
        now = max(self.bsm.latest_block_timestamp(), time.time())
        to = skip_idle_deadline(self.bsm, self.job_id, self.procs)
        if to:
            print(
                f"epoch {epoch}: nothing can happen before the next deadline but the deadline"
                f" itself; the devnet's clock moves {to - now:.0f} s ahead to it"
            )

    def members_by_epoch(self, events: list) -> dict[int, list[str]]:
        """Each epoch's members, read from the chain at the block where its last attempt
        started (a poll while it runs could straddle the boundary's promotion of joiners)."""
        starts = {e.args["epoch"]: e.block for e in events if e.name == "EpochStarted"}
        return {ep: list(self.bsm.job(self.job_id, b).members) for ep, b in starts.items()}

    def block_times(self, events: list) -> dict[int, int]:
        """Timestamps of the blocks where an epoch started or was finalized."""
        blocks = {e.block for e in events if e.name in ("EpochStarted", "EpochFinalized")}
        return {b: self.bsm.w3.eth.get_block(b)["timestamp"] for b in blocks}

    def failed(self, p: Proc) -> bool:
        """Exited with an error, unless the plan has it go offline."""
        offline = self.plan.offline
        if offline is not None and p.address == self.ops[offline].address:
            return False
        return p.popen.poll() not in (None, 0)

    def serve(self, model_dir: Path, checks: Checks) -> dict:
        """The first operator serves the caller's verified copy of the model, paid per call."""
        return self.market.serve_and_chat(self.job_id, model_dir, self.ops[0], self.caller, checks)

    def observe(self) -> Observed:
        bsm, r = self.bsm, self.roster
        job = bsm.job(self.job_id)
        events = bsm.events(job_id=self.job_id)
        credited = {
            a: bsm.credit_of(a) + sum(bsm.pending_rewards(o, a) for o in r.operators)
            for a in r.names()
        }
        token = bsm.job_token(self.job_id)
        token_credited = (
            {
                a: bsm.token_credit_of(token, a)
                + sum(bsm.pending_token_rewards(token, o, a) for o in r.operators)
                for a in r.names()
            }
            if token
            else {}
        )
        bytes_out = [
            m["bytes_out"]
            for p in self.procs
            for m in read_metrics(p.data_dir)
            if m.get("kind") == "round"
        ]
        return Observed(
            plan=self.plan,
            roster=r,
            job_id=self.job_id,
            status=job.state.status.name.lower(),
            ended=job.state.status.is_ended,
            final_checkpoint=job.state.checkpoint,
            price=self.spec.price_per_operator_epoch,
            escrow=self.spec.escrow,
            total_epochs=self.spec.total_epochs,
            events=events,
            members_by_epoch=self.members_by_epoch(events),
            credited=credited,
            wallets_before=self.wallets_before,
            bytes_out=bytes_out,
            n_params=self.n_params,
            rules=Rules.from_params(self.params),
            block_time=self.block_times(events),
            token=token,
            token_credited=token_credited,
        )

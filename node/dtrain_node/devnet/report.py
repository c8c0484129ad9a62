"""The demo's verdict: its checks, the per-epoch and per-account table and demo-result.json,
built from what the story observed (`Observed`, plain data: no chain, no processes)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import money
from .money import ETH, Balance, EpochRecord, Roster, Rules
from .plan import POISON_EPOCH, Plan

if TYPE_CHECKING:
    from dtrain.models import Event

TOKEN_UNIT = 10**6  # TestUSD has 6 decimals
MIN_RATIO_VS_BF16 = 50  # DeMo's upload per sync must be at least this far below dense bf16


@dataclass
class Checks:
    items: list[tuple[str, bool, str]] = field(default_factory=list)

    def add(self, name: str, ok: Any, detail: str = "") -> None:
        self.items.append((name, bool(ok), detail))

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.items)

    def failed(self) -> list[str]:
        return [n for n, ok, _ in self.items if not ok]

    def to_json(self) -> list[dict[str, Any]]:
        return [{"check": n, "ok": ok, "detail": d} for n, ok, d in self.items]

    def print(self) -> None:
        for n, ok, d in self.items:
            print(f"  [{'ok' if ok else 'FAIL'}] {n}" + (f"  ({d})" if d and not ok else ""))


@dataclass(frozen=True)
class Observed:
    """What the story saw: the job on-chain, its events, every named account's credit
    (claimable plus pending pool rewards), the nodes' upload bytes per sync round, the deployed
    money rules and the timestamps of the blocks where epochs started and were finalized."""

    plan: Plan
    roster: Roster
    job_id: int
    status: str  # the job's status, lower case
    ended: bool
    final_checkpoint: bytes
    price: int  # per operator and epoch
    escrow: int
    total_epochs: int
    events: Sequence[Event]
    members_by_epoch: dict[int, list[str]]
    credited: dict[str, int]
    wallets_before: dict[str, int]
    bytes_out: list[int]  # per node and sync round
    n_params: int
    rules: Rules = field(default_factory=Rules)
    block_time: dict[int, int] = field(default_factory=dict)  # block: timestamp
    # A job escrowed in a token: `credited` is then the ether part (slashes), this the token's
    token: str | None = None
    token_credited: dict[str, int] = field(default_factory=dict)


@dataclass
class DemoResult:
    job_id: int
    status: str
    final_checkpoint: str
    epochs: list[EpochRecord]
    balances: list[Balance]
    communication: dict[str, Any]
    checks: Checks
    names: dict[str, str] = field(default_factory=dict)  # address: account name
    final_model: dict[str, Any] = field(default_factory=dict)  # the caller's copy, evaluated
    token: str | None = None  # the job's payment token (None: ether)
    token_balances: list[Balance] = field(default_factory=list)  # in the token, 6 decimals
    purchase: dict[str, Any] = field(default_factory=dict)  # the job bought over x402
    inference: dict[str, Any] = field(default_factory=dict)  # a paid chat completion

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "status": self.status,
            "final_checkpoint": self.final_checkpoint,
            "epochs": [asdict(ep) for ep in self.epochs],
            "balances": [asdict(b) for b in self.balances],
            **(
                {"token": self.token, "token_balances": [asdict(b) for b in self.token_balances]}
                if self.token
                else {}
            ),
            **({"purchase": self.purchase} if self.purchase else {}),
            **({"inference": self.inference} if self.inference else {}),
            "communication": self.communication,
            **self.final_model,
            "checks": self.checks.to_json(),
        }

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=2, default=str) + "\n")

    def print_table(self) -> None:
        print_table(self.epochs, self.balances, self.names, self.communication)
        if self.token_balances:
            print(f"\nin TestUSD (the job's escrow and its split; token {self.token})")
            print_balances(self.token_balances, TOKEN_UNIT, "TestUSD")
        if self.inference:
            i, n = self.inference, self.names
            print(
                f"\ninference  {n.get(i['payer'], i['payer'])} paid "
                f"{n.get(i['payee'], i['payee'])} {i['price'] / TOKEN_UNIT:g} TestUSD over x402 "
                f"for one chat completion (settled in {i['settlement_tx'][:12]}..)"
            )


def communication(bytes_out: list[int], n_params: int, members: int) -> dict[str, Any]:
    """The median upload per node and sync against a dense bf16 ring all-reduce."""
    n = members or 1
    dense_bf16 = 2 * (n - 1) / n * n_params * 2
    per_sync = sorted(bytes_out)[len(bytes_out) // 2] if bytes_out else 0
    return {
        "upload_bytes_per_sync": per_sync,
        "dense_bf16_allreduce_bytes": int(dense_bf16),
        "ratio_vs_bf16": round(dense_bf16 / per_sync, 1) if per_sync else None,
        "params": n_params,
    }


def build(obs: Observed, checks: Checks) -> DemoResult:
    """The result and its checks, in the order they are printed."""
    checks.add("job completed", obs.status == "completed", obs.status)
    epochs = money.epoch_records(
        obs.events,
        obs.total_epochs,
        obs.members_by_epoch,
        obs.block_time,
        obs.rules.reward_period,
    )
    refund = obs.escrow if obs.ended else 0
    r = obs.roster
    token_balances: list[Balance] = []
    if obs.token is None:
        expected = money.expected_credits(epochs, r, obs.price, refund, obs.rules)
        balances = money.balances(r, expected, obs.credited, obs.wallets_before)
    else:  # the escrow's part in the token, slashed stake's in ether
        pay = money.expected_credits(
            epochs, r, obs.price, refund, obs.rules, part="pay", token=True
        )
        slash = money.expected_credits(epochs, r, obs.price, refund, obs.rules, part="slash")
        token_balances = money.balances(r, pay, obs.token_credited, obs.wallets_before)
        balances = money.balances(r, slash, obs.credited)
    checks.add(
        "every account's credit matches 40/20/20/20 and the slashes",
        all(b.ok for b in (*balances, *token_balances)),
    )
    story_checks(obs, epochs, checks)
    members = max((len(ep.members) for ep in epochs), default=0)
    comm = communication(obs.bytes_out, obs.n_params, members)
    per_sync = comm["upload_bytes_per_sync"]
    checks.add(
        "DeMo upload far below dense bf16",
        per_sync and comm["dense_bf16_allreduce_bytes"] / per_sync > MIN_RATIO_VS_BF16,
        json.dumps(comm),
    )
    return DemoResult(
        job_id=obs.job_id,
        status=obs.status,
        final_checkpoint="0x" + obs.final_checkpoint.hex(),
        epochs=epochs,
        balances=balances,
        communication=comm,
        checks=checks,
        names=obs.roster.names(),
        token=obs.token,
        token_balances=token_balances,
    )


def story_checks(obs: Observed, epochs: list[EpochRecord], checks: Checks) -> None:
    """Did the story happen as planned: payments, the planned slashes, the late joiner."""
    paid_total = sum(len(ep.paid) for ep in epochs)
    slashed_reasons = {s.reason for ep in epochs for s in ep.slashed}
    checks.add("operators were paid", paid_total > 0, str(paid_total))
    plan = obs.plan
    if plan.fabricator is not None:
        checks.add("fabricated checkpoint slashed", "fabricated checkpoint" in slashed_reasons)
    if plan.offline is not None:
        checks.add("offline operator slashed", "offline mid-epoch" in slashed_reasons)
    if plan.poisoner is not None:
        poison_checks(obs.roster.operators[plan.poisoner], epochs, checks)
    if plan.late is not None:
        late = obs.roster.operators[plan.late]
        joined = any(late in ep.members for ep in epochs[1:])
        first = epochs[0].members if epochs else []
        checks.add("late operator joined at a boundary", joined and late not in first)
    checks.add(
        "final checkpoint on-chain", any(obs.final_checkpoint), "0x" + obs.final_checkpoint.hex()
    )


def poison_checks(poisoner: str, epochs: list[EpochRecord], checks: Checks) -> None:
    """The member that poisoned its packets in POISON_EPOCH was slashed for sync failure there,
    and every other member of that epoch was paid."""
    if len(epochs) <= POISON_EPOCH:
        checks.add("poisoning operator slashed for sync failure", False, "no such epoch")
        return
    ep = epochs[POISON_EPOCH]
    slashes = [(s.address, s.reason) for s in ep.slashed]
    checks.add(
        "poisoning operator slashed for sync failure", (poisoner, "failed to sync") in slashes
    )
    honest = sorted(m for m in ep.members if m != poisoner)
    checks.add(
        "every honest member paid in the poisoned epoch",
        honest and sorted(ep.paid) == honest,
        f"members {ep.members}, paid {ep.paid}",
    )


def print_table(
    epochs: list[EpochRecord],
    balances: list[Balance],
    names: dict[str, str],
    comm: dict[str, Any],
) -> None:
    def n(a: str) -> str:
        return names.get(a, a[:10])

    print("\nepoch  members                 quorum hash        paid                  slashed")
    for ep in epochs:
        slashed = (
            ", ".join(f"{n(s.address)} ({s.reason}, {s.amount / ETH:g} ETH)" for s in ep.slashed)
            or "-"
        )
        quorum = ep.quorum_hash or ("UNWORKABLE" if ep.compensated else "no quorum")
        paid = ep.paid or ep.compensated  # an aborted epoch: its voters were compensated
        print(
            f"{ep.epoch:>5}  {' '.join(n(m) for m in ep.members):<22}  "
            f"{quorum[:18]:<18} {' '.join(n(m) for m in paid):<21} {slashed}"
        )
    print_balances(balances, ETH, "ETH")
    print(
        f"\nupload per sync {comm['upload_bytes_per_sync']:,} B vs dense bf16 all-reduce "
        f"{comm['dense_bf16_allreduce_bytes']:,} B ({comm['ratio_vs_bf16']}x less)"
    )


def print_balances(balances: list[Balance], unit: int, name: str) -> None:
    print(f"\naccount     expected ({name:<7})  credited          ok")
    for b in balances:
        print(
            f"{b.account:<11} {b.expected / unit:<17.6f} {b.credited / unit:<17.6f} "
            f"{'yes' if b.ok else 'NO'}"
        )

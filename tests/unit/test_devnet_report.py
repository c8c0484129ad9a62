"""The demo's report (checks, table, demo-result.json) from hand-made observations."""

from __future__ import annotations

import dataclasses
import json

from dtrain.models import Event
from dtrain_node.devnet import money
from dtrain_node.devnet.money import ETH, Roster
from dtrain_node.devnet.plan import make_plan
from dtrain_node.devnet.report import Checks, Observed, build

P = ETH // 100
OPS = ["0x01", "0x02", "0x03", "0x04"]  # op4 is the late joiner
ROSTER = Roster(OPS, ["0x0c"], "0x0a", "0x0b", "0x09", delegations={"0x0c": (OPS[0], ETH)})
CKPT = bytes(range(32))


def ev(name: str, epoch: int, **args: object) -> Event:
    return Event(name, {"epoch": epoch, **args}, 0, "0x", 0)


EVENTS = [
    *(ev("OperatorPaid", 0, operator=o) for o in OPS[:3]),
    ev("EpochFinalized", 0, checkpoint=b"\x01" * 32),
    ev("Slashed", 1, operator=OPS[1], reason=0, amount=ETH // 10, reporter=OPS[0]),
    *(ev("OperatorPaid", 1, operator=o) for o in (OPS[0], OPS[2], OPS[3])),
    ev("EpochFinalized", 1, checkpoint=CKPT),
]


def observed(**changes: object) -> Observed:
    plan = make_plan(3, 3, faults=True, late_join=True, epochs=2)  # no offline, no poisoner
    obs = Observed(
        plan=plan,
        roster=ROSTER,
        job_id=7,
        status="completed",
        ended=True,
        final_checkpoint=CKPT,
        price=P,
        escrow=P * 4 * 2,
        total_epochs=2,
        events=EVENTS,
        members_by_epoch={0: OPS[:3], 1: OPS},
        credited={},
        wallets_before={a: 10_000 * ETH for a in ROSTER.names()},
        bytes_out=[900, 1000, 1100],
        n_params=400_000,
    )
    obs = dataclasses.replace(obs, **changes)
    if not obs.credited:  # what the contract would credit: the recomputation, to the wei
        eps = money.epoch_records(obs.events, obs.total_epochs, {})
        credited = money.expected_credits(eps, obs.roster, obs.price, obs.escrow)
        obs = dataclasses.replace(obs, credited=credited)
    return obs


def test_honest_books_pass_every_check(tmp_path, capsys) -> None:
    checks = Checks()
    result = build(observed(), checks)
    assert checks.ok, checks.items
    assert [n for n, _, _ in checks.items] == [
        "job completed",
        "every account's credit matches 40/20/20/20 and the slashes",
        "operators were paid",
        "fabricated checkpoint slashed",
        "late operator joined at a boundary",
        "final checkpoint on-chain",
        "DeMo upload far below dense bf16",
    ]
    result.final_model = {"heldout_loss_before": 5.0, "heldout_loss_after": 4.0}
    result.write(tmp_path / "demo-result.json")
    data = json.loads((tmp_path / "demo-result.json").read_text())
    assert list(data) == [
        "job_id",
        "status",
        "final_checkpoint",
        "epochs",
        "balances",
        "communication",
        "heldout_loss_before",
        "heldout_loss_after",
        "checks",
    ]
    assert data["final_checkpoint"] == "0x" + CKPT.hex()
    assert [len(e["members"]) for e in data["epochs"]] == [3, 4]
    assert [s["reason"] for s in data["epochs"][1]["slashed"]] == ["fabricated checkpoint"]
    assert data["epochs"][1]["slashed"][0]["reporter"] == OPS[0]
    assert all(b["ok"] for b in data["balances"]) and len(data["balances"]) == 8
    assert data["communication"]["upload_bytes_per_sync"] == 1000
    assert data["communication"]["dense_bf16_allreduce_bytes"] == 1_200_000
    assert all(c["ok"] for c in data["checks"])
    result.print_table()
    out = capsys.readouterr().out
    assert "op2 (fabricated checkpoint, 0.1 ETH)" in out
    assert "op1 op3 op4" in out and "staker1" in out and " NO" not in out


def test_a_credit_off_by_one_wei_fails_the_money_check(capsys) -> None:
    good = observed()
    credited = {**good.credited, ROSTER.caller: good.credited[ROSTER.caller] - 1}
    checks = Checks()
    result = build(dataclasses.replace(good, credited=credited), checks)
    assert checks.failed() == ["every account's credit matches 40/20/20/20 and the slashes"]
    assert [b.account for b in result.balances if not b.ok] == ["caller"]
    result.print_table()
    assert "caller" in capsys.readouterr().out.split(" NO")[0].splitlines()[-1]


def test_late_joiner_in_the_first_epoch_fails() -> None:
    checks = Checks()
    build(observed(members_by_epoch={0: OPS, 1: OPS}), checks)
    assert checks.failed() == ["late operator joined at a boundary"]


def test_no_late_joiner_planned_no_late_check() -> None:
    """--operators 4 --no-late-join: op4 starts with the job; nobody is checked as late."""
    plan = make_plan(4, 3, faults=True, late_join=False, epochs=3)  # no poisoner
    checks = Checks()
    build(observed(plan=plan, members_by_epoch={0: OPS, 1: OPS}), checks)
    names = [n for n, _, _ in checks.items]
    assert "late operator joined at a boundary" not in names
    assert checks.failed() == ["offline operator slashed"]  # op3 was planned offline


def test_failed_job_and_missing_slash_and_dense_upload_are_flagged() -> None:
    checks = Checks()
    events = [e for e in EVENTS if e.name != "Slashed"]
    build(observed(status="failed", events=events, bytes_out=[100_000]), checks)
    assert checks.failed() == [
        "job completed",
        "fabricated checkpoint slashed",
        "DeMo upload far below dense bf16",
    ]


def poison_story(paid_in_3: list[str], slashed_in_3: list[Event]) -> Observed:
    """4 operators from the start, 4 epochs: op4 poisons in epoch 3 (no other fault)."""
    plan = make_plan(4, 3, faults=True, late_join=False, epochs=4)
    plan = dataclasses.replace(plan, fabricator=None, offline=None)
    events = [
        *(ev("OperatorPaid", e, operator=o) for e in range(3) for o in OPS),
        *(ev("EpochFinalized", e, checkpoint=CKPT) for e in range(4)),
        *(ev("OperatorPaid", 3, operator=o) for o in paid_in_3),
        *slashed_in_3,
    ]
    members = dict.fromkeys(range(4), OPS)
    return observed(plan=plan, events=events, total_epochs=4, members_by_epoch=members)


def test_poisoner_slashed_for_sync_failure_and_honest_members_paid(capsys) -> None:
    slash = ev("Slashed", 3, operator=OPS[3], reason=2, amount=ETH // 50, reporter=OPS[0])
    checks = Checks()
    result = build(poison_story(OPS[:3], [slash]), checks)
    assert checks.ok, checks.failed()
    names = [n for n, _, _ in checks.items]
    assert "poisoning operator slashed for sync failure" in names
    assert "every honest member paid in the poisoned epoch" in names
    treasury = next(b for b in result.balances if b.account == "treasury")
    assert treasury.expected == 15 * P // 5 + ETH // 50  # its 20% of 15 paid epochs + the slash
    result.print_table()
    assert "op4 (failed to sync, 0.02 ETH)" in capsys.readouterr().out


def test_poisoner_not_slashed_or_honest_member_unpaid_is_flagged() -> None:
    checks = Checks()
    build(poison_story(OPS, []), checks)  # the poisoner got paid
    assert checks.failed() == [
        "poisoning operator slashed for sync failure",
        "every honest member paid in the poisoned epoch",
    ]
    wrong = ev("Slashed", 3, operator=OPS[3], reason=0, amount=ETH // 10, reporter=OPS[0])
    checks = Checks()
    build(poison_story(OPS[:2], [wrong]), checks)  # wrong reason, op3 unpaid
    assert checks.failed() == [
        "poisoning operator slashed for sync failure",
        "every honest member paid in the poisoned epoch",
    ]

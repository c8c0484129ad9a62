"""The node's settlement line: when this node was slashed it says how much, why and in which
epoch (not only `epoch 0 settled: Slashed, EpochFinalized`)."""

from __future__ import annotations

from types import SimpleNamespace

from dtrain.models import SlashReason
from dtrain_node.operator.settlement import settled_line, slashes

ME = "0x" + "11" * 20
OTHER = "0x" + "22" * 20


def _event(name: str, **args: object) -> SimpleNamespace:
    return SimpleNamespace(name=name, args=args)


def test_a_slash_of_this_node_says_amount_reason_and_epoch() -> None:
    events = [
        _event("Slashed", operator=ME.upper().replace("0X", "0x"), jobId=3, epoch=0,
               reason=int(SlashReason.WITHHELD_REVEAL), amount=5 * 10**16, reporter=OTHER),
        _event("OperatorPaid", jobId=3, epoch=0, operator=OTHER, price=10**16),
        _event("EpochFinalized", jobId=3, epoch=0),
    ]  # fmt: skip
    line = settled_line(0, ["Slashed", "EpochFinalized"], slashes(events), ME)
    assert line.startswith("epoch 0 settled: Slashed, EpochFinalized; ")
    assert "this node was slashed 0.05 ETH in epoch 0" in line
    assert "WITHHELD_REVEAL" in line and "committed a vote and never revealed it" in line
    assert "\n" not in line


def test_every_reason_reads_as_words() -> None:
    for reason in SlashReason:
        s = {"operator": ME, "epoch": 2, "reason": int(reason), "amount": 10**18}
        line = settled_line(2, ["Slashed", "EpochFinalized"], [s], ME)
        assert f"this node was slashed 1 ETH in epoch 2 for {reason.name} (" in line, line


def test_another_members_slash_is_not_ours() -> None:
    s = {"operator": OTHER, "epoch": 0, "reason": int(SlashReason.DROPOUT), "amount": 10**17}
    line = settled_line(0, ["Slashed", "EpochFinalized"], [s], ME)
    assert "this node" not in line
    assert "1 other member slashed" in line and "0.1 ETH" in line and "DROPOUT" in line


def test_a_settlement_without_slashes_reads_as_before() -> None:
    assert settled_line(0, ["EpochFinalized"], [], ME) == "epoch 0 settled: EpochFinalized"
    assert settled_line(1, [], [], ME) == "epoch 1 settled: -"


def test_the_node_logs_the_slash_in_its_settlement_line(tmp_path, caplog) -> None:
    """The node's `finalized` record carries the slashes read from the receipt, and the line it
    logs for it names this node's amount, reason and epoch."""
    import json
    import logging

    from dtrain_node.operator.node import Node
    from dtrain_node.operator.progress import Status

    node = SimpleNamespace(me=ME, metrics_path=tmp_path / "metrics.jsonl", status=Status())
    slashed = [{"operator": ME, "epoch": 0, "reason": int(SlashReason.DROPOUT), "amount": 10**17}]
    with caplog.at_level(logging.INFO, logger="dtrain.node"):
        Node._metric(node, "finalized", job=3, epoch=0, events=["Slashed", "EpochFinalized"],
                     slashed=slashed)  # fmt: skip
    assert "this node was slashed 0.1 ETH in epoch 0 for DROPOUT (" in caplog.text, caplog.text
    rec = json.loads(node.metrics_path.read_text())
    assert rec["slashed"] == slashed and rec["events"] == ["Slashed", "EpochFinalized"]

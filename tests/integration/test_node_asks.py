"""`node run --min-price` is the operator's ask in ether on chain, and `--auto` weighs a job's
price against the ask in the job's own unit: a real anvil, `Node` in-process on the loopback
transport (tests/harness/loopback.py)."""

from __future__ import annotations

import json
from pathlib import Path

from harness.chain import ETH, peer_key
from harness.loopback import LoopbackHub
from test_operator import CALLER, DEVELOPER, submit_tiny_job

from dtrain.devtoken import TestUSD
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.operator.progress import Status, describe
from dtrain_node.train import corpus

OPERATOR = 1


def _node(chain, bsm, accounts, data_dir: Path, min_price: int | None) -> Node:
    cfg = NodeConfig(
        key=accounts[OPERATOR].key,
        rpc_url=chain.url,
        contract=bsm.address,
        data_dir=data_dir,
        auto=True,
        stake=ETH,
        min_price=min_price,
        poll_s=0.1,
    )
    return Node(cfg, transport_factory=LoopbackHub().factory)


def _ask_updates(data_dir: Path) -> list[dict]:
    lines = (data_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "ask_updated"]


def test_min_price_sets_the_ether_ask_and_auto_weighs_token_jobs(
    chain, bsm, accounts, tmp_path
) -> None:
    path = tmp_path / "corpus.txt"
    dataset = (path, corpus.build_stdlib_corpus(path, max_bytes=20_000))
    op = bsm.with_account(accounts[OPERATOR].key)
    me = op.sender
    op.register_operator(ETH, peer_key(OPERATOR), ["/ip4/127.0.0.1/tcp/4001"], "cpu:2", ETH // 100)
    usd = TestUSD.deploy(chain.url, accounts[0].key)
    bsm.with_account(accounts[DEVELOPER].key).set_payment_token(usd.address)
    caller = bsm.with_account(accounts[CALLER].key)
    usd.mint(caller.sender, 10**6)
    token_job = submit_tiny_job(caller, dataset, operators=2, token=usd.address)  # 0.01 TUSD

    # Without --min-price the chain's ask stands: 0.01 ETH, so no ask in TUSD, no TUSD job.
    keep = _node(chain, bsm, accounts, tmp_path / "keep", None)
    keep._sync_ask()
    assert bsm.ask_in(me) == ETH // 100
    assert not keep._acceptable(bsm.job(token_job), keep._free_stake())

    # --min-price 0 lowers the on-chain ask, says so, and the TUSD job pays it.
    free = _node(chain, bsm, accounts, tmp_path / "free", 0)
    free._sync_ask()
    assert bsm.ask_in(me) == 0
    (said,) = _ask_updates(tmp_path / "free")
    assert (said["was"], said["ask"]) == (ETH // 100, 0)
    assert describe("ask_updated", said, Status()).startswith(
        "ask in ether updated on chain: 0.01 ETH -> 0 ETH"
    )
    assert free._acceptable(bsm.job(token_job), free._free_stake())

    # An ask in TUSD above the price: --auto passes the job by, whatever the ether ask.
    op.update_ask(10**4 + 1, usd.address)
    assert not free._acceptable(bsm.job(token_job), free._free_stake())
    op.update_ask(10**4, usd.address)
    keep._sync_ask()
    assert keep._acceptable(bsm.job(token_job), keep._free_stake())

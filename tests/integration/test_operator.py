"""Operator nodes (`Node`, in threads) against the real anvil chain, through the in-process
loopback transport (tests/harness/loopback.py): the runner's fast tier, no libp2p."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from harness.chain import ETH
from harness.loopback import LoopbackHub

from dtrain import UNWORKABLE, JobSpec, Method, Recipe
from dtrain.cli import main as cli_main
from dtrain.client import BSM
from dtrain.devtoken import TestUSD
from dtrain.models import SlashReason
from dtrain.units import format_eth
from dtrain_node.errors import FinalCheckpointUnavailable
from dtrain_node.operator.faults import Faults
from dtrain_node.operator.fetch import fetch_final
from dtrain_node.operator.node import Node, NodeConfig
from dtrain_node.operator.settlement import describe_settled
from dtrain_node.train import corpus, start

CALLER = 4
DEVELOPER = 11  # the deployed BSM's blueprint developer (conftest)
OPERATORS = (1, 2, 3)
STOP_GRACE = 60  # seconds a node that overran its test gets to see stop_now and return


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    return path, corpus.build_stdlib_corpus(path, max_bytes=60_000)


def submit_tiny_job(
    bsm: BSM,
    dataset: tuple[Path, bytes],
    operators: int,
    steps: int = 4,
    epoch_s: int = 600,
    seat_bond: int | None = None,
    epochs: int = 1,
    model_hash: bytes | None = None,
    recipe: tuple[bytes, str] = (b"\0" * 32, ""),
    token: str | None = None,
    sync_interval: int = 2,
) -> int:
    """An `epochs`-epoch CPT job of the built-in tiny model: sync rounds of 2 steps (or
    `sync_interval`), the least
    seat bond unless `seat_bond` is given, the recipe pin (hash, URI) `recipe` (none: zero);
    priced at 0.01 ETH, or 0.01 of a 6-decimal `token` (escrowed in it)."""
    path, digest = dataset
    spec = JobSpec(
        price_per_operator_epoch=10**4 if token else ETH // 100,
        total_epochs=epochs,
        steps_per_epoch=steps,
        sync_interval=sync_interval,
        min_operators=operators,
        max_operators=operators,
        method=Method.CPT,
        model_hash=model_hash or start.model_hash("builtin:tiny"),
        model_uri="builtin:tiny",
        dataset_hash=digest,
        dataset_uri=str(path),
        epoch_duration=epoch_s,
        seat_bond=bsm.params().min_seat_bond if seat_bond is None else seat_bond,
        recipe_hash=recipe[0],
        recipe_uri=recipe[1],
    )
    return bsm.create_job_with_token(spec, token) if token else bsm.create_job(spec)


class Running:
    """A `Node` running in a thread (never the main thread: no signal handlers)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.result: Any = None
        self.thread = threading.Thread(target=self._main, daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            self.result = self.node.run()
        except BaseException as exc:
            self.result = exc

    def wait(self, timeout: float = 120) -> dict[str, Any]:
        self.thread.join(timeout)
        overran = self.thread.is_alive()
        self.node.stop_now.set()
        if overran:  # it stops here, not while a later test uses the same accounts
            self.thread.join(STOP_GRACE)
        assert not overran, f"node {self.node.me} still running after {timeout} s"
        assert not isinstance(self.result, BaseException), self.result
        return self.result


class Operators:
    """Operator nodes of one job sharing one loopback hub."""

    def __init__(self, chain: Any, bsm: BSM, accounts: list, job_id: int, tmp_path: Path) -> None:
        self.chain, self.bsm, self.accounts = chain, bsm, accounts
        self.job_id, self.tmp_path = job_id, tmp_path
        self.hub = LoopbackHub()

    def node(self, i: int, faults: Faults | None = None, factory: Any = None) -> Node:
        cfg = NodeConfig(
            key=self.accounts[i].key,
            rpc_url=self.chain.url,
            contract=self.bsm.address,
            data_dir=self.data_dir(i),
            job_id=self.job_id,
            batch_size=4,
            round_deadline_s=20.0,
            poll_s=0.1,
            faults=faults or Faults(),
        )
        return Node(cfg, transport_factory=factory or self.hub.factory)

    def data_dir(self, i: int) -> Path:
        return self.tmp_path / f"op{i}"

    def run(self, n: int, faults: dict[int, Faults] | None = None) -> list[dict[str, Any]]:
        """The first `n` operators run until the job ends; returns their results."""
        running = [Running(self.node(i, (faults or {}).get(i))) for i in OPERATORS[:n]]
        return [r.wait() for r in running]


def metrics(data_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (data_dir / "metrics.jsonl").read_text().splitlines()]


def events(bsm: BSM, job_id: int, name: str) -> list[Any]:
    return [e for e in bsm.events(job_id=job_id) if e.name == name]


@pytest.mark.timeout(180)
def test_two_nodes_train_finalize_and_get_paid(
    chain, bsm, accounts, dataset, tmp_path, capsys
) -> None:
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=2)
    results = Operators(chain, bsm, accounts, job_id, tmp_path).run(2)
    ops = {accounts[i].address for i in OPERATORS[:2]}
    job = bsm.job(job_id)
    assert job.state.status.name == "COMPLETED"
    assert [r["status"] for r in results] == ["completed", "completed"]
    assert {e.args["operator"] for e in events(bsm, job_id, "CheckpointCommitted")} == ops
    revealed = events(bsm, job_id, "CheckpointRevealed")
    assert {e.args["operator"] for e in revealed} == ops
    hashes = {bytes(e.args["checkpoint"]) for e in revealed}
    assert hashes == {job.state.checkpoint}  # both revealed the same checkpoint
    [fin] = events(bsm, job_id, "EpochFinalized")
    assert fin.args["epoch"] == 0 and fin.args["paidMembers"] == 2
    assert {e.args["operator"] for e in events(bsm, job_id, "OperatorPaid")} == ops
    assert not events(bsm, job_id, "Slashed")
    clips = []
    for i in OPERATORS[:2]:  # every round applied both packets
        rounds = [m for m in metrics(tmp_path / f"op{i}") if m["kind"] == "round"]
        assert [(m["round"], m["applied"], m["missing"]) for m in rounds] == [(0, 2, 0), (1, 2, 0)]
        clips.append([m["clipped"] for m in rounds])
    # the bound scaled the louder member down (two members: to the quieter one's norm), the
    # same way in both processes, and both still revealed one checkpoint (checked above)
    assert clips[0] == clips[1] and any(clips[0]), clips
    for r in results:  # both hold and export the final checkpoint
        out = Path(r["export"])
        assert (out / "CHECKPOINT_SHA256").read_text().strip() == job.state.checkpoint.hex()
    # Both stopped (no linger; their loopback addresses serve nothing): `dtrain job fetch`
    # says so in one line, through the one typed error.
    with pytest.raises(FinalCheckpointUnavailable, match=f"job {job_id}: nobody serves"):
        fetch_final(bsm, job_id, tmp_path / "model", tmp_path / "fetch", timeout=10)
    argv = ["--rpc-url", chain.url, "--contract", bsm.address, "job", "fetch", str(job_id)]
    code = cli_main([*argv, "--out", str(tmp_path / "model"), "--timeout", "10"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and err[0].startswith(f"error: job {job_id}: nobody serves")
    for epoch, said in [("0", "nobody serves its checkpoint of epoch 0 0x"),
                        ("1", "has epochs 0..0, not 1")]:  # fmt: skip
        code = cli_main([*argv, "--out", str(tmp_path / "e"), "--epoch", epoch, "--timeout", "10"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1 and len(err) == 1 and err[0].startswith(f"error: job {job_id}"), err
        assert said in err[0], err


@pytest.mark.timeout(180)
def test_nodes_paid_in_a_token_withdraw_their_token_earnings(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    """A job escrowed in TestUSD: each node's pay and its pool's cut (it is alone in its pool)
    are TestUSD, which the node claims and withdraws when the job ends."""
    usd = TestUSD.deploy(chain.url, accounts[0].key)
    usd.mint(accounts[CALLER].address, 10**6)
    bsm.with_account(accounts[DEVELOPER].key).set_payment_token(usd.address)
    caller = bsm.with_account(accounts[CALLER].key)
    job_id = submit_tiny_job(caller, dataset, operators=2, token=usd.address)
    results = Operators(chain, bsm, accounts, job_id, tmp_path).run(2)
    assert [r["status"] for r in results] == ["completed", "completed"]
    for i in OPERATORS[:2]:
        a = accounts[i].address
        assert usd.balance_of(a) == 10**4 * 60 // 100  # 40% as operator, its pool's 20%
        assert bsm.token_credit_of(usd.address, a) == 0 and bsm.credit_of(a) == 0
        withdrew = [m for m in metrics(tmp_path / f"op{i}") if m["kind"] == "withdrew"]
        assert withdrew == [{**withdrew[0], "amount": 6_000, "token": usd.address}]
        assert withdrew[0]["text"] == "0.006 TUSD"


@pytest.mark.timeout(180)
def test_fabricating_node_is_slashed(chain, bsm, accounts, dataset, tmp_path) -> None:
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=3)
    liar = accounts[OPERATORS[2]].address
    fabricate = Faults.parse(["fabricate"])
    Operators(chain, bsm, accounts, job_id, tmp_path).run(3, {OPERATORS[2]: fabricate})
    assert bsm.job(job_id).state.status.name == "COMPLETED"
    slashed = events(bsm, job_id, "Slashed")
    assert [e.args["operator"] for e in slashed] == [liar]
    paid = {e.args["operator"] for e in events(bsm, job_id, "OperatorPaid")}
    assert paid == {accounts[i].address for i in OPERATORS[:2]}
    # Every member logs the settlement with the slash, whoever sent the finalize; the liar's
    # line says how much, why and in which epoch.
    amount = slashed[0].args["amount"]
    for i in OPERATORS:
        [fin] = [m for m in metrics(tmp_path / f"op{i}") if m["kind"] == "finalized"]
        assert [(s["operator"], s["amount"]) for s in fin["slashed"]] == [(liar, amount)], fin
    [own] = [m for m in metrics(tmp_path / f"op{OPERATORS[2]}") if m["kind"] == "finalized"]
    line = describe_settled(own, liar)
    assert f"this node was slashed {format_eth(amount)} in epoch 0 for FABRICATION (" in line


@pytest.mark.timeout(180)
def test_poisoning_node_is_excluded_every_round_and_slashed_for_sync_failure(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    from safetensors.torch import load_file

    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, operators=3)
    honest, bad = OPERATORS[:2], OPERATORS[2]
    attacker = accounts[bad].address
    poison = Faults.parse(["attack=poison"])
    results = Operators(chain, bsm, accounts, job_id, tmp_path).run(3, {bad: poison})
    job = bsm.job(job_id)
    assert job.state.status.name == "COMPLETED"
    assert [r["status"] for r in results[:2]] == ["completed", "completed"]
    for i in honest:  # the attacker's packet was valid but left out of every round
        m = metrics(tmp_path / f"op{i}")
        rounds = [x for x in m if x["kind"] == "round"]
        assert [(x["applied"], x["missing"]) for x in rounds] == [(2, 0), (2, 0)]
        assert all([e.lower() for e in x["excluded"]] == [attacker.lower()] for x in rounds)
        [trained] = [x for x in m if x["kind"] == "epoch_trained"]
        assert sorted(trained["participation"]) == [0, 2, 2]  # the attacker's 0: see the slash
        [seen] = [x for x in m if x["kind"] == "suspected"]  # reported, by name
        assert seen["rounds"] == 2 and seen["seen"] == {attacker: {"excluded": 2}}
    revealed = {
        e.args["operator"]: bytes(e.args["checkpoint"])
        for e in events(bsm, job_id, "CheckpointRevealed")
    }
    assert {revealed[accounts[i].address] for i in honest} == {job.state.checkpoint}
    for r in results[:2]:  # the honest members' shared state stayed finite
        tensors = load_file(str(Path(r["export"]) / "model.safetensors"))
        assert all(bool(t.float().isfinite().all()) for t in tensors.values())
    [slash] = events(bsm, job_id, "Slashed")
    assert slash.args["operator"] == attacker
    assert slash.args["reason"] == SlashReason.SYNC_FAILURE
    paid = {e.args["operator"] for e in events(bsm, job_id, "OperatorPaid")}
    assert paid == {accounts[i].address for i in honest}


@pytest.mark.timeout(180)
def test_node_stopped_mid_epoch_resumes_from_its_round_state(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, 2, steps=6)
    ops = Operators(chain, bsm, accounts, job_id, tmp_path)
    a, b = OPERATORS[:2]

    def stop_after_round_0(cfg: Any, client: BSM, job: int) -> Any:
        def after(res: Any) -> None:
            if res.round == 0:
                first.stop_now.set()  # as a second Ctrl-C would

        t = ops.hub.factory(cfg, client, job)
        t.after_round = after
        return t

    first = ops.node(a, factory=stop_after_round_0)
    other = Running(ops.node(b))
    assert Running(first).wait() == {"stopped": True}  # saved round 0, stopped before round 1
    again = Running(ops.node(a))  # same data dir: resumes at round 1
    results = [again.wait(), other.wait()]
    assert [r["status"] for r in results] == ["completed", "completed"]
    wanted = ("resumed", "round", "committed", "revealed")
    kinds = [m for m in metrics(ops.data_dir(a)) if m["kind"] in wanted]
    assert [(m["kind"], m.get("round")) for m in kinds] == [
        ("round", 0),
        ("resumed", 1),
        ("round", 1),
        ("round", 2),
        ("committed", None),
        ("revealed", None),
    ]
    [fin] = events(bsm, job_id, "EpochFinalized")
    assert fin.args["paidMembers"] == 2 and not events(bsm, job_id, "Slashed")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("broken", ["missing", "wrong-hash"])
def test_unworkable_job_is_aborted_nobody_slashed_voters_compensated(
    chain, bsm, accounts, dataset, tmp_path, broken
) -> None:
    """The operators joined a job whose dataset then vanished (or whose bytes changed so they
    fail the job's hash): the pre-flight passed, the epoch cannot be done. Before the
    UNWORKABLE vote both would crash and be slashed as dropouts; now both vote UNWORKABLE, the
    job is aborted, nobody loses stake, each voter gets the compensation and the caller the
    rest of the escrow."""
    path, digest = dataset
    mine = tmp_path / "corpus.txt"
    mine.write_bytes(path.read_bytes())
    caller = bsm.with_account(accounts[CALLER].key)
    job_id = submit_tiny_job(caller, (mine, digest), operators=2)
    escrow = bsm.job(job_id).state.escrow
    for i in OPERATORS[:2]:  # joined while the dataset was there
        op = bsm.with_account(accounts[i].key)
        op.register_operator(ETH, bytes([i]) * 32, [], "cpu")
        op.join_job(job_id)
    if broken == "missing":
        mine.unlink()
    else:
        mine.write_bytes(b"another corpus")
    ops = Operators(chain, bsm, accounts, job_id, tmp_path)
    results = ops.run(2)
    assert [r["status"] for r in results] == ["failed", "failed"]
    addrs = {accounts[i].address for i in OPERATORS[:2]}
    revealed = events(bsm, job_id, "CheckpointRevealed")
    assert {e.args["operator"] for e in revealed} == addrs
    assert {bytes(e.args["checkpoint"]) for e in revealed} == {UNWORKABLE}
    [aborted] = events(bsm, job_id, "JobAborted")
    comp = ETH // 100 * bsm.params().unworkable_comp_bps // 10_000
    assert aborted.args["compensated"] == 2 and aborted.args["compensation"] == comp
    assert aborted.args["refund"] == escrow - 2 * comp
    assert bsm.credit_of(accounts[CALLER].address) == escrow - 2 * comp
    assert not events(bsm, job_id, "Slashed") and not events(bsm, job_id, "OperatorPaid")
    for i in OPERATORS[:2]:
        a = accounts[i].address
        assert bsm.stake_of(a, a) == ETH and bsm.bonded_of(a) == 0  # unslashed, bond released
        m = metrics(ops.data_dir(i))
        [why] = [x for x in m if x["kind"] == "unworkable"]
        assert "DatasetError" in why["reason"]
        assert [x["amount"] for x in m if x["kind"] == "withdrew"] == [comp]


@pytest.mark.timeout(180)
def test_node_stopped_between_commit_and_reveal_reveals_after_restart(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    """The vote (checkpoint, participation, salt) is on disk before the commit: a node killed
    right after committing reveals after its restart, without training or committing again."""
    job_id = submit_tiny_job(bsm.with_account(accounts[CALLER].key), dataset, 2)
    ops = Operators(chain, bsm, accounts, job_id, tmp_path)
    a, b = OPERATORS[:2]
    first = ops.node(a)
    commit = first.commit

    def commit_then_stop(job: Any) -> None:
        commit(job)
        first.stop_now.set()  # as a second Ctrl-C would, before the reveal

    first.commit = commit_then_stop  # type: ignore[method-assign]
    other = Running(ops.node(b))
    assert Running(first).wait() == {"stopped": True}
    results = [Running(ops.node(a)).wait(), other.wait()]
    assert [r["status"] for r in results] == ["completed", "completed"]
    wanted = ("epoch_start", "committed", "stopped", "revealed")
    kinds = [m["kind"] for m in metrics(ops.data_dir(a)) if m["kind"] in wanted]
    assert kinds == ["epoch_start", "committed", "stopped", "revealed"]
    [fin] = events(bsm, job_id, "EpochFinalized")
    assert fin.args["paidMembers"] == 2 and not events(bsm, job_id, "Slashed")


def test_auto_skips_jobs_it_cannot_finish_or_bond(chain, bsm, accounts, dataset, tmp_path) -> None:
    """A caller's job with 3,000 steps in a 60 s epoch would get every member slashed for
    dropping out, and a seat bond above our free self-stake cannot be bonded; --auto joins
    the job it can do instead, though it was created last."""
    caller = bsm.with_account(accounts[CALLER].key)
    short = submit_tiny_job(caller, dataset, operators=2, steps=3000, epoch_s=60)
    costly = submit_tiny_job(caller, dataset, operators=2, seat_bond=ETH + 1)  # we stake 1 ETH
    fine = submit_tiny_job(caller, dataset, operators=2, steps=4, epoch_s=600)
    cfg = NodeConfig(
        key=accounts[1].key,
        rpc_url=chain.url,
        contract=bsm.address,
        data_dir=tmp_path / "auto",
        auto=True,
        stake=ETH,
        step_s=0.5,
        poll_s=0.1,
    )
    node = Node(cfg, transport_factory=LoopbackHub().factory)
    assert short < costly < fine
    assert node._pick_job() == fine


def test_job_n_refuses_a_job_this_machine_cannot_finish_before_bonding_a_seat(
    chain, bsm, accounts, dataset, tmp_path
) -> None:
    """A slow host is not a dropout: `--job N` (not only `--auto`) measures this machine on
    the job before bonding a seat, and refuses an epoch it cannot finish before the commit
    deadline with a one-line reason; nothing is bonded, and a job it can do is joined."""
    caller = bsm.with_account(accounts[CALLER].key)
    short = submit_tiny_job(caller, dataset, operators=2, steps=3000, epoch_s=60)
    fine = submit_tiny_job(caller, dataset, operators=2, steps=4, epoch_s=600)
    for job_id, joins in ((short, False), (fine, True)):
        cfg = NodeConfig(
            key=accounts[1].key,
            rpc_url=chain.url,
            contract=bsm.address,
            data_dir=tmp_path / f"job{job_id}",
            job_id=job_id,
            stake=ETH,
            step_s=0.0,  # the operator claims nothing: the measured time decides
        )
        node = Node(cfg, transport_factory=LoopbackHub().factory)
        node.transport = node._transport_factory(cfg, bsm, job_id)
        node.register()
        why = node.join(job_id)
        if joins:
            assert why is None and bsm.bonded_of(accounts[1].address) > 0
        else:
            assert why is not None and why.startswith("too slow for this job: an epoch of 60 s")
            assert "\n" not in why and bsm.bonded_of(accounts[1].address) == 0


@pytest.mark.parametrize("broken", ["missing", "hash", "model", "recipe"])
def test_preflight_never_joins_a_job_it_cannot_do(
    chain, bsm, accounts, dataset, tmp_path, broken
) -> None:
    """A job whose dataset this node does not have, whose dataset fails its hash, or whose
    start model does not match its modelHash, or whose recipe file fails its recipeHash: the
    node refuses to join (no seat, no bond, no
    slash), says why, and --auto passes it by for a job it can do."""
    path, digest = dataset
    caller = bsm.with_account(accounts[CALLER].key)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text("batch_size = 4\n")  # pinned below with the default recipe's hash
    bad = {
        "missing": lambda: submit_tiny_job(caller, (tmp_path / "nowhere.txt", digest), 2),
        "hash": lambda: submit_tiny_job(caller, (path, hashlib.sha256(b"x").digest()), 2),
        "model": lambda: submit_tiny_job(caller, dataset, 2, model_hash=b"\x01" * 32),
        "recipe": lambda: submit_tiny_job(
            caller, dataset, 2, recipe=(Recipe().hash(), str(recipe))
        ),
    }[broken]()
    good = submit_tiny_job(caller, dataset, operators=2)
    ops = Operators(chain, bsm, accounts, bad, tmp_path)
    node = ops.node(OPERATORS[0])
    result = node.run()
    reason = {
        "missing": "DatasetError",
        "hash": "DatasetError",
        "model": "CheckpointInvalid",
        "recipe": "RecipeInvalid",
    }
    assert result["refused"].startswith(reason[broken]), result
    me = accounts[OPERATORS[0]].address
    assert me not in bsm.job(bad).members + bsm.job(bad).pending_joins
    assert bsm.bonded_of(me) == 0 and not events(bsm, bad, "Slashed")
    assert [m["kind"] for m in metrics(ops.data_dir(OPERATORS[0])) if m["kind"] == "refused"]
    auto = NodeConfig(
        key=accounts[OPERATORS[1]].key,
        rpc_url=chain.url,
        contract=bsm.address,
        data_dir=tmp_path / "auto",
        auto=True,
        stake=ETH,
        poll_s=0.1,
    )
    assert Node(auto, transport_factory=LoopbackHub().factory)._pick_job() == good

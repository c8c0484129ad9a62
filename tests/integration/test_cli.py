"""The `dtrain` CLI end to end against a real anvil: commands, JSON output and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from harness import default_sigint
from harness.chain import ETH, advance, peer_key, spec
from web3 import Web3

from dtrain import errors
from dtrain.cli import main
from dtrain.client import BSM
from dtrain.models import Params, SlashReason
from dtrain.stakes import peer_id
from dtrain.units import format_eth, format_time

DTRAIN = [sys.executable, "-m", "dtrain.cli"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A dataset file for `job submit --dataset-uri` (its sha256 is what the job pins)."""
    path = tmp_path_factory.mktemp("data") / "corpus.txt"
    path.write_text("def f(x):\n    return x + 1\n" * 50)
    return str(path)


def test_help_lists_all_commands(run) -> None:
    code, out, _ = run("--help", raw=True)
    assert code == 0
    for group in ("chain", "deploy", "operator", "stake", "job", "rewards", "token"):
        assert group in out
    expected = {
        "operator": ["register", "stake", "unstake", "info", "join", "leave", "deregister"],
        "stake": ["delegate", "undelegate", "withdraw"],
        "job": ["submit", "status", "watch", "cancel", "list", "finalize"],
        "rewards": ["show", "withdraw"],
        "chain": ["up"],
        "token": ["deploy", "allow", "mint", "balance"],
    }
    for group, commands in expected.items():
        code, out, _ = run(group, "--help", raw=True)
        assert code == 0
        for c in commands:
            assert c in out, (group, c)
    code, out, _ = run("job", "submit", "--help", raw=True)
    assert "Example: dtrain job submit" in out


def test_deploy_prints_address(run, chain, accounts) -> None:
    code, out, err = run(
        "--json",
        "deploy",
        "--min-stake",
        "2ether",
        "--unbonding",
        "1d",
        "--min-epoch",
        "2m",
        "--start-grace",
        "10s",
        "--max-bounty",
        "0.001ether",
        "--reveal-window",
        "90s",
        "--open-timeout",
        "2h",
        "--min-seat-bond",
        "0.25ether",
        "--unworkable-comp-bps",
        "500",
        key=accounts[0].key,
    )
    assert code == 0, err
    address = json.loads(out)["address"]
    w3 = Web3(Web3.HTTPProvider(chain.url))
    assert len(w3.eth.get_code(address)) > 0
    p = BSM.attach(chain.url, address).params()
    assert (p.min_epoch_duration, p.start_grace, p.max_reporter_bounty) == (120, 10, 10**15)
    assert (p.reveal_window, p.open_timeout, p.unworkable_comp_bps) == (90, 7200, 500)
    assert p.min_seat_bond == ETH // 4


def test_deploy_defaults_are_the_sdk_defaults(run, chain, accounts) -> None:
    code, out, err = run("--json", "deploy", key=accounts[0].key)
    assert code == 0, err
    p = BSM.attach(chain.url, json.loads(out)["address"]).params()
    defaults = Params(treasury=accounts[0].address, developer=accounts[0].address)
    assert p == defaults
    assert (p.reveal_window, p.open_timeout, p.min_seat_bond) == (600, 86400, ETH // 10)


def test_deploy_rejects_a_compensation_above_the_operator_share(run, accounts) -> None:
    code, _, err = run("deploy", "--unworkable-comp-bps", "4000", key=accounts[0].key)
    assert code == 1
    assert "unworkable compensation 4000 bps must be below the operator share 4000" in err, err


def test_deploy_rejects_short_unbonding(run, accounts) -> None:
    """Epochs must fit in a quarter of the unbonding period: the constructor says why not."""
    code, _, err = run("deploy", "--unbonding", "100s", "--min-epoch", "60s", key=accounts[0].key)
    assert code != 0
    # 4 x (30 + 60 + 600 + 4 x 600): the challenge window's phases fit in it too
    assert "unbonding period 100s is shorter than 12360s" in err, err


def test_operator_staker_caller_session(run, bsm, accounts, votes, data) -> None:
    op_keys = [accounts[i].key for i in (1, 2, 3)]
    for i, k in enumerate(op_keys):
        code, out, err = run(
            "operator",
            "register",
            "--stake",
            "1.5ether",
            "--peer-key",
            "0x" + peer_key(i).hex(),
            "--addr",
            f"/ip4/127.0.0.1/tcp/{4100 + i}",
            "--hardware",
            "cpu:2",
            key=k,
        )
        assert code == 0, err
        assert "registered with 1.5 ETH stake" in out
    code, out, _ = run("job", "list")
    assert out.strip() == "no jobs"
    code, out, _ = run("--json", "operator", "info", accounts[1].address)
    info = json.loads(out)
    assert info["registered"] is True and info["self_stake"] == 15 * ETH // 10
    code, out, err = run("stake", "delegate", accounts[1].address, "2ether", key=accounts[5].key)
    assert code == 0, err
    code, out, err = run(
        "--json",
        "job",
        "submit",
        "--method",
        "cpt",
        "--epochs",
        "1",
        "--steps",
        "10",
        "--sync",
        "5",
        "--operators",
        "3:3",
        "--price",
        "0.01ether",
        "--seat-bond",
        "0.5ether",
        "--dataset-uri",
        data,
        key=accounts[4].key,
    )
    assert code == 0, err
    job_id = json.loads(out)["job_id"]
    assert json.loads(out)["escrow"] == 3 * ETH // 100
    assert json.loads(out)["seat_bond"] == ETH // 2
    for k in op_keys:
        assert run("operator", "join", str(job_id), key=k)[0] == 0
    code, out, _ = run("operator", "info", accounts[1].address)
    assert "self-stake  1.5 ETH (0.5 ETH bonded to seats)" in out
    code, out, _ = run("--json", "job", "status", str(job_id))
    status = json.loads(out)
    assert status["state"]["status"] == "running" and len(status["members"]) == 3
    assert status["spec"]["seat_bond"] == ETH // 2
    assert (status["committed"], status["revealed"]) == (0, 0)
    assert status["reveal_deadline"] == status["deadline"] + bsm.params().reveal_window > 0
    ops = [bsm.with_account(k) for k in op_keys]
    for op in ops:
        votes.commit(op, job_id, 0, b"\x07" * 32, [2, 2, 2])
    votes.reveal(ops[0], job_id, 0)
    code, out, _ = run("job", "status", str(job_id))
    assert "votes       3 committed, 1 revealed" in out
    assert "epoch       0 (0..0)\n" in out and "members     3/3 (at least 3), 0 joining" in out
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(status["reveal_deadline"]))
    assert f"reveal by   {stamp}" in out and "seat bond   0.5 ETH" in out
    left = status["reveal_deadline"] - time.time()  # the chain may run ahead of the wall clock
    assert ("(in " if left > 0 else " ago)") in out.split("reveal by")[1].splitlines()[0]
    assert str(status["reveal_deadline"]) not in out and str(status["deadline"]) not in out
    code, out, _ = run("job", "list")
    assert out.rstrip("\n") == (
        f"{job_id:>4}  CPT   running    epoch 0 (0..0)  members 3/3  "
        "price 0.01 ETH per operator-epoch"
    )
    for op in ops[1:]:
        votes.reveal(op, job_id, 0)
    code, out, err = run("job", "finalize", str(job_id), key=accounts[6].key)
    assert code == 0, err
    assert "EpochFinalized" in out and "JobCompleted" in out
    assert f"epoch 0 (epochs 0..0) of job {job_id} settled" in out
    code, out, _ = run("job", "list")
    assert f"{job_id:>4}  CPT   completed  epoch 1/1 done  members 0/3  price 0.01 ETH" in out
    code, out, _ = run("--json", "job", "status", str(job_id))
    holders = json.loads(out)["final_holders"]
    assert [h["operator"] for h in holders] == sorted(accounts[i].address for i in (1, 2, 3))
    for h in holders:
        i = [accounts[j].address for j in (1, 2, 3)].index(h["operator"])
        assert h["multiaddrs"] == [f"/ip4/127.0.0.1/tcp/{4100 + i}"]
        assert h["peer_id"] == peer_id(peer_key(i)) and h["peer_id"].startswith("12D3KooW")
    code, out, _ = run("job", "status", str(job_id))
    assert "  served by   \n" in out
    for h in holders:
        assert f"    {h['operator']}  peer {h['peer_id']}  {h['multiaddrs'][0]}\n" in out
    assert f"(fetch it with `dtrain job fetch {job_id} --out DIR` while one is up)" in out
    code, out, _ = run("--json", "job", "watch", str(job_id), "--no-follow")
    events = [json.loads(line)["event"] for line in out.splitlines()]
    assert events[0] == "JobCreated" and events[-1] == "JobCompleted"
    code, out, _ = run("job", "watch", str(job_id))  # follow on an ended job returns
    assert "JobCompleted" in out
    code, out, _ = run(
        "--json", "rewards", "show", accounts[5].address, "--operator", accounts[1].address
    )
    shown = json.loads(out)
    # Pool of 1.5 ETH self-stake + 2 ETH delegated shares 20% of one 0.01 ETH epoch.
    per_share = (ETH // 100 * 20 // 100) * 10**18 // (35 * ETH // 10)
    reward = 2 * ETH * per_share // 10**18
    assert shown["pending_rewards"][accounts[1].address] == reward
    code, out, err = run(
        "--json", "rewards", "withdraw", "--claim", accounts[1].address, key=accounts[5].key
    )
    assert code == 0, err
    assert json.loads(out)["amount"] == reward


def test_cancel_and_unstake(run, bsm, accounts, data) -> None:
    code, out, _ = run(
        "--json", "job", "submit", "--price", "1gwei", "--dataset-uri", data, key=accounts[4].key
    )
    job_id = json.loads(out)["job_id"]
    assert json.loads(out)["seat_bond"] == bsm.params().min_seat_bond  # the default
    assert bsm.job(job_id).spec.min_operators == 2  # the default --operators 2:3
    code, out, err = run("job", "cancel", str(job_id), key=accounts[6].key)
    assert code == 1 and err.startswith("error: ") and "is not the caller" in err, err
    code, out, err = run("job", "cancel", str(job_id), key=accounts[4].key)
    assert code == 0, err
    assert out.startswith(f"job {job_id} cancelled; 0.000000003 ETH of escrow credited")
    code, out, _ = run("--json", "rewards", "show", accounts[4].address)
    assert json.loads(out)["credit"] == 3 * 10**9
    run(
        "operator",
        "register",
        "--stake",
        "3ether",
        "--peer-key",
        "0x" + "ab" * 32,
        key=accounts[1].key,
    )
    code, out, err = run("operator", "unstake", "1ether", key=accounts[1].key)
    assert code == 0 and "unbonding 1 ETH" in out, err
    code, out, err = run("stake", "undelegate", accounts[1].address, "1ether", key=accounts[6].key)
    assert code == 1 and err.startswith("error: cannot take 1 ETH: only 0 ETH staked")


@pytest.mark.parametrize(
    ("args", "key", "code", "message"),
    [
        (["operator", "stake", "1ether"], "0x1234", 1, "error: private key must be 32 bytes"),
        (["job", "status", "99"], None, 1, "error: job 99 does not exist"),
        (["operator", "stake", "-1ether"], "KEY", 2, "cannot read amount '-1ether'"),
        (["operator", "stake", "1.5 bananas"], "KEY", 2, "unknown unit 'bananas'"),
        (
            ["operator", "register", "--stake", "-2ether", "--peer-key", "0x" + "00" * 32],
            "KEY",
            2,
            "cannot read amount '-2ether'",
        ),
        (
            ["job", "submit", "--price", "1ether", "--operators", "x", "--dataset-uri", "DATA"],
            "KEY",
            2,
            "use MIN:MAX",
        ),
        (
            ["job", "submit", "--price", "1ether", "--operators", "1", "--dataset-uri", "DATA"],
            "KEY",
            2,
            "a job needs at least 2 operators",
        ),
        (
            ["job", "submit", "--price", "1ether", "--operators", "3:2", "--dataset-uri", "DATA"],
            "KEY",
            2,
            "MIN 3 is greater than MAX 2: write the smaller number first, e.g. 2:3",
        ),
        (
            ["job", "submit", "--price", "1gwei", "--seat-bond", "1gwei", "--dataset-uri", "DATA"],
            "KEY",
            1,
            "error: seat bond 0.000000001 ETH below the minimum 0.1 ETH",
        ),
        (
            ["operator", "register", "--stake", "0.5ether", "--peer-key", "0x" + "00" * 32],
            "KEY",
            1,
            "error: stake 0.5 ETH below minimum 1 ETH",
        ),
    ],
)
def test_bad_input_one_line_error(run, accounts, data, args, key, code, message) -> None:
    key = accounts[7].key if key == "KEY" else key
    args = [data if a == "DATA" else a for a in args]
    got, _out, err = run(*args, key=key)
    assert got == code
    assert message in err
    assert "Traceback" not in err
    if code == 1:
        assert len(err.strip().splitlines()) == 1


def test_cancel_after_the_open_timeout(run, bsm, accounts, data) -> None:
    """A job that started and lost every member: anyone may fail it once it waited the open
    timeout, and the CLI says so (not "cancelled")."""
    ops = [bsm.with_account(accounts[i].key) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(ETH, peer_key(i), [], "")
    code, out, err = run(
        "--json",
        "job",
        "submit",
        "--price",
        "1gwei",
        "--operators",
        "2:2",
        "--dataset-uri",
        data,
        key=accounts[4].key,
    )
    assert code == 0, err
    job_id = json.loads(out)["job_id"]
    for op in ops:
        op.join_job(job_id)
    p = bsm.params()
    advance(bsm.w3, p.start_grace + 3600 + p.reveal_window + 1)
    bsm.finalize_epoch(job_id, 0)  # nobody voted: both members slashed and out, the job Open
    code, _, err = run("job", "cancel", str(job_id), key=accounts[6].key)
    assert code == 1 and f"error: job {job_id} may be failed by anyone only after" in err, err
    advance(bsm.w3, p.open_timeout + 1)
    code, out, err = run("job", "cancel", str(job_id), key=accounts[6].key)
    assert code == 0, err
    assert out.strip() == (
        f"job {job_id} failed: it waited the open timeout for members; "
        "0.000000002 ETH of escrow credited to its caller"
    )
    assert bsm.credit_of(accounts[4].address) == 2 * 10**9
    code, out, _ = run("--json", "job", "status", str(job_id))
    assert json.loads(out)["state"]["status"] == "failed"


def test_rpc_down_and_foreign_contract(run, accounts) -> None:
    code, _, err = run(
        "--rpc-url",
        "http://127.0.0.1:9",
        "--contract",
        accounts[0].address,
        "job",
        "list",
        raw=True,
    )
    assert code == 1 and err.startswith("error: RPC http://127.0.0.1:9 unreachable")
    code, _, err = run("job", "list", raw=False)  # sanity: the real contract works
    assert code == 0
    code, _, err = run("--contract", accounts[2].address, "job", "list")
    assert code == 1 and "error: no contract at" in err


def test_config_file_and_env(run, chain, bsm, accounts, tmp_path, monkeypatch) -> None:
    cfg = tmp_path / "dtrain.toml"
    cfg.write_text(f'rpc_url = "{chain.url}"\ncontract = "{bsm.address}"\n')
    code, out, err = run("--config", str(cfg), "--json", "job", "list", raw=True)
    assert code == 0 and json.loads(out) == [], err
    monkeypatch.setenv("DTRAIN_RPC_URL", chain.url)
    monkeypatch.setenv("DTRAIN_CONTRACT", bsm.address)
    code, out, err = run("--json", "job", "list", raw=True)
    assert code == 0 and json.loads(out) == [], err


def test_debug_shows_traceback(chain, bsm) -> None:
    env = {**os.environ, "DTRAIN_RPC_URL": chain.url, "DTRAIN_CONTRACT": bsm.address}
    plain = subprocess.run(
        [*DTRAIN, "job", "status", "77"], capture_output=True, text=True, env=env, timeout=60
    )
    assert plain.returncode == 1 and plain.stderr == "error: job 77 does not exist\n"
    debug = subprocess.run(
        [*DTRAIN, "--debug", "job", "status", "77"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def _chain_up(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [*DTRAIN, "--json", "chain", "up", "--accounts", "2", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )


def test_chain_up_writes_the_env_file_other_commands_read(tmp_path, monkeypatch, capsys) -> None:
    """`chain up --port 0` serves a free port and writes the env file; deploy adds the contract
    to it; later commands need no options; options and environment variables override it; the
    file goes when the chain stops."""
    env_file = tmp_path / "env"
    monkeypatch.setenv("DTRAIN_ENV_FILE", str(env_file))
    proc = _chain_up("--port", "0", env={**os.environ, "DTRAIN_ENV_FILE": str(env_file)})
    try:
        data = json.loads(proc.stdout.readline())
        assert data["env_file"] == str(env_file) and not data["url"].endswith(":8545")
        assert f"export DTRAIN_RPC_URL={data['url']}\n" in env_file.read_text()
        w3 = Web3(Web3.HTTPProvider(data["url"]))
        assert w3.eth.get_balance(data["accounts"][0]["address"]) == 10_000 * ETH
        key = data["accounts"][0]["key"]
        assert main(["--key", key, "--json", "deploy"]) == 0  # no --rpc-url: the env file's
        address = json.loads(capsys.readouterr().out)["address"]
        assert f"export DTRAIN_CONTRACT={address}\n" in env_file.read_text()
        assert main(["--json", "job", "list"]) == 0  # neither --rpc-url nor --contract
        assert json.loads(capsys.readouterr().out) == []
        assert main(["--rpc-url", "http://127.0.0.1:9", "job", "list"]) == 1  # option first
        # the file's contract is for its own chain: the wrong URL is what the error names
        assert "RPC http://127.0.0.1:9 unreachable" in capsys.readouterr().err
        monkeypatch.setenv("DTRAIN_RPC_URL", "http://127.0.0.1:9")  # then the environment
        assert main(["--contract", address, "job", "list"]) == 1
        assert "RPC http://127.0.0.1:9 unreachable" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)  # a loaded machine stops anvil slowly
    assert proc.returncode == 0, proc.stderr.read()
    assert not env_file.exists()
    closed = Web3(Web3.HTTPProvider(data["url"], request_kwargs={"timeout": 2}))
    assert not closed.is_connected()


def test_chain_up_listens_on_8545_by_default(tmp_path) -> None:
    """Without --port, `chain up` takes 8545 (as the docs export); when it is taken it says so
    and how to get a free one. 8545 is held here so the test never competes for it."""
    import socket

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as anvil: TIME_WAIT is free
    try:
        holder.bind(("127.0.0.1", 8545))
        holder.listen()
    except OSError:
        pass  # another chain listens there: just as good
    env = {**os.environ, "DTRAIN_ENV_FILE": str(tmp_path / "env")}
    proc = _chain_up(env=env)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        holder.close()
        if proc.poll() is None:  # it listened after all: stop it, the asserts below fail
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)
    assert proc.returncode == 1
    assert err == (
        "error: port 8545 is in use (another chain running?): stop it, or pass --port 0 "
        "for a free port\n"
    )
    assert not (tmp_path / "env").exists()


def _slashed_job(bsm, accounts) -> tuple[int, list]:
    """Operators 1 and 2 (2 ETH self-stake each) in a 2:2 job; account 5 delegated 2 ETH to
    operator 1 and queued 0.5 ETH of it for unbonding; nobody votes and the epoch is settled:
    both members are slashed as dropouts (5% of their pools, unbonding stake included)."""
    ops = [bsm.with_account(accounts[i].key) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(2 * ETH, peer_key(i), [f"/ip4/127.0.0.1/tcp/{4300 + i}"], "")
    staker = bsm.with_account(accounts[5].key)
    staker.delegate(ops[0].sender, 2 * ETH)
    staker.undelegate(ops[0].sender, ETH // 2)
    job_id = bsm.with_account(accounts[4].key).create_job(
        spec(min_operators=2, max_operators=2, total_epochs=1)
    )
    for op in ops:
        op.join_job(job_id)
    job = bsm.job(job_id)
    advance(bsm.w3, job.reveal_deadline - bsm.latest_block_timestamp() + 1)
    return job_id, ops


def test_stake_show_positions_and_what_slashes_took(run, bsm, accounts) -> None:
    job_id, ops = _slashed_job(bsm, accounts)
    staker = accounts[5].address
    before = bsm.stake_of(ops[0].sender, staker) + bsm.unbonding_of(ops[0].sender, staker)[0]
    rc = bsm.finalize_epoch(job_id, 0)
    slash = next(e for e in rc.all("Slashed") if e.args["operator"] == ops[0].sender)
    # Pool: 2 + 2 - 0.5 active, 0.5 unbonding; 5% of 4 ETH. The staker held half of it.
    assert slash.args["amount"] == ETH // 5
    after = bsm.stake_of(ops[0].sender, staker) + bsm.unbonding_of(ops[0].sender, staker)[0]
    code, out, err = run("--json", "stake", "show", "--account", staker)
    assert code == 0, err
    (position,) = json.loads(out)["positions"]
    assert position["operator"] == ops[0].sender and position["stake"] == 1425 * ETH // 1000
    assert position["unbonding"] == 475 * ETH // 1000 and position["unlock_at"] > 0
    (loss,) = position["slashes"]
    assert loss["lost"] == before - after == ETH // 10  # what the reads say it lost
    assert (loss["job_id"], loss["epoch"], loss["reason"]) == (job_id, 0, "dropout")
    assert loss["pool_amount"] == ETH // 5
    code, out, err = run("stake", "show", "--account", staker)
    assert code == 0, err
    assert f"delegation with {ops[0].sender}\n  stake       1.425 ETH\n" in out
    assert "  unbonding   0.475 ETH, unlocks " in out and "slashable until withdrawn" in out
    assert "  slashed     0.1 ETH lost in 1 slash(es)\n" in out
    assert f"    job {job_id} epoch 0: dropout, " in out
    assert "the pool lost 0.2 ETH, this position 0.1 ETH" in out
    assert str(position["unlock_at"]) not in out  # a local time, never a unix timestamp
    code, out, err = run("stake", "show", key=accounts[1].key)  # an operator's own stake
    assert code == 0, err
    assert f"self-stake with {ops[0].sender}\n  stake       1.9 ETH" in out
    assert "  slashed     0.1 ETH lost in 1 slash(es)" in out
    code, out, _ = run("stake", "show", "--account", accounts[8].address)
    assert out.strip() == f"staker {accounts[8].address} has never staked"
    code, out, _ = run("job", "watch", str(job_id), "--no-follow")
    assert f"Slashed: operator {ops[0].sender}, jobId {job_id}, epoch 0, reason dropout, " in out
    assert "amount 0.2 ETH" in out and "reason=" not in out


def test_operator_info_lists_its_slashes(run, bsm, accounts, votes) -> None:
    """A slashed operator sees each slash of its pool in `operator info`: job, epoch, the ETH
    its pool lost and why, in words (`SlashReason.explanation`), in text and --json."""
    code, out, err = run("--json", "operator", "info", accounts[3].address)
    assert code == 0, err
    assert json.loads(out)["slashes"] == []
    job_id, ops = _slashed_job(bsm, accounts)  # operators 1 and 2: dropouts
    bsm.finalize_epoch(job_id, 0)
    # A second job: operators 1, 2 and 3 vote, 3 for another checkpoint (fabrication).
    third = bsm.with_account(accounts[3].key)
    third.register_operator(2 * ETH, peer_key(3), [], "")
    ops.append(third)
    fab_job = bsm.with_account(accounts[4].key).create_job(spec(total_epochs=1))
    for op in ops:
        op.join_job(fab_job)
    right, wrong = Web3.keccak(text="work"), Web3.keccak(text="made up")
    for op, ckpt in zip(ops, (right, right, wrong), strict=True):
        votes.commit(op, fab_job, 0, ckpt, [4, 4, 4])
    for op in ops:
        votes.reveal(op, fab_job, 0)
    rc = bsm.finalize_epoch(fab_job, 0)
    (fab,) = rc.all("Slashed")
    assert fab.args["operator"] == third.sender and fab.args["reason"] == SlashReason.FABRICATION

    code, out, err = run("--json", "operator", "info", ops[0].sender)
    assert code == 0, err
    info = json.loads(out)
    assert info["registered"] is True and info["address"] == ops[0].sender
    (slash,) = info["slashes"]
    assert (slash["job_id"], slash["epoch"], slash["amount"]) == (job_id, 0, ETH // 5)
    assert slash["reason"] == "dropout" and slash["reporter"] == bsm.sender
    assert slash["explanation"] == SlashReason.DROPOUT.explanation
    assert slash["meaning"] == SlashReason.DROPOUT.meaning
    assert slash["time"] > 0 and slash["tx_hash"].startswith("0x")
    code, out, err = run("operator", "info", ops[0].sender)
    assert code == 0, err
    assert "\nslashed     0.2 ETH in 1 slash(es)\n" in out
    assert f"  job {job_id} epoch 0: 0.2 ETH, {SlashReason.DROPOUT.explanation} (dropout), " in out
    # Its P&L: paid for fab_job's epoch, half the 0.2 ETH slash taken from its own stake (the
    # other half from the delegator's), nothing withdrawn.
    share = spec().price_per_operator_epoch * bsm.params().operator_bps // 10_000
    rewards = bsm.pending_rewards(ops[0].sender, ops[0].sender)
    assert rewards > 0
    assert info["earnings"] == {
        "paid_epochs": 1, "paid": share, "rewards": rewards, "bounties": 0,
        "slashed": ETH // 10, "withdrawn": 0, "token_epochs": 0,
        "earned": share + rewards, "net": share + rewards - ETH // 10,
    }  # fmt: skip
    net = ETH // 10 - share - rewards
    assert f"earned      {format_eth(share + rewards)}: {format_eth(share)} for 1 paid " in out
    assert "lost        0.1 ETH of its own stake to slashes\nwithdrawn   0 ETH\n" in out
    assert f"net         -{format_eth(net)} (earned less what slashes took" in out

    code, out, err = run("--json", "operator", "info", third.sender)
    assert code == 0, err
    (slash,) = json.loads(out)["slashes"]
    assert (slash["job_id"], slash["reason"]) == (fab_job, "fabrication")
    assert slash["amount"] == fab.args["amount"] > 0
    code, out, err = run("operator", "info", key=accounts[3].key)  # the --key account
    assert code == 0, err
    lost = format_eth(fab.args["amount"])
    assert f"slashed     {lost} in 1 slash(es)\n" in out
    assert (
        f"  job {fab_job} epoch 0: {lost}, fabricated checkpoint: its vote was not the quorum's "
        "(fabrication), "
    ) in out
    code, out, err = run("operator", "info", accounts[8].address)  # never registered
    assert code == 0, err
    assert "slashed     0 ETH in 0 slash(es)" in out


def test_rewards_show_every_pool_without_naming_it(run, bsm, accounts) -> None:
    """`rewards show` alone lists the pending rewards of every pool the account staked in
    (docs/sdk.md showed `--operator` as needed)."""
    ops = [bsm.with_account(accounts[i].key) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(2 * ETH, peer_key(i), [], "")
    bsm.with_account(accounts[5].key).delegate(ops[1].sender, ETH)
    code, out, err = run("--json", "rewards", "show", key=accounts[5].key)
    assert code == 0, err
    assert json.loads(out)["pending_rewards"] == {ops[1].sender: 0}
    code, out, err = run("rewards", "show", key=accounts[1].key)
    assert code == 0, err
    assert f"pending  0 ETH from the pool of {ops[0].sender}" in out


def test_finalize_on_an_idle_chain_past_the_deadline(run, bsm, accounts, monkeypatch) -> None:
    """The wall clock passed the reveal deadline but the idle chain's latest block did not:
    an estimate would run against that old block, so the CLI sends with a fixed gas limit and
    says so; before the deadline it says when to come back."""
    ops = [bsm.with_account(accounts[i].key) for i in (1, 2)]
    for i, op in enumerate(ops):
        op.register_operator(2 * ETH, peer_key(i), [], "")
    job_id = bsm.with_account(accounts[4].key).create_job(
        spec(min_operators=2, max_operators=2, total_epochs=1)
    )
    for op in ops:
        op.join_job(job_id)
    job = bsm.job(job_id)
    late = max(job.reveal_deadline + 5, int(time.time()) + 1)
    code, _, err = run("job", "finalize", str(job_id), key=accounts[6].key)
    assert code == 1
    assert err.startswith(
        f"error: epoch 0 (epochs 0..0) of job {job_id} cannot be settled yet: "
        "0 of 2 members revealed and "
        "reveals are open until "
    )
    assert err.rstrip().endswith("; run this again after that") and " (in " in err
    bsm.w3.provider.make_request("evm_setNextBlockTimestamp", [late])  # the next block is now
    assert bsm.latest_block_timestamp() <= job.reveal_deadline  # ...the latest one is stale
    with pytest.raises(errors.EpochNotFinalizable):  # what an estimate says
        bsm.finalize_epoch(job_id, 0)
    # The wall clock moved on, for the CLI only and only here: `time.time` is the time module's
    # own attribute, and a patch left to the test's teardown would still hold when the chain
    # fixture puts the chain's clock back on the wall clock (the next test's chain would start
    # an hour ahead, and an x402 payment signed for the next 5 minutes would be expired).
    with monkeypatch.context() as wall:
        wall.setattr("dtrain.cli.job.time.time", lambda: float(late))
        code, out, err = run("job", "finalize", str(job_id), key=accounts[6].key)
    assert code == 0, err
    assert out.startswith(f"epoch 0 (epochs 0..0) of job {job_id} settled\n")
    assert "  Slashed: " in out and "reason dropout" in out
    assert "was older than the reveal deadline: sent with a fixed gas limit of 6,000,000" in out
    assert bsm.job(job_id).state.failed_epochs == 1


def test_register_without_eth_says_what_it_needs(run) -> None:
    poor = "0x" + "11" * 32
    code, _, err = run(
        "operator", "register", "--stake", "1ether", "--peer-key", "0x" + "ab" * 32, key=poor
    )
    assert code == 1
    assert err.startswith("error: register needs 1 ETH of stake (at least 1 ETH) plus gas; ")
    assert "has 0 ETH: send it ETH or use a funded key (`dtrain chain up` prints some)" in err
    assert len(err.strip().splitlines()) == 1


def test_a_checkpoint_nobody_serves_is_one_plain_line(run, capsys) -> None:
    """What `dtrain job fetch` shows when every holder is down: the node raises
    `errors.NotServed`; the dial errors libp2p logs (Python prints a library's unhandled ERROR
    records to stderr) and keeps in `tried` stay out of the terminal."""
    import logging

    import click

    from dtrain.cli import cli

    message = "job 3: nobody serves its final checkpoint now; ask an operator to run its node"

    @click.command("fetch-probe")
    def probe() -> None:
        for _ in range(4):
            logging.getLogger("libp2p.transport.tcp").error("Failed to open TCP stream: refused")
        tried = ("peer: Failed to open TCP stream to /ip4/127.0.0.1/tcp/9",)
        raise errors.NotServed(message, tried)

    cli.add_command(probe)
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # as in a terminal, not under pytest's log capture
    try:
        code, out, err = run("fetch-probe", raw=True)
    finally:
        root.handlers[:] = saved
        cli.commands.pop("fetch-probe")
    assert code == 1 and out == ""
    assert err == f"error: {message}\n"


def test_submit_pins_every_hash_itself(run, bsm, accounts, data) -> None:
    """A caller names the model and the dataset; `job submit` computes both hashes (the model's
    from its URI and seed, the dataset's sha256), pins them and prints them. Nothing depends on
    the job id: the same URI pins the same hash for every job."""
    import hashlib

    code, out, err = run("model", "hash", "builtin:tiny?seed=3", raw=True)
    assert code == 0, err
    pinned_model = out.strip()
    assert pinned_model != run("model", "hash", "builtin:tiny", raw=True)[1].strip()
    sha = hashlib.sha256(Path(data).read_bytes()).hexdigest()
    for _ in range(2):
        code, out, err = run(
            "job", "submit", "--price", "1gwei", "--model-uri", "builtin:tiny?seed=3",
            "--dataset-uri", data, key=accounts[4].key,
        )  # fmt: skip
        assert code == 0, err
        assert f"model    builtin:tiny?seed=3  {pinned_model}" in out
        assert f"dataset  {data}  0x{sha} (sha256)" in out
        job_id = int(out.split()[1])
        spec = bsm.job(job_id).spec
        assert "0x" + spec.model_hash.hex() == pinned_model
        assert spec.dataset_hash.hex() == sha


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset-uri", "/nonexistent/corpus.txt"], "is not a file on this machine"),
        (["--dataset-uri", ""], "a job needs a dataset"),
        (["--dataset-uri", "DATA", "--model-uri", ""], "a job needs a model"),
        (["--dataset-uri", "DATA", "--model-uri", "builtin:huge"], "unknown builtin model"),
        (["--dataset-uri", "DATA", "--model-uri", "builtin:tiny?s=1"], "only option is ?seed=N"),
    ],
)
def test_submit_rejects_what_it_cannot_pin(run, bsm, accounts, data, extra, message) -> None:
    before = bsm.next_job_id()
    args = [data if a == "DATA" else a for a in extra]
    code, _, err = run("job", "submit", "--price", "1gwei", *args, key=accounts[4].key)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err
    assert bsm.next_job_id() == before  # nothing created


def test_submit_pins_the_recipe(run, bsm, accounts, data, tmp_path) -> None:
    """`--recipe PATH` pins the recipe's canonical hash and its path, and prints both; `dtrain
    recipe hash` prints the same hash; a job without a recipe pins zero and an empty URI."""
    from dtrain.recipe import Recipe

    path = tmp_path / "recipe.toml"
    path.write_text("batch_size = 4\ndpo_beta = 0.2\nseed = 3\n")
    # a file that leaves head_mean_topk out means what it meant before the field: 0 (ABSENT)
    want = "0x" + Recipe(batch_size=4, dpo_beta=0.2, seed=3, head_mean_topk=0).hash().hex()
    code, out, err = run("recipe", "hash", str(path), raw=True)
    assert code == 0 and out.strip() == want, err
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--dataset-uri", data, "--recipe", str(path),
        key=accounts[4].key,
    )  # fmt: skip
    assert code == 0, err
    assert f"recipe   {path}  {want}" in out
    spec = bsm.job(int(out.split()[1])).spec
    assert ("0x" + spec.recipe_hash.hex(), spec.recipe_uri) == (want, str(path))
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--dataset-uri", data, key=accounts[4].key
    )
    assert code == 0 and "recipe" not in out, err
    spec = bsm.job(int(out.split()[1])).spec
    assert (spec.recipe_hash, spec.recipe_uri) == (b"\0" * 32, "")


def test_submit_rejects_a_bad_recipe(run, bsm, accounts, data, tmp_path) -> None:
    path = tmp_path / "recipe.toml"
    path.write_text("batch_size = 0\n")
    before = bsm.next_job_id()
    code, _, err = run(
        "job", "submit", "--price", "1gwei", "--dataset-uri", data, "--recipe", str(path),
        key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and "'batch_size' must be >= 1" in err, err
    assert bsm.next_job_id() == before


def test_first_job_friction_points(run, bsm, accounts, data) -> None:
    """What the quickstart met: registering needs no peer key yet (the node sets its own), a
    transaction hash reads 0x..., a delegation to an operator in a job says when it starts
    earning (and one to an idle operator earns at once), and `job watch` shows no chain-wide
    attempt counter as if it were the job's."""
    code, out, err = run("operator", "register", "--stake", "1ether", key=accounts[1].key)
    assert code == 0, err
    assert "(tx 0x" in out
    assert not any(bsm.operator(accounts[1].address).peer_key)
    code, out, err = run("--json", "stake", "delegate", accounts[1].address, "1ether",
                         key=accounts[5].key)  # fmt: skip
    assert code == 0 and json.loads(out)["earns_from"] == 0, err
    run("operator", "register", "--stake", "1ether", key=accounts[2].key)
    code, out, err = run(
        "--json", "job", "submit", "--price", "1gwei", "--operators", "2:2", "--dataset-uri",
        data, key=accounts[4].key,
    )  # fmt: skip
    job_id = json.loads(out)["job_id"]
    for i in (1, 2):
        assert run("operator", "join", str(job_id), key=accounts[i].key)[0] == 0
    code, out, err = run("stake", "delegate", accounts[1].address, "1ether", key=accounts[5].key)
    assert code == 0, err
    period = bsm.reward_period()
    earns = (bsm.latest_block_timestamp() // period + 2) * period
    assert f"this stake earns rewards from {format_time(earns)}" in out
    code, out, err = run("job", "watch", str(job_id), "--no-follow")
    assert code == 0 and "EpochStarted: jobId" in out and "attempt" not in out, out
    code, out, _ = run("--json", "job", "watch", str(job_id), "--no-follow")
    assert any("attempt" in json.loads(line) for line in out.splitlines())


@pytest.mark.parametrize(
    ("operators", "extra", "topk"),
    [
        ("2:4", [], 82),  # 100 steps at K = 2: coverage 1 in 50 syncs
        ("3:8", ["--sync", "4"], 164),  # 25 syncs
        ("2:4", ["--steps", "10000"], 4),  # 5,000 syncs: the member floor
        ("3:8", ["--steps", "10000"], 6),
        ("3:8", ["--topk", "3"], 3),
    ],
)
def test_submit_pins_the_topk_for_the_epochs_length_and_the_member_count(
    run, bsm, accounts, data, operators, extra, topk
) -> None:
    """Without --topk the job pins enough coefficients per sync for each to be sent about once
    an epoch, and at least the compression measured for its size (more members need more
    coefficients each to keep gaining over fewer); --topk overrides it."""
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--dataset-uri", data, "--operators", operators,
        *extra, key=accounts[4].key,
    )  # fmt: skip
    assert code == 0, err
    assert bsm.job(int(out.split()[1])).spec.topk_per_chunk == topk


@pytest.mark.parametrize(
    ("extra", "option"),
    [
        (["--price", "0"], "--price"),
        (["--price", "0ether"], "--price"),
        (["--price", "0", "--token", "0x" + "00" * 20], "--price"),
        (["--price", "0.0", "--x402", "http://127.0.0.1:9"], "--price"),
        (["--price", "1gwei", "--seat-bond", "0"], "--seat-bond"),
        (["--price", "1gwei", "--epochs", "0"], "--epochs"),
        (["--price", "1gwei", "--steps", "0"], "--steps"),
        (["--price", "1gwei", "--steps", "10", "--sync", "20"], "--sync"),
        (["--price", "1gwei", "--topk", "0"], "--topk"),
        (["--price", "1gwei", "--topk", "5000"], "--topk"),
    ],
)
def test_submit_refuses_cheap_problems_before_the_model_check(
    run, bsm, accounts, data, extra, option
) -> None:
    """A zero price (or seat bond, epochs, steps...) is refused at once, in one line naming the
    option: before the dataset is read or the model is loaded (here a model that cannot load,
    and a dataset that is not there: neither is what the error is about)."""
    before = bsm.next_job_id()
    code, out, err = run(
        "job", "submit", *extra, "--model-uri", "builtin:huge", "--dataset-uri",
        "/nonexistent/corpus.txt", key=accounts[4].key,
    )  # fmt: skip
    assert code != 0 and not out
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert option in err and "model" not in err and "dataset" not in err, err
    assert bsm.next_job_id() == before  # nothing sent


def test_submit_refuses_an_unfunded_key_before_the_model_check(run, bsm, data) -> None:
    """A key that cannot pay the escrow is told so at once, with the escrow's terms and its
    balance, not after the dataset is read and the model loaded (here neither could be)."""
    from eth_account import Account

    empty = Account.create()
    before = bsm.next_job_id()
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--operators", "2:3", "--epochs", "2",
        "--model-uri", "builtin:huge", "--dataset-uri", "/nonexistent/corpus.txt",
        key=empty.key.hex(),
    )  # fmt: skip
    assert code != 0 and not out and len(err.strip().splitlines()) == 1, err
    assert "escrows 0.000000006 ETH (--price x 3 operators x 2 epochs)" in err, err
    assert empty.address in err and "model" not in err and "dataset" not in err, err
    assert bsm.next_job_id() == before


@pytest.mark.parametrize(("topk", "why"), [("4096", "gossip limit")])
def test_submit_refuses_a_compression_no_member_can_sync(
    run, bsm, accounts, data, topk, why
) -> None:
    """The contract takes any top-k above 0; one whose packet is over the gossip limit would
    have every operator join and fail at the epoch's start: refused before any transaction, in
    one line (one above a 64x64 chunk is refused before the model loads, with the flags)."""
    before = bsm.next_job_id()
    code, out, err = run(
        "job", "submit", "--price", "1gwei", "--dataset-uri", data, "--model-uri",
        "builtin:small", "--topk", topk, key=accounts[4].key,
    )  # fmt: skip
    assert code == 1 and not out and len(err.strip().splitlines()) == 1, err
    assert "this job could not train" in err and why in err, err
    assert bsm.next_job_id() == before


@pytest.mark.parametrize(
    "extra",
    [
        ["--dataset-uri", "REL_DATA"],
        ["--dataset-uri", "file://REL_DATA"],
        ["--dataset-uri", "DATA", "--model-uri", "REL_MODEL"],
        ["--dataset-uri", "DATA", "--model-uri", "./REL_MODEL"],
        ["--dataset-uri", "DATA", "--recipe", "recipe.toml"],
    ],
)
def test_submit_refuses_a_relative_path(
    run, bsm, accounts, data, tmp_path, monkeypatch, extra
) -> None:
    """A relative path in a job reaches no operator (each reads it from its own working
    directory): refused before any transaction, saying what to use instead."""
    from dtrain_node.train.toy_models import save

    monkeypatch.chdir(tmp_path)
    save("gpt2", tmp_path / "my-model")
    Path("corpus.txt").write_text(Path(data).read_text())
    Path("recipe.toml").write_text("batch_size = 4\n")
    rel = {"REL_DATA": "corpus.txt", "REL_MODEL": "my-model", "DATA": data}  # REL_ first
    args = [next((a.replace(k, v) for k, v in rel.items() if k in a), a) for a in extra]
    before = bsm.next_job_id()
    code, out, err = run("job", "submit", "--price", "1gwei", *args, key=accounts[4].key)
    assert code == 1 and not out and len(err.strip().splitlines()) == 1, err
    assert "relative path" in err and "--serve" in err and "absolute" in err, err
    assert bsm.next_job_id() == before


def test_submit_keeps_every_reference_form(run, bsm, accounts, data, tmp_path) -> None:
    """Absolute paths, file:// with an absolute path, builtin: with a seed, and p2p:/https:
    references pinned by hash all still make a job; the job names them as given."""
    sha = "0x" + "ab" * 32
    for extra in (
        ["--dataset-uri", data, "--model-uri", "builtin:tiny?seed=2"],
        ["--dataset-uri", "file://" + data],
        ["--dataset-uri", f"p2p:/ip4/10.0.0.5/tcp/4100/p2p/12D3KooWx#sha256={sha[2:]}",
         "--dataset-hash", sha],
        ["--dataset-uri", "https://example.com/c.txt", "--dataset-hash", sha],
    ):  # fmt: skip
        code, out, err = run(
            "--json", "job", "submit", "--price", "1gwei", *extra, key=accounts[4].key
        )
        assert code == 0, (extra, err)
        spec = bsm.job(json.loads(out)["job_id"]).spec
        assert spec.dataset_uri == extra[1]


def test_submit_refuses_a_paper_recipe_that_does_not_sync_every_step(
    run, bsm, accounts, data, tmp_path
) -> None:
    """A recipe in the DeMo paper's mode syncs every step: with --sync 5 `job submit` says so
    in one line and sends nothing; with --sync 1 it pins the recipe."""
    from dtrain.recipe import Recipe

    recipe = Recipe(demo_mode="paper", outer_lr=0.001, outer_momentum=0.99)
    path = tmp_path / "paper.toml"
    path.write_text(recipe.to_toml())
    args = ["job", "submit", "--operators", "2", "--steps", "10", "--price", "0.01ether"]
    args += ["--dataset-uri", data, "--recipe", str(path)]
    next_job = bsm.next_job_id()
    code, _, err = run(*args, "--sync", "5", key=accounts[4].key)
    assert code == 1 and err.count("\n") == 1, err
    assert "--sync 5" in err and "demo_mode 'paper'" in err and "--sync 1" in err, err
    assert bsm.next_job_id() == next_job
    code, out, err = run("--json", *args, "--sync", "1", "--dry-run", key=accounts[4].key)
    assert code == 0, err
    assert json.loads(out)["recipe_hash"] == "0x" + recipe.hash().hex()


def test_submit_dry_run_sends_nothing_and_pins_what_submit_pins(run, bsm, accounts, data) -> None:
    """`job submit --dry-run` runs the checks (the contract's too, by estimating the creation),
    prints the pins and the escrow, and sends nothing: the caller's nonce and balance and the
    BSM's job count stay; a real submit of the same arguments then pins the same hashes."""
    from dtrain.devtoken import UNIT, TestUSD

    caller = accounts[4]
    args = ["job", "submit", "--operators", "2:3", "--epochs", "2", "--steps", "10"]
    args += ["--sync", "5", "--price", "0.01ether", "--dataset-uri", data]
    w3 = bsm.w3
    before = (w3.eth.get_transaction_count(caller.address), w3.eth.get_balance(caller.address))
    next_job = bsm.next_job_id()
    code, out, err = run("--json", *args, "--dry-run", key=caller.key)
    assert code == 0, err
    dry = json.loads(out)
    assert dry["dry_run"] is True and dry["gas"] > 0 and dry["token"] is None
    assert dry["escrow"] == 6 * ETH // 100 and dry["seat_bond"] == bsm.params().min_seat_bond
    assert (dry["max_operators"], dry["total_epochs"]) == (3, 2)
    assert dry["dataset_uri"] == data and dry["model_uri"] == "builtin:tiny"
    assert dry["recipe_hash"] == "0x" + "00" * 32
    sync = dry["sync"]  # 2 syncs an epoch: half of each chunk a sync covers it once
    assert (sync["topk_per_chunk"], sync["syncs_per_epoch"], sync["coverage"]) == (2048, 2, 1.0)
    assert sync["packet_bytes"] > 0 and sync["less_than_bf16_ring"] > 1
    code, out, err = run(*args, "--dry-run", key=caller.key)
    assert code == 0, err
    assert out.startswith("dry run: nothing sent; the job would be created as follows ")
    assert f"  model    builtin:tiny  {dry['model_hash']}\n" in out
    assert f"  dataset  {data}  {dry['dataset_hash']} (sha256)" in out
    escrow = f"  escrow   0.06 ETH = 0.01 ETH x 3 operators x 2 epoch(s), paid by {caller.address}"
    assert escrow in out
    assert "  sync     top-k 2048 per 64x64 chunk, 2 syncs an epoch: coverage 1.00, " in out
    after = (w3.eth.get_transaction_count(caller.address), w3.eth.get_balance(caller.address))
    assert after == before and bsm.next_job_id() == next_job

    code, out, err = run("--json", *args, key=caller.key)
    assert code == 0, err
    real = json.loads(out)
    assert real["job_id"] == next_job
    for field in ("model_hash", "dataset_hash", "recipe_hash", "escrow", "seat_bond"):
        assert real[field] == dry[field], field
    spec = bsm.job(next_job).spec
    assert spec.topk_per_chunk == sync["topk_per_chunk"] and real["sync"] == sync
    assert "0x" + spec.model_hash.hex() == dry["model_hash"]
    assert "0x" + spec.dataset_hash.hex() == dry["dataset_hash"]

    # The contract's checks run: a seat bond below the minimum, a caller without the escrow.
    code, _, err = run(*args, "--dry-run", "--seat-bond", "1gwei", key=caller.key)
    assert code == 1 and err.count("\n") == 1 and "seat bond" in err.lower(), err
    poor = "0x" + "11" * 32
    code, _, err = run(*args, "--dry-run", key=poor)
    assert code == 1 and err.count("\n") == 1 and "0.06 ETH" in err, err

    # A token job: the token must be allowed; the escrow's approval would come first.
    usd = TestUSD.deploy(w3, accounts[0].key)
    usd.mint(caller.address, 10 * UNIT)
    tok = [a if a != "0.01ether" else "0.5" for a in args] + ["--token", usd.address]
    code, _, err = run(*tok, "--dry-run", key=caller.key)
    assert code == 1 and "is not an allowed payment token" in err, err
    bsm.with_account(accounts[11].key).set_payment_token(usd.address)
    nonce = w3.eth.get_transaction_count(caller.address)
    code, out, err = run(*tok, "--dry-run", key=caller.key)
    assert code == 0, err
    assert "  escrow   3 TUSD = 0.5 TUSD x 3 operators x 2 epoch(s)" in out
    assert "the escrow's approval comes first" in out
    assert w3.eth.get_transaction_count(caller.address) == nonce
    assert usd.allowance(caller.address, bsm.address) == 0
    usd.with_account(caller.key).approve(bsm.address, 3 * UNIT)
    code, out, err = run("--json", *tok, "--dry-run", key=caller.key)
    assert code == 0, err
    assert json.loads(out)["gas"] > 0 and json.loads(out)["escrow"] == 3 * UNIT
    assert bsm.next_job_id() == next_job + 1 and usd.balance_of(caller.address) == 10 * UNIT

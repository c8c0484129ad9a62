"""Asks per payment unit on a real anvil: an operator registered as docs/quickstart.md teaches
(an ask of 0.01 ETH) is refused a job priced in TestUSD, told why, and takes it after
`dtrain operator update --ask ... --token ...`; bad input is one line and a non-zero exit."""

from __future__ import annotations

import json

from harness.chain import ETH, spec

from dtrain.devtoken import UNIT, TestUSD

OPERATOR, GATEWAY, DEVELOPER = 1, 4, 11
NO_PEER_KEY = "0x" + "00" * 32


def _one_line_error(code: int, err: str) -> str:
    assert code in (1, 2), err  # 2: the argument itself is unreadable
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def _token_job(bsm, as_account, usd: TestUSD, price: int) -> int:
    gateway = as_account(GATEWAY)
    usd.mint(gateway.sender, 2 * price)
    s = spec(price_per_operator_epoch=price, total_epochs=1, min_operators=2, max_operators=2)
    return gateway.create_job_with_token(s, usd.address, gateway.sender)


def test_quickstart_operator_takes_a_token_job_after_update(run, bsm, accounts, as_account):
    usd = TestUSD.deploy(bsm.w3, accounts[0].key)
    bsm.with_account(accounts[DEVELOPER].key).set_payment_token(usd.address)
    op = accounts[OPERATOR]
    code, _, err = run(
        "operator", "register", "--stake", "2ether", "--min-price", "0.01ether",
        "--peer-key", NO_PEER_KEY, key=op.key,
    )  # fmt: skip
    assert code == 0, err
    job_id = _token_job(bsm, as_account, usd, price=UNIT // 100)  # 0.01 TUSD

    err = _one_line_error(*run("operator", "join", str(job_id), key=op.key)[::2])
    assert f"set no ask in token {usd.address}" in err, err
    assert op.address not in bsm.job(job_id).members
    code, out, err = run("operator", "info", key=op.key)
    assert code == 0, err
    assert "ask         0.01 ETH\n" in out
    assert f"ask in TUSD none: takes no job in {usd.address}\n" in out

    code, out, err = run("operator", "update", "--ask", "0.01", "--token", usd.address, key=op.key)
    assert code == 0, err
    assert out.startswith("ask 0.01 TUSD (tx 0x"), out
    code, out, err = run("--json", "operator", "info", key=op.key)
    assert code == 0, err
    asks = {a["token"]: a["ask"] for a in json.loads(out)["asks"]}
    assert asks == {None: ETH // 100, usd.address: UNIT // 100}

    code, _, err = run("operator", "join", str(job_id), key=op.key)
    assert code == 0, err
    assert op.address in bsm.job(job_id).members

    # The ask in the token binds: a job paying less is refused, in the token's units.
    run("operator", "update", "--ask", "0.02", "--token", usd.address, key=op.key)
    cheap = _token_job(bsm, as_account, usd, price=UNIT // 100)
    err = _one_line_error(*run("operator", "join", str(cheap), key=op.key)[::2])
    assert (
        f"job price 10000 below the operator's ask 20000, in base units of token {usd.address}"
        in err
    )


def test_operator_update_sets_the_ether_ask_alone(run, bsm, accounts, as_account):
    usd = TestUSD.deploy(bsm.w3, accounts[0].key)
    bsm.with_account(accounts[DEVELOPER].key).set_payment_token(usd.address)
    op = accounts[OPERATOR]
    run("operator", "register", "--stake", "2ether", "--min-price", "0.01ether", key=op.key)
    run("operator", "update", "--ask", "1", "--token", usd.address, key=op.key)
    code, out, err = run("operator", "update", "--ask", "0", key=op.key)
    assert code == 0, err
    assert out.startswith("ask 0 ETH (tx 0x"), out
    assert bsm.ask_in(op.address) == 0
    assert bsm.ask_in(op.address, usd.address) == UNIT


def test_operator_update_bad_input_is_one_line(run, bsm, accounts):
    usd = TestUSD.deploy(bsm.w3, accounts[0].key)  # not allowed on the BSM
    op = accounts[OPERATOR]
    err = _one_line_error(*run("operator", "update", "--ask", "0", key=op.key)[::2])
    assert f"{op.address} is not a registered operator" in err, err
    run("operator", "register", "--stake", "2ether", key=op.key)
    err = _one_line_error(
        *run("operator", "update", "--ask", "1", "--token", usd.address, key=op.key)[::2]
    )
    assert f"token {usd.address} is not an allowed payment token" in err, err
    err = _one_line_error(*run("operator", "update", "--ask", "-1", key=op.key)[::2])
    assert "amounts are never negative" in err, err
    err = _one_line_error(
        *run("operator", "update", "--ask", "0.0000001", "--token", usd.address, key=op.key)[::2]
    )
    assert "more than 6 decimal places" in err, err
    err = _one_line_error(
        *run("operator", "update", "--ask", "1", "--token", "0x12", key=op.key)[::2]
    )
    assert err == "error: --token '0x12' is not an address\n", err
    err = _one_line_error(*run("operator", "update", "--ask", "1")[::2])
    assert "no key" in err, err
    assert bsm.ask_in(op.address) == 0

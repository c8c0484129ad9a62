"""`dtrain token`: deploy the devnet TestUSD, allow it on the BSM, mint it and read balances,
against a real anvil; bad input is one line on stderr and a non-zero exit."""

from __future__ import annotations

import json

from dtrain.devtoken import UNIT, TestUSD, is_test_usd


def _one_line_error(code: int, err: str) -> str:
    assert code == 1, err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_deploy_allow_mint_balance(run, bsm, accounts) -> None:
    developer, caller = accounts[11], accounts[4]
    code, out, err = run("token", "deploy", key=accounts[0].key)
    assert code == 0, err
    token = out.strip()
    assert is_test_usd(bsm.w3, token)
    assert f"`dtrain token allow {token}`" in err
    code, out, err = run("--json", "token", "deploy", key=accounts[0].key)
    assert code == 0, err
    assert json.loads(out)["symbol"] == "TUSD" and json.loads(out)["decimals"] == 6

    assert not bsm.is_payment_token(token)
    code, out, err = run("token", "allow", token, key=developer.key)
    assert code == 0, err
    assert out.startswith(f"TUSD {token} allowed for new jobs on BSM {bsm.address} (tx 0x")
    assert bsm.is_payment_token(token)

    code, out, err = run("token", "mint", token, "12.5", "--to", caller.address, key=caller.key)
    assert code == 0, err
    assert out.startswith(f"minted 12.5 TUSD to {caller.address} (now holds 12.5 TUSD; tx 0x")
    assert TestUSD(bsm.w3, token).balance_of(caller.address) == 12 * UNIT + UNIT // 2
    code, out, err = run("--json", "token", "mint", token, "0.000001", key=accounts[6].key)
    assert code == 0, err  # --to defaults to the --key account
    assert json.loads(out) == {
        "token": token,
        "to": accounts[6].address,
        "amount": 1,
        "balance": 1,
    }

    code, out, err = run("token", "balance", token, key=caller.key)
    assert code == 0, err
    assert out == (
        f"{caller.address} holds 12.5 TUSD ({token})\n"
        f"credit in BSM {bsm.address}: 0 TUSD\n"
        "allowed for new jobs: yes\n"
    )
    code, out, err = run("--json", "token", "balance", token, "--account", accounts[7].address)
    assert code == 0, err
    data = json.loads(out)
    assert (data["balance"], data["credit"], data["allowed"]) == (0, 0, True)
    assert (data["account"], data["decimals"]) == (accounts[7].address, 6)

    code, out, err = run("--json", "token", "allow", token, "--disallow", key=developer.key)
    assert code == 0, err
    assert json.loads(out)["allowed"] is False and not bsm.is_payment_token(token)


def test_token_bad_input_is_one_line(run, bsm, accounts) -> None:
    usd = TestUSD.deploy(bsm.w3, accounts[0].key)
    not_a_token = accounts[3].address  # an account: no code
    err = _one_line_error(*run("token", "allow", usd.address, key=accounts[4].key)[::2])
    assert "only the blueprint developer" in err and accounts[11].address in err
    assert not bsm.is_payment_token(usd.address)
    err = _one_line_error(*run("token", "allow", not_a_token, key=accounts[11].key)[::2])
    assert err == f"error: {not_a_token} is not an ERC-20 token on this chain\n"
    err = _one_line_error(*run("token", "mint", "0x1234", "1", key=accounts[4].key)[::2])
    assert err == "error: not an address: '0x1234'\n"
    # An ERC-20 that is not the devnet token: the BSM's own address holds other code.
    err = _one_line_error(*run("token", "mint", bsm.address, "1", key=accounts[4].key)[::2])
    assert "is not an ERC-20 token" in err
    # An ERC-20 that is not the devnet token (TestUSD's code with another metadata hash).
    code = bytes(bsm.w3.eth.get_code(usd.address))
    other = "0x" + "77" * 20
    bsm.w3.provider.make_request(
        "anvil_setCode", [other, "0x" + (code[:-3] + b"\xff" + code[-2:]).hex()]
    )
    assert bsm.w3.eth.get_code(other) and not is_test_usd(bsm.w3, other)
    err = _one_line_error(*run("token", "mint", other, "1", key=accounts[4].key)[::2])
    assert "is not the devnet TestUSD this SDK deploys (`dtrain token deploy`)" in err
    code_, out, err = run("token", "balance", other, "--account", accounts[4].address)
    assert code_ == 0 and out.startswith(f"{accounts[4].address} holds 0 "), err  # any ERC-20
    for amount, says in (("0", "is not above zero"), ("1.0000001", "more than 6 decimal places")):
        err = _one_line_error(*run("token", "mint", usd.address, amount, key=accounts[4].key)[::2])
        assert says in err, err
    err = _one_line_error(
        *run("token", "mint", usd.address, "1", "--to", "nobody", key=accounts[4].key)[::2]
    )
    assert err == "error: --to 'nobody' is not an address\n"
    err = _one_line_error(*run("token", "mint", usd.address, "1")[::2])
    assert err == "error: no key: pass --key or set DTRAIN_KEY\n"
    err = _one_line_error(*run("token", "balance", usd.address)[::2])
    assert "--account or --key" in err
    assert usd.balance_of(accounts[4].address) == 0

"""`dtrain gateway`: sell training jobs over x402 until Ctrl-C."""

from __future__ import annotations

import sys

import click

from dtrain.cli import Ctx, emit
from dtrain.errors import ConfigError
from dtrain_node.serve.cli import (
    facilitator_key_option,
    host_option,
    listen,
    port_option,
    serve_until_signal,
    url_host,
)


@click.command("gateway")
@host_option
@port_option(8402)
@click.option(
    "--token",
    required=True,
    help="The EIP-3009 token jobs are paid and escrowed in (allowed by the BSM's developer).",
)
@facilitator_key_option
@click.pass_obj
def gateway(ctx: Ctx, host: str, port: int, token: str, facilitator_key: str | None) -> None:
    """Sell training jobs over x402: `POST /jobs` with a job spec answers 402 with the payment
    requirements for its escrow in --token, paid to the --key account; retried with a valid
    payment (`PAYMENT-SIGNATURE` or `X-PAYMENT`), the gateway settles it, creates the job with
    that escrow for the payer (`createJobWithToken`) and answers the job id and transactions.

    \b
    Example:
      dtrain gateway --token 0x5FbD... --port 8402
      dtrain job submit --x402 http://127.0.0.1:8402 --price 0.01 --dataset corpus.txt
    """
    from dtrain.client import connect
    from dtrain.x402 import LocalFacilitator, Paywall, Token, install_multicall
    from dtrain_node.gateway.app import Gateway, create_app

    bsm = ctx.bsm()
    assert ctx.rpc_url is not None and ctx.key is not None  # ctx.bsm() checked both
    w3 = connect(ctx.rpc_url)
    coin = Token.read(w3, token)
    if not bsm.contract.functions.isPaymentToken(coin.address).call():
        raise ConfigError(
            f"token {coin.address} is not allowed for jobs by this BSM (the developer's "
            "setPaymentToken)"
        )
    install_multicall(w3)
    facilitator = LocalFacilitator(ctx.rpc_url, facilitator_key or ctx.key)
    app = create_app(Gateway(bsm, Paywall(facilitator, coin, bsm.sender)))
    sock = listen(host, port)
    url = f"http://{url_host(host)}:{sock.getsockname()[1]}"
    emit(
        ctx,
        {"url": url, "contract": bsm.address, "token": coin.address, "pay_to": bsm.sender},
        f"gateway for BSM {bsm.address} at {url}: jobs paid in {coin.name} over x402 to "
        f"{bsm.sender}; listening until Ctrl-C",
    )
    sys.stdout.flush()
    _log_requests()
    with sock:
        serve_until_signal(app, sock)
    emit(ctx, {"stopped": True}, "stopped the gateway")


def _log_requests() -> None:
    import logging

    from dtrain_node.serve.cli import LOG_FORMAT

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, "%Y-%m-%d %H:%M:%S"))
    log = logging.getLogger("dtrain.gateway")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

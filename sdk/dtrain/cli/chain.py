"""`dtrain chain`: a local development chain."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import asdict
from typing import Any

import click

from ..chain import LocalChain
from ..envfile import remove_env, write_env
from .root import EXAMPLES, Ctx, cli, emit, pass_ctx


@cli.group()
def chain() -> None:
    """Local development chain."""


@chain.command("up", epilog=f"Example: {EXAMPLES['chain_up']}")
@click.option("--accounts", default=10, show_default=True, help="Funded dev accounts.")
@click.option("--balance", default=10_000, show_default=True, help="Ether per account.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8545,
    show_default=True,
    help="Loopback port to listen on; 0 for a free one.",
)
@pass_ctx
def chain_up(ctx: Ctx, accounts: int, balance: int, port: int) -> None:
    """Start anvil on 127.0.0.1:PORT; print its URL and funded keys; run until Ctrl-C.

    Writes the env file (~/.dtrain/env, or $DTRAIN_ENV_FILE) with DTRAIN_RPC_URL and
    DTRAIN_CHAIN_ID, which every other command reads (`dtrain deploy` adds DTRAIN_CONTRACT), so
    other terminals need no --rpc-url or --contract; options and environment variables override
    it. The file is removed when the chain stops.
    """
    stop = {"now": False}

    def _stop(*_: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    with LocalChain(accounts=accounts, balance_ether=balance, port=port) as c:
        env = {"DTRAIN_RPC_URL": c.url, "DTRAIN_CHAIN_ID": str(c.chain_id)}
        try:
            path = write_env(env)
            data = {"url": c.url, "env_file": str(path)}
            data["accounts"] = [asdict(a) for a in c.accounts]
            lines = [
                f"anvil listening on {c.url}",
                f"wrote {path}: other dtrain commands use this chain (and the contract "
                "`dtrain deploy` adds there); Ctrl-C stops the chain and removes the file",
                "funded dev accounts:",
            ] + [f"  {a.address}  key {a.key}" for a in c.accounts]
            emit(ctx, data, "\n".join(lines))
            sys.stdout.flush()
            while not stop["now"] and c.running:
                time.sleep(0.2)
        except KeyboardInterrupt:
            pass
        finally:
            remove_env(c.url)

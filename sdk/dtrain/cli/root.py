"""The `dtrain` root group (its global options, see `dtrain.cli`) and what the command
groups share: the context, the reusable option types, the examples, JSON or human output, and
the parsing of token amounts, addresses and keys."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import click
from web3 import Web3

from .. import erc20
from ..client import BSM, connect, load_key
from ..envfile import env_path, read_env
from ..errors import ConfigError, DtrainError
from ..inputs import parse_amount, parse_duration
from ..units import format_eth

EXAMPLES = {
    "chain_up": "dtrain chain up --accounts 5",
    "deploy": "dtrain --rpc-url http://127.0.0.1:8545 --key 0x... deploy --min-stake 1ether",
    "register": (
        "dtrain operator register --stake 2ether --peer-key 0x<32 bytes> "
        "--addr /ip4/127.0.0.1/tcp/4001 --hardware cpu:2 --min-price 0.01ether"
    ),
    "submit": (
        "dtrain job submit --method sft --epochs 4 --steps 200 --sync 20 "
        "--operators 3:4 --price 0.05ether --epoch-duration 1h"
    ),
}


@dataclass
class Ctx:
    rpc_url: str | None
    contract: str | None
    key: str | None
    as_json: bool
    debug: bool

    def bsm(self, signing: bool = True) -> BSM:
        if not self.rpc_url:
            raise ConfigError(
                "no RPC URL: pass --rpc-url or set DTRAIN_RPC_URL (or start a local chain "
                "with `dtrain chain up`, which writes it to " + str(env_path()) + ")"
            )
        if not self.contract:
            connect(self.rpc_url)  # a wrong URL is the error to name, not the contract it hides
            raise ConfigError(
                "no contract: pass --contract or set DTRAIN_CONTRACT (`dtrain deploy` to a "
                "chain started by `dtrain chain up` writes it to " + str(env_path()) + ")"
            )
        if signing and not self.key:
            raise ConfigError("no key: pass --key or set DTRAIN_KEY")
        return BSM.attach(self.rpc_url, self.contract, self.key if self.key else None)


class Parsed(click.ParamType):
    """A value read by one of `dtrain.inputs`' parsers; a bad value is a one-line usage error."""

    def __init__(self, name: str, parse: Callable[[Any], int]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: Any, ctx: Any) -> int:
        try:
            return self._parse(value)
        except DtrainError as exc:
            self.fail(str(exc), param, ctx)


AMOUNT = Parsed("amount", parse_amount)
DURATION = Parsed("duration", parse_duration)


def _jsonable(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Enum):
        return value.name.lower()
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return value


def emit(ctx: Ctx, data: Any, human: str) -> None:
    if ctx.as_json:
        click.echo(json.dumps(_jsonable(data)))
    else:
        click.echo(human)


def _load_config(path: Path | None) -> dict[str, str]:
    if path is None:
        return {}
    try:
        return {k: str(v) for k, v in tomllib.loads(path.read_text()).items()}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from None


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rpc-url", envvar="DTRAIN_RPC_URL", help="JSON-RPC endpoint of the chain.")
@click.option("--contract", envvar="DTRAIN_CONTRACT", help="Address of the BSM.")
@click.option("--key", envvar="DTRAIN_KEY", help="Private key that signs transactions.")
@click.option(
    "--config",
    envvar="DTRAIN_CONFIG",
    type=click.Path(path_type=Path, dir_okay=False),
    help="TOML file with rpc_url, contract and key.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.pass_context
def cli(
    click_ctx: click.Context,
    rpc_url: str | None,
    contract: str | None,
    key: str | None,
    config: Path | None,
    as_json: bool,
    debug: bool,
) -> None:
    """Permissionless, paid, verifiable distributed training: operators, stakers and jobs.

    \b
    Examples:
      dtrain chain up
      dtrain --rpc-url URL --key KEY deploy
      dtrain job submit --method cpt --epochs 2 --price 0.01ether --operators 3:3
      dtrain --json job status 1
    """
    conf = _load_config(config)
    env = read_env()
    rpc = rpc_url or conf.get("rpc_url")
    if rpc is None or rpc == env.get("DTRAIN_RPC_URL"):
        # The env file's contract only on the env file's chain.
        rpc = rpc or env.get("DTRAIN_RPC_URL")
        contract = contract or conf.get("contract") or env.get("DTRAIN_CONTRACT")
    click_ctx.obj = Ctx(
        rpc_url=rpc,
        contract=contract or conf.get("contract"),
        key=key or conf.get("key"),
        as_json=as_json,
        debug=debug,
    )


pass_ctx = click.make_pass_decorator(Ctx)


def _job_unit(bsm: BSM, job_id: int) -> _TokenUnit | None:
    """The payment token job `job_id` is priced in (None: ether)."""
    token = bsm.job_token(job_id)
    return _TokenUnit.of(bsm, token) if token else None


def _fmt_in(unit: _TokenUnit | None, amount: int) -> str:
    return unit.format(amount) if unit else format_eth(amount)


def _price(text: str, unit: _TokenUnit | None) -> int:
    """--price in wei (an ether amount) or, for a token job, in the token's base units."""
    try:
        return erc20.parse_units(text, unit.decimals) if unit else parse_amount(text)
    except DtrainError as exc:
        raise click.BadParameter(str(exc), param_hint="--price") from None


@dataclass(frozen=True)
class _TokenUnit:
    """A payment token as the CLI reads and prints its amounts (its own decimals)."""

    address: str
    decimals: int
    symbol: str

    @classmethod
    def of(cls, bsm: BSM, token: str) -> _TokenUnit:
        try:
            Web3.to_checksum_address(token)
        except ValueError:
            raise click.BadParameter(f"not an address: {token!r}", param_hint="--token") from None
        return cls.read(bsm.w3, token)

    @classmethod
    def read(cls, w3: Web3, token: str) -> _TokenUnit:
        """The ERC-20 at `token` (`erc20.NotAnERC20`, one line, when there is none)."""
        return cls(*erc20.read_token(w3, token))

    def format(self, amount: int) -> str:
        return erc20.format_units(amount, self.decimals, self.symbol)


def _address(text: str, flag: str) -> str:
    if not Web3.is_address(text):
        raise ConfigError(f"{flag} {text!r} is not an address")
    return Web3.to_checksum_address(text)


def _hex32(text: str, flag: str) -> bytes:
    body = text.removeprefix("0x")
    try:
        raw = bytes.fromhex(body)
    except ValueError:
        raise click.BadParameter("not hex", param_hint=flag) from None
    if len(raw) != 32:
        raise click.BadParameter(f"expected 32 bytes, got {len(raw)}", param_hint=flag)
    return raw


def _key_address(ctx: Ctx) -> str:
    if not ctx.key:
        raise ConfigError("give an ADDRESS or --key")
    return load_key(ctx.key).address

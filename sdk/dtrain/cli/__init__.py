"""`dtrain`: the command line over the SDK.

Global options (or env vars DTRAIN_RPC_URL, DTRAIN_CONTRACT, DTRAIN_KEY, or a TOML file given
by --config / DTRAIN_CONFIG with keys rpc_url, contract, key, or last the env file that `dtrain
chain up` and `dtrain deploy` write, see `dtrain.envfile`) pick the chain, the contract and
the signing key. `--json` prints machine-readable output. Errors print one line and exit 1;
`--debug` shows the traceback. Installed packages add commands through the `dtrain.cli` entry
point group: each entry is a function called with the root group (the node adds `dtrain node
...` and `dtrain job fetch`).
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import entry_points

import click
import requests

from ..client import BSM, connect
from ..errors import DtrainError

# Each command group's module registers its commands on `cli` when imported.
from . import chain, deploy, files, job, job_submit, operator, rewards, stake, token  # noqa: F401
from .root import AMOUNT, Ctx, Parsed, _price, _TokenUnit, cli, emit


def _load_plugins() -> None:
    """Each `dtrain.cli` entry point is a function that adds commands to the CLI."""
    for ep in entry_points(group="dtrain.cli"):
        try:
            ep.load()(cli)
        except ImportError as exc:  # an extra that is not fully installed
            click.echo(f"warning: commands {ep.name!r} unavailable: {exc}", err=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    negative = next((a for a in args if re.match(r"-[0-9.]", a)), None)
    if negative is not None:
        # Click would read "-1ether" as options (-1 -e -t -h ...), so name the problem here.
        click.echo(f"error: cannot read amount {negative!r}: amounts are never negative", err=True)
        return 2
    _load_plugins()
    if not debug:
        _quiet_library_logs()
    try:
        cli.main(args=args, prog_name="dtrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except DtrainError as exc:
        if debug:
            raise
        click.echo(f"error: {exc}", err=True)
        return 1
    except (requests.exceptions.RequestException, OSError) as exc:
        if debug:
            raise
        click.echo(f"error: RPC unreachable ({type(exc).__name__})", err=True)
        return 1
    except Exception as exc:
        if debug:
            raise
        first = (str(exc).strip().splitlines() or [""])[0]
        first = first if len(first) <= 300 else first[:300] + "..."
        click.echo(f"error: {type(exc).__name__}: {first} (rerun with --debug)", err=True)
        return 1
    return 0


def _quiet_library_logs() -> None:
    """Libraries' log records (libp2p logs each failed dial as an error) stay out of the
    terminal: without a handler Python prints WARNING and above to stderr. Commands say what
    went wrong in their one error line; `--debug` shows everything. A command that logs (`dtrain
    node run`) installs its own handlers."""
    import logging

    root = logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.NullHandler())


__all__ = [
    "AMOUNT",
    "BSM",
    "Ctx",
    "Parsed",
    "_TokenUnit",
    "_load_plugins",
    "_price",
    "cli",
    "connect",
    "emit",
    "main",
]

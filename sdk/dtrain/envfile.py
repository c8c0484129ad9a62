"""The env file `dtrain chain up` writes and every command reads: where the local chain is.

`dtrain chain up` writes `DTRAIN_RPC_URL` and `DTRAIN_CHAIN_ID`, `dtrain deploy` to that chain
adds `DTRAIN_CONTRACT`, and `chain up` removes the file when the chain stops (its state goes
with it). The file is `~/.dtrain/env` unless `DTRAIN_ENV_FILE` names another; its lines are
`export NAME=value`, so a shell can `source` it too. Explicit options, environment variables and
a `--config` file all override it.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError


def env_path() -> Path:
    """`$DTRAIN_ENV_FILE`, else `~/.dtrain/env`."""
    named = os.environ.get("DTRAIN_ENV_FILE")
    return Path(named).expanduser() if named else Path.home() / ".dtrain" / "env"


def read_env(path: Path | None = None) -> dict[str, str]:
    """NAME -> value of the env file; empty when there is none."""
    path = path or env_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    out = {}
    for line in text.splitlines():
        line = line.strip().removeprefix("export ").strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        name, _, value = line.partition("=")
        out[name.strip()] = value.strip().strip("'\"")
    return out


def write_env(values: dict[str, str], path: Path | None = None) -> Path:
    """Writes (replaces) the env file with `values`; returns its path."""
    path = path or env_path()
    lines = ["# written by `dtrain chain up` and `dtrain deploy`; removed when the chain stops"]
    lines += [f"export {k}={v}" for k, v in values.items()]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc}") from None
    return path


def update_env(rpc_url: str, path: Path | None = None, **values: str) -> Path | None:
    """Adds `values` to the env file if it describes the chain at `rpc_url`; its path if so."""
    path = path or env_path()
    current = read_env(path)
    if current.get("DTRAIN_RPC_URL") != rpc_url:
        return None
    return write_env({**current, **values}, path)


def remove_env(rpc_url: str, path: Path | None = None) -> None:
    """Removes the env file if it still describes the chain at `rpc_url`."""
    path = path or env_path()
    if read_env(path).get("DTRAIN_RPC_URL") == rpc_url:
        path.unlink(missing_ok=True)

"""A local anvil chain that always stops: the embedded default when no RPC URL is given."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .errors import ConfigError, RpcUnavailable

_REPO_ANVIL = (
    Path(__file__).resolve().parents[2]
    / "scripts/toolchain/node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"
)
_LISTENING = re.compile(r"Listening on ([0-9.]+):(\d+)")
_KEY = re.compile(r"\(\d+\) (0x[0-9a-fA-F]{64})")
_ADDR = re.compile(r"\(\d+\) (0x[0-9a-fA-F]{40})")


def find_anvil() -> str:
    """The native anvil binary: $DTRAIN_ANVIL, the repo's npm toolchain, or PATH."""
    for candidate in (os.environ.get("DTRAIN_ANVIL"), str(_REPO_ANVIL), shutil.which("anvil")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    raise ConfigError("anvil not found: run 'make setup' or set DTRAIN_ANVIL")


@dataclass(frozen=True)
class DevAccount:
    address: str
    key: str


class LocalChain:
    """Starts anvil on a loopback port (`port`, default a free one) and stops it on exit,
    errors and Ctrl-C.

    Its stdout goes to a file (anvil blocks on a full pipe) that is polled for the
    "Listening on" line and the funded dev accounts.
    """

    def __init__(
        self,
        accounts: int = 10,
        balance_ether: int = 10_000,
        block_time: float | None = None,
        chain_id: int = 31337,
        startup_timeout: float = 20.0,
        port: int = 0,
    ) -> None:
        self.accounts_requested = accounts
        self.balance_ether = balance_ether
        self.block_time = block_time
        self.chain_id = chain_id
        self.startup_timeout = startup_timeout
        self.port = port  # 0: a free port
        self.url = ""
        self.accounts: list[DevAccount] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def start(self) -> LocalChain:
        self._dir = tempfile.TemporaryDirectory(prefix="dtrain-anvil-")
        log = Path(self._dir.name) / "anvil.log"
        cmd = [
            find_anvil(),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--accounts",
            str(self.accounts_requested),
            "--balance",
            str(self.balance_ether),
            "--chain-id",
            str(self.chain_id),
        ]
        if self.block_time:
            cmd += ["--block-time", str(self.block_time)]
        with open(log, "wb") as out:
            self._proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            text = log.read_text(errors="replace")
            m = _LISTENING.search(text)
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                keys = _KEY.findall(text)
                addrs = _ADDR.findall(text)
                self.accounts = [DevAccount(a, k) for a, k in zip(addrs, keys, strict=False)]
                return self
            if self._proc.poll() is not None:
                self.stop()
                if "address already in use" in text.lower():
                    raise ConfigError(
                        f"port {self.port} is in use (another chain running?): stop it, or "
                        "pass --port 0 for a free port"
                    )
                raise RpcUnavailable(f"anvil exited at start: {text.strip()[-300:]}")
            time.sleep(0.05)
        self.stop()
        raise RpcUnavailable(f"anvil did not listen within {self.startup_timeout}s")

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except KeyboardInterrupt:  # a second Ctrl-C while it stops: never leave it running
                proc.kill()
                proc.wait()
                raise
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def __enter__(self) -> LocalChain:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

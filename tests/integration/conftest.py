"""A real anvil for the whole session; each test runs in an EVM snapshot reverted after it."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest
from harness.chain import ETH, revert

from dtrain.chain import DevAccount, LocalChain
from dtrain.client import BSM, NONCES, Receipt
from dtrain.models import Params
from dtrain.votes import commitment_hash, new_salt


@pytest.fixture(scope="session")
def chain() -> Iterator[LocalChain]:
    with LocalChain(accounts=12) as c:
        yield c


@pytest.fixture(scope="session")
def accounts(chain: LocalChain) -> list[DevAccount]:
    return chain.accounts


@pytest.fixture(scope="session")
def deployed(chain: LocalChain, accounts: list[DevAccount]) -> BSM:
    params = Params(
        treasury=accounts[10].address,
        developer=accounts[11].address,
        core=accounts[9].address,
        min_stake=ETH,
        unbonding_period=86400,
        challenge_window=0,  # certified is final: the challenge game has its own tests
        seat_draw_window=0,  # first joiners are seated: the draw has its own tests
    )
    return BSM.deploy(chain.url, accounts[0].key, params)


@pytest.fixture
def bsm(deployed: BSM) -> Iterator[BSM]:
    w3 = deployed.w3
    snap = w3.provider.make_request("evm_snapshot", [])["result"]
    NONCES.forget()
    try:
        yield deployed
    finally:
        revert(w3, snap)
        NONCES.forget()


@pytest.fixture
def as_account(bsm: BSM, accounts: list[DevAccount]):
    def _as(i: int) -> BSM:
        return bsm.with_account(accounts[i].key)

    return _as


# The sha256 of the transcript file every vote cast here names (no node made one).
TRANSCRIPT = bytes.fromhex("7e" * 32)


class Votes:
    """Commit-reveal votes as a member casts them, remembering each vote's salt."""

    def __init__(self) -> None:
        self._votes: dict[tuple[str, int, int], tuple[bytes, list[int], bytes, bytes]] = {}

    def commit(
        self, op: BSM, job_id: int, epoch: int, checkpoint: bytes, participation: Sequence[int]
    ) -> Receipt:
        salt, transcript = new_salt(), TRANSCRIPT
        c = commitment_hash(job_id, epoch, op.sender, checkpoint, participation, transcript, salt)
        rc = op.commit_checkpoint(job_id, epoch, c)  # a refused commitment replaces no vote
        self._votes[(op.sender, job_id, epoch)] = (
            checkpoint,
            list(participation),
            transcript,
            salt,
        )
        return rc

    def vote_of(self, op: BSM, job_id: int, epoch: int) -> tuple[bytes, list[int], bytes, bytes]:
        """(checkpoint, participation, transcript, salt) `op` committed to."""
        return self._votes[(op.sender, job_id, epoch)]

    def reveal(self, op: BSM, job_id: int, epoch: int) -> Receipt:
        return op.reveal_checkpoint(job_id, epoch, *self.vote_of(op, job_id, epoch))

    def cast(
        self,
        ops: Sequence[BSM],
        job_id: int,
        epoch: int,
        checkpoint: bytes,
        participation: Sequence[int],
    ) -> list[Receipt]:
        """Every op commits, then every op reveals (reveals open once all members committed)."""
        for op in ops:
            self.commit(op, job_id, epoch, checkpoint, participation)
        return [self.reveal(op, job_id, epoch) for op in ops]


@pytest.fixture
def run(chain, bsm, capsys):
    """Runs `dtrain` in-process with --rpc-url and --contract set (none with raw=True);
    returns (code, out, err)."""
    from dtrain.cli import main

    def _run(*args: str, key: str | None = None, raw: bool = False):
        argv = [] if raw else ["--rpc-url", chain.url, "--contract", bsm.address]
        if key:
            argv += ["--key", key]
        code = main([*argv, *args])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return _run


@pytest.fixture
def votes() -> Votes:
    return Votes()


@pytest.fixture(autouse=True)
def _own_env_file(tmp_path_factory, monkeypatch) -> None:
    """Every test reads and writes its own `dtrain chain up` env file, never ~/.dtrain/env."""
    monkeypatch.setenv("DTRAIN_ENV_FILE", str(tmp_path_factory.mktemp("env") / "env"))

"""The referee's schedule on the chain's clock: its re-execution runs while the apply phase
does, so a slow machine has the apply and the commit phase for it, and each file's work is done
once across its passes (the work is stubbed; the order and the clock are what is tested)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from dtrain.errors import RpcUnavailable, TransactionFailed
from dtrain_node.operator.referee_service import Case, Memo, RefereeService

WINDOW, OPENED, WORK_S = 30, 1_000, 40  # one pass of re-execution outlasts the apply phase
ME = "0x" + "ab" * 20


class Chain:
    """A challenge opened at OPENED with this referee drawn; records when each phase's
    transaction is taken. The chain's clock is a second behind the wall clock: the first
    commit and the first reveal, sent as the wall clock opens their phase, revert."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.sent, self.refused = clock, {}, []
        self.ch = SimpleNamespace(resolved=False, seed_block=0, opened_at=OPENED, referees=[ME])
        self.ch.committed = self.ch.revealed = 0

    def challenge_of(self, attempt: int) -> SimpleNamespace:
        return self.ch

    def _behind(self, phase: str) -> None:
        if phase not in self.refused:
            self.refused.append(phase)
            raise TransactionFailed("transaction 0x.. reverted")

    def commit_verdict(self, *args, gas: int) -> None:
        assert self.clock[0] < OPENED + 2 * WINDOW, "the commit phase had closed"
        self._behind("commit")
        self.sent["commit"] = self.clock[0]
        self.ch.committed = 1

    def reveal_verdict(self, *args, gas: int) -> None:
        self._behind("reveal")
        self.sent["reveal"] = self.clock[0]
        self.ch.revealed = 1

    def resolve_challenge(self, *args, gas: int) -> None:
        self.sent["resolve"] = self.clock[0]


def referee(clock: list[float], passes: list[float]) -> RefereeService:
    svc = RefereeService.__new__(RefereeService)
    svc.bsm, svc.me, svc.window = Chain(clock), ME, WINDOW
    svc._sealed, svc._committed, svc._memos = {}, set(), {}
    svc.metrics = []
    svc.metric = lambda kind, **kw: svc.metrics.append((kind, kw))

    def verdict(
        case: Case, memo: Memo, fetch_by: float
    ) -> tuple[bytes, tuple[int, ...], list[int], list[int]]:
        assert fetch_by == OPENED + 1.5 * WINDOW  # the commit phase's second half re-executes
        passes.append(clock[0])
        memo.once("the members' file", lambda: clock.__setitem__(0, clock[0] + WORK_S), "files")
        return b"\x01" * 32, (2, 2), [0], []

    def until(stop: threading.Event, cond) -> None:
        while not cond():
            clock[0] += 1.0

    svc._verdict, svc._until, svc._now = verdict, until, lambda: clock[0]
    return svc


def test_a_referee_slower_than_the_apply_phase_still_commits_in_the_commit_phase() -> None:
    """And a phase's transaction the chain refused at the phase's first second is sent again
    (the chain's blocks are dated by its own clock)."""
    clock, passes = [OPENED + 1.0], []
    svc = referee(clock, passes)
    case = Case(1, 0, 3, "challenger", b"\x02" * 32, ("a", "b"), b"\x00" * 32)
    svc.judge(case, threading.Event())
    assert passes[0] < OPENED + WINDOW  # began while the apply phase ran
    assert passes[1] >= OPENED + WINDOW  # and looked again once members could name no more
    assert OPENED + WINDOW <= svc.bsm.sent["commit"] < OPENED + 2 * WINDOW
    assert set(svc.bsm.sent) == {"commit", "reveal", "resolve"}  # each sent again once refused
    assert svc.bsm.refused == ["commit", "reveal"]
    [v] = [kw for kind, kw in svc.metrics if kind == "verdict"]
    assert v["reexecuted"] == 1  # the second pass found the first pass's work
    assert not [m for m in svc.metrics if m[0] == "referee_late"]


def test_a_memo_does_each_piece_of_work_once() -> None:
    memo, runs = Memo(), []
    for _ in range(3):
        assert memo.once(b"f", lambda: runs.append(1) or "led", "files") == "led"
    assert memo.once(frozenset({b"f"}), lambda: None, "unions") is None
    assert memo.once(frozenset({b"f"}), lambda: runs.append(2), "unions") is None  # None kept
    assert memo.once("unworkable", lambda: None) is None  # counted nowhere
    with pytest.raises(ValueError):
        memo.once(b"g", lambda: int("x"), "files")
    assert memo.once(b"g", lambda: "led", "files") == "led"  # an exception was not kept
    assert (runs, memo.files, memo.unions) == ([1], 2, 1)


class Draw:
    """A challenge whose seed block (7) is not mined yet, on a chain that mines only on
    transactions (head 6): the first draw lands in the seed block and reverts (mining it), the
    next draws `drawn`."""

    def __init__(self, drawn: list[str]) -> None:
        self.ch = SimpleNamespace(resolved=False, seed_block=7, referees=())
        self.drawn, self.tries = drawn, 0
        self.w3 = SimpleNamespace(eth=SimpleNamespace(block_number=6))

    def challenge_of(self, attempt: int) -> SimpleNamespace:
        return self.ch

    def draw_referees(self, job_id: int, epoch: int, gas: int) -> None:
        self.tries += 1
        self.w3.eth.block_number += 1  # every transaction mines a block
        if self.w3.eth.block_number <= self.ch.seed_block:
            raise TransactionFailed("transaction 0x.. reverted: SeedNotMined(7, 7)")
        self.ch.seed_block, self.ch.referees = 0, tuple(self.drawn)


@pytest.mark.parametrize(("drawn", "judges"), [([ME], True), (["0x" + "cd" * 20], False)])
def test_a_referee_draws_once_the_seed_block_exists_and_judges_only_if_drawn(
    drawn: list[str], judges: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dtrain_node.operator import referee_service

    monkeypatch.setattr(referee_service, "STALL_S", 0.0)  # the head never moves by itself
    svc = RefereeService.__new__(RefereeService)
    svc.bsm, svc.me, svc.window = Draw(drawn), ME, WINDOW
    svc.metrics = []
    svc.metric = lambda kind, **kw: svc.metrics.append(kind)
    case = Case(1, 0, 3, "0x" + "ef" * 20, b"\x00" * 32, (), b"\x00" * 32)
    assert svc._drawn(case, threading.Event()) is judges
    assert svc.bsm.tries == 2, "one try mined the seed block, the next drew"
    assert svc.metrics == ["referee_drawn" if judges else "referee_not_drawn"]


def test_on_a_chain_that_mines_by_itself_the_draw_waits_for_the_seed_block() -> None:
    """Head below the seed block and moving: no transaction is sent until the seed block is
    the head (a try before it would only revert)."""
    svc = RefereeService.__new__(RefereeService)
    chain = Draw([ME])
    heads = iter([6, 6, 7, 7])
    seen: list[int] = []

    class Eth:
        @property
        def block_number(self) -> int:
            seen.append(next(heads, 8))
            return seen[-1]

    chain.w3 = SimpleNamespace(eth=Eth())
    sent: list[int] = []

    def draw(*args: object, gas: int) -> None:
        sent.append(seen[-1])
        chain.ch.seed_block = 0

    chain.draw_referees = draw
    chain.ch.referees = (ME,)
    svc.bsm, svc.me, svc.window = chain, ME, WINDOW
    svc.metric = lambda kind, **kw: None
    case = Case(1, 0, 3, "0x" + "ef" * 20, b"\x00" * 32, (), b"\x00" * 32)
    assert svc._drawn(case, threading.Event())
    assert sent == [7], "one transaction, once the seed block was the head"


def test_an_rpc_that_stops_answering_for_a_while_does_not_end_the_referee() -> None:
    """A referee that exits when its RPC stops answering for a few seconds misses the commit
    of a challenge it was drawn for and is slashed for dropout: it polls again instead, and
    still takes up the challenge that opened meanwhile."""
    stop, judged, polls = threading.Event(), [], []

    class Eth:
        @property
        def block_number(self) -> int:
            polls.append(1)
            if len(polls) <= 3:
                raise RpcUnavailable("RPC unreachable: ConnectionError")
            return 10

    svc = RefereeService.__new__(RefereeService)
    svc.bsm = SimpleNamespace(w3=SimpleNamespace(eth=Eth()))
    svc.done = set()
    svc._challenged = lambda first, last: [SimpleNamespace(first=first, last=last)]
    svc._case = lambda e: Case(7, 0, 1, ME, b"", (), b"")

    def judge(case: Case, stop_: threading.Event) -> None:
        judged.append(case.job_id)
        stop.set()

    svc._judge_safely = judge
    svc.run(stop)
    assert len(polls) == 4 and judged == [7]


def test_an_rpc_failure_mid_case_reveals_the_verdict_committed_before_it() -> None:
    """A drawn referee whose RPC fails after it committed must still reveal (else it is slashed
    as a no-show): it takes the case up again, keeps the work done, does not commit a second
    time (the contract refuses that), and reveals the verdict and salt it committed to."""
    from dtrain import commitment_hash

    clock, passes = [OPENED + 1.0], []
    svc = referee(clock, passes)
    chain, commits, reveals = svc.bsm, [], []
    chain.refused = ["commit", "reveal"]  # the chain's clock is in step here
    failed = []

    def commit_verdict(job_id: int, epoch: int, c: bytes, gas: int) -> None:
        if commits:
            raise TransactionFailed("reverted: AlreadyCommitted")
        commits.append(c)
        chain.ch.committed = 1

    def reveal_verdict(*args, gas: int) -> None:
        if not failed:
            failed.append(1)
            raise RpcUnavailable("RPC unreachable: ConnectionError")
        reveals.append(args)
        chain.ch.revealed = 1

    chain.commit_verdict, chain.reveal_verdict = commit_verdict, reveal_verdict
    case = Case(1, 0, 3, "challenger", b"\x02" * 32, ("a", "b"), b"\x00" * 32)
    svc._judge_safely(case, threading.Event())
    assert failed and len(commits) == 1 and len(reveals) == 1
    job_id, epoch, checkpoint, participation, judged, salt = reveals[0]
    bits = judged.to_bytes(32, "big")
    assert commits[0] == commitment_hash(job_id, epoch, ME, checkpoint, participation, bits, salt)
    assert len(passes) == 4 and [kw for kind, kw in svc.metrics if kind == "verdict"]
    assert not [m for m in svc.metrics if m[0] in ("referee_failed", "referee_not_drawn")]


def test_a_file_stalled_to_the_deadline_leaves_a_posted_claim_time_to_be_fetched(
    tmp_path,
) -> None:
    """A colluder's vote names a file nobody has and stalls its fetch until the pass's
    deadline; the honest member's replay claim, posted later, is fetched beside it, not after
    it (fetched after it, it had no time left: one referee judged the claim, two did not)."""
    from dtrain_node.errors import CheckpointUnavailable
    from dtrain_node.verify import claims

    phantom, claim = b"\x0a" * 32, b"\x0c" * 32
    deadline, asked = [False], threading.Event()

    def fetch(sha: str, who: str, dest, within_s=None, max_bytes=None):
        if bytes.fromhex(sha) == phantom:
            asked.wait(timeout=30)  # stalls until the claim was asked for (or for good)
            deadline[0] = True
            raise CheckpointUnavailable(f"no peer delivered {sha} in 15 s")
        if deadline[0]:
            raise CheckpointUnavailable(f"no peer delivered {sha} in -0 s")
        dest.write_bytes(b"claim")
        asked.set()
        return dest

    said = claims.Claim(1, "0x", 1, 1, 0, "b", "a", 1, *[bytes(32)] * 3, b"")
    svc = RefereeService.__new__(RefereeService)
    job = SimpleNamespace(spec=SimpleNamespace(steps_per_epoch=8, sync_interval=2))
    svc.bsm = SimpleNamespace(job=lambda job_id: job)
    svc._read = lambda case, path: said if path.read_bytes() == b"claim" else "unreadable"
    case = Case(1, 0, 1, "a", b"\x02" * 32, ("a", "b"), b"\x00" * 32)
    named = {phantom: {"b"}, claim: {"a"}}
    files, found, start = svc._evidence(case, named, {phantom}, fetch, tmp_path, Memo())
    assert found == [said] and files == {} and start is None

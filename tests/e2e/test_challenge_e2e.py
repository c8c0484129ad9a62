"""End to end: a coalition holding 2/3 of a job's seats certifies a fabricated checkpoint; the
one honest member challenges it, referees outside the job re-execute the epoch from its signed
transcript, and the epoch settles on their verdict (real anvil, node and referee processes,
libp2p and training)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from harness.flaky_rpc import FAULTS, flaky_rpc
from test_caller_files import RECIPE, Output, sft_chat

from dtrain import UNWORKABLE, commitment_hash, vote_key
from dtrain.models import SlashReason
from dtrain_node.devnet import ETH, Cluster
from dtrain_node.devnet.plan import node_name
from dtrain_node.p2p.files import sha256_file
from dtrain_node.train.toy_models import save
from dtrain_node.verify import spotcheck

pytestmark = pytest.mark.slow

WINDOW = 30  # seconds: each phase of a challenge (referees drawn and re-execute, commit, reveal)
ROUNDS = 4


def _worth(c: Cluster, address: str) -> int:
    """Ether `address` holds in the BSM: credit, self-stake and staking rewards."""
    b = c.bsm
    return b.credit_of(address) + b.stake_of(address, address) + b.pending_rewards(address, address)


def _kept(c: Cluster, events: list) -> int:
    """The challenge bond less the referees' pay: the referees that revealed the verdict
    share half of it; without a verdict a quarter goes to the treasury instead."""
    bond = c.bsm.params().challenge_bond
    (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
    key = bytes(resolved["verdictKey"])
    if not any(key):
        return bond - bond // 4
    revealed = Counter(
        (bytes(e.args["voteKey"]), e.args["findings"])
        for e in events
        if e.name == "VerdictRevealed"
    )
    n = max(count for (k, _), count in revealed.items() if k == key)
    return bond - bond // 2 // n * n


def _overturned(
    c: Cluster,
    honest: list[int],
    coalition: list[int],
    reason: SlashReason,
    phantoms: int = 0,
    replayed: frozenset[str] = frozenset(),
) -> None:
    """The job completed on the honest members' vote after a challenge by one of them: the
    referees revealed it, the coalition was slashed for `reason` (`FailedReplay` for those
    in `replayed`, caught by a replay claim) and unpaid, every honest member was paid and kept
    its stake, and the contract's balance equals its accounting. `phantoms`: voters' files
    nobody has (never re-executed)."""
    b = c.bsm
    assert b.job(c.job_id).state.status.name == "COMPLETED"
    events = b.events(job_id=c.job_id)
    votes = {
        (m["checkpoint"], tuple(m["participation"]))
        for i in honest
        for m in c.metrics(i)
        if m["kind"] == "epoch_trained"
    }
    ((checkpoint, participation),) = votes  # one honest vote
    (challenged,) = [e.args for e in events if e.name == "Challenged"]
    assert challenged["challenger"] in {c.ops[i].address for i in honest}
    (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
    assert resolved["overturned"]
    assert bytes(resolved["verdictKey"]) == vote_key(bytes.fromhex(checkpoint), participation)
    (finalized,) = [e.args for e in events if e.name == "EpochFinalized"]
    assert bytes(finalized["checkpoint"]).hex() == checkpoint
    verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
    assert verdicts and {v["checkpoint"] for v in verdicts} == {checkpoint}
    # each distinct voter's file once, across the referee's two passes, and a union
    files = {
        bytes(e.args["transcript"])
        for e in events
        if e.name == "CheckpointRevealed" and bytes(e.args["voteKey"]) != UNWORKABLE
    }
    want = len(files - {bytes(32)}) - phantoms
    assert {v["reexecuted"] for v in verdicts} == {want}, verdicts
    assert all(v["unions"] >= 1 for v in verdicts), verdicts
    slashed = sorted(
        (e.args["operator"], SlashReason(e.args["reason"])) for e in events if e.name == "Slashed"
    )
    want = [(c.ops[i].address, reason) for i in coalition]
    want = [(a, SlashReason.FAILED_REPLAY if a in replayed else r) for a, r in want]
    assert slashed == sorted(want)
    paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
    assert paid == sorted(c.ops[i].address for i in honest)
    for i in coalition:
        assert _worth(c, c.ops[i].address) < ETH, "a coalition member ends with less"
    for i in honest:
        assert b.pool(c.ops[i].address).total_assets == ETH, "no honest member lost stake"
    assert b.credit_of(challenged["challenger"]) >= _kept(c, events), "bond back, less the pay"
    assert b.w3.eth.get_balance(b.address) == b.accounting().total


def _caught_by_replay(c: Cluster, cheat: str, honest: set[str]) -> None:
    """An honest checker challenged with its claim, every referee caught `cheat` by replay:
    it alone is slashed (`FailedReplay`) and unpaid, the checkpoint stands, the honest members
    are paid and keep their stake, the checker gets its bond back, the wei add up."""
    b = c.bsm
    events = b.events(job_id=c.job_id)
    (challenged,) = [e.args for e in events if e.name == "Challenged"]
    assert challenged["challenger"] in honest
    (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
    assert not resolved["overturned"], "the checkpoint stands"
    verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
    assert verdicts and all(v["caught"] == [cheat] for v in verdicts)
    slashed = [(e.args["operator"], e.args["reason"]) for e in events if e.name == "Slashed"]
    assert slashed == [(cheat, SlashReason.FAILED_REPLAY)]
    paid = {e.args["operator"] for e in events if e.name == "OperatorPaid"}
    assert paid == honest and b.credit_of(cheat) == 0
    price = c.spec.price_per_operator_epoch
    assert b.credit_of(challenged["challenger"]) == price * 40 // 100 + _kept(c, events)
    for a in honest:
        assert b.pool(a).total_assets == ETH
    assert b.pool(cheat).total_assets < ETH
    assert b.w3.eth.get_balance(b.address) == b.accounting().total


def _two_colluders_and_referees(c: Cluster, *faults: str) -> None:
    """Three referees, members 0 and 1 colluding (with `faults` too), member 2 honest; until
    the job ends."""
    for r in range(3):
        c.spawn_referee(r)
    c.spawn(0, ["collude", *faults])
    c.spawn(1, ["collude", *faults])
    c.spawn(2)
    c.wait(c.ended, 1000, "the job to end")


def _cluster(
    tmp_path, operators: int, steps: int, window: int = WINDOW, epoch_duration: int = 240
) -> Cluster:
    return Cluster(
        tmp_path,
        operators=operators,
        epochs=1,
        steps=steps,
        sync=2,
        round_deadline=4.0,
        epoch_duration=epoch_duration,
        challenge_window=window,
        referees=3,
    )


@pytest.mark.timeout(1200)
def test_two_sybils_certify_a_fabrication_and_one_honest_member_overturns_it(tmp_path) -> None:
    """Two colluding members of three (1 ETH each, the minimum) vote one fabricated checkpoint,
    a quorum. The honest member's node sees that the certified vote is not its own and
    challenges; three referee nodes are drawn, fetch its transcript over p2p, re-execute it and
    reveal the honest member's vote; the epoch settles on it: the colluders are slashed for
    fabrication and unpaid, the honest member is paid and gets its bond back."""
    with _cluster(tmp_path, 3, 8) as c:
        _two_colluders_and_referees(c)
        _overturned(c, [2], [0, 1], SlashReason.FABRICATION)


@pytest.mark.timeout(1200)
def test_two_sybils_that_name_files_nobody_has_and_stall_every_fetch_are_still_overturned(
    tmp_path,
) -> None:
    """The two colluders of three seats name transcript files nobody has and answer every file
    request "found" and then send nothing, so that each file and colluder costs a referee the
    fetch's idle timeout (a minute: four of them, past the commit phase). The referees fetch
    every file at once, each from its namers first, all within half a window: they still
    commit in time and the honest member's vote stands. The epoch is the shortest the chain
    allows: the honest member's spot check of a colluder's state, stalled the same way, ends
    at the state's deadline (one for every try), in time for its vote; its "withheld" claim
    has the referees ask for the state themselves: a colluder's state of a round after the
    first nobody else holds, and it is caught by replay; round 0's is every member's start
    state (the same bytes), which the honest member serves, and the replay clears it."""
    with _cluster(tmp_path, 3, 8, epoch_duration=60) as c:
        _two_colluders_and_referees(c, "stall")
        claimed = [m for m in c.metrics(2) if m["kind"] == "replay_claim"]
        assert {m["reason"] for m in claimed} <= {"withheld"}
        assert {m["member"] for m in claimed} <= {c.ops[0].address, c.ops[1].address}
        verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
        found = {tuple(k.split("/")[:2]): v for k, v in verdicts[0]["claims"].items()}
        assert all(v["claims"] == verdicts[0]["claims"] for v in verdicts)
        assert sorted(found) == sorted((m["member"], str(m["round"])) for m in claimed)
        assert all(v == ("honest" if r == "0" else "caught") for (_, r), v in found.items())
        caught = frozenset(m for (m, _), v in found.items() if v == "caught")
        _overturned(c, [2], [0, 1], SlashReason.FABRICATION, phantoms=2, replayed=caught)
        assert not [m for m in c.metrics(2) if m["kind"] == "replay_claims_dropped"]


@pytest.mark.timeout(1200)
def test_a_challenged_job_goes_through_an_rpc_that_spoils_one_request_in_five(tmp_path) -> None:
    """Every RPC request of the caller (`job submit --serve`, `job watch`), the members and the
    referees goes through a proxy that spoils one in five, in turn dropped, its answer lost
    (a transaction sent is in, its sender never hears so) or answered 2 s late. Two colluders
    of three seats certify a fabrication of the caller's own SFT job: the honest member still
    challenges, the referees still judge, the caller's files are still served until the job
    ends, and everything settles as on a clean RPC, each retry said in one line."""
    model, data = save("gpt2", tmp_path / "my-model"), sft_chat(tmp_path / "sft.jsonl")
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(RECIPE)
    env = {**os.environ, "HOME": str(tmp_path / "caller-home")}
    cluster = Cluster(
        tmp_path, 3, create_job=False, challenge_window=WINDOW, referees=3, round_deadline=8.0
    )
    with cluster as c, flaky_rpc(c.chain.url, 5, FAULTS) as (url, counts):
        c.node_rpc = url
        base = [sys.executable, "-m", "dtrain.cli", "--rpc-url", url]
        base += ["--contract", c.bsm.address, "--key", c.caller.key]
        args = ["job", "submit", "--method", "sft", "--model-uri", str(model)]
        args += ["--dataset-uri", str(data), "--recipe", str(recipe), "--serve"]
        args += ["--serve-port", "0", "--operators", "3:3", "--steps", "6", "--sync", "2"]
        args += ["--price", "0.01ether", "--epoch-duration", "4m"]
        spawned = []
        try:
            submit = _popen([*base, *args], env)
            spawned.append(submit)
            c.job_id = int(Output(submit).wait_for(r"job (\d+) created", 300).group(1))
            watch = _popen([*base, "job", "watch", str(c.job_id)], env)
            spawned.append(watch)
            watched = Output(watch)
            _two_colluders_and_referees(c)
            assert submit.wait(timeout=120) == 0, "the caller stops serving once the job ended"
            assert watch.wait(timeout=120) == 0, "\n".join(watched.lines)
        finally:
            for p in spawned:
                if p.poll() is None:
                    p.kill()
        _overturned(c, [2], [0, 1], SlashReason.FABRICATION)
        assert any("COMPLETED" in line.upper() for line in watched.lines), watched.lines
    assert min(counts[k] for k in FAULTS) >= 10, counts
    retried = [p.name for p in c.procs if "failed (" in (p.data_dir / "stdout.log").read_text()]
    assert len(retried) >= 4, retried  # members and referees said so, and went on


def _popen(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip


@pytest.mark.timeout(1200)
def test_a_callers_sybil_majority_votes_unworkable_and_the_honest_member_is_paid(tmp_path) -> None:
    """The caller's two sybils hold 2 of 3 seats, train, and vote UNWORKABLE to abort the job
    and get the escrow back. The honest member challenges; the referees show the epoch trained:
    the sybils are slashed as dropouts with no compensation, the honest member is paid, and the
    caller gets back only the seats nobody earned."""
    with _cluster(tmp_path, 3, 8) as c:
        for r in range(3):
            c.spawn_referee(r)
        c.spawn(0, ["unworkable"])
        c.spawn(1, ["unworkable"])
        c.spawn(2)
        c.wait(c.ended, 1000, "the job to end")
        _overturned(c, [2], [0, 1], SlashReason.DROPOUT)
        events = c.bsm.events(job_id=c.job_id)
        assert not [e for e in events if e.name == "JobAborted"]
        (done,) = [e.args for e in events if e.name == "JobCompleted"]
        assert done["refund"] == 2 * c.spec.price_per_operator_epoch


@pytest.mark.timeout(1500)
def test_five_of_seven_seats_certify_a_fabrication_and_one_honest_member_overturns_it(
    tmp_path,
) -> None:
    """A coalition of 5 of 7 seats (over 2/3) votes one fabricated checkpoint; one of the two
    honest members challenges, the referees re-execute, all five are slashed and the two
    honest members are paid. Its window is longer: a referee re-executes up to eight files
    (seven voters' and their union) within two of them, on a machine running ten nodes."""
    with _cluster(tmp_path, 7, 4, window=3 * WINDOW // 2) as c:
        for r in range(3):
            c.spawn_referee(r)
        for i in range(5):
            c.spawn(i, ["collude"])
        c.spawn(5)
        c.spawn(6)
        c.wait(c.ended, 1400, "the job to end")
        _overturned(c, [5, 6], list(range(5)), SlashReason.FABRICATION)


@pytest.mark.timeout(1200)
def test_a_challenge_with_a_doctored_transcript_loses_its_bond(tmp_path) -> None:
    """A member of an honest 4-member quorum challenges it with a transcript file that leaves
    every other member's packets out (re-executed alone it gives another checkpoint, and every
    honest member would be slashed). The honest members name their own files; the referees
    re-execute the union, uphold the certified vote, and the challenger's bond goes to the
    treasury; nobody is slashed and every member is paid."""
    with _cluster(tmp_path, 4, 8) as c:
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["doctor"])
        c.wait(c.ended, 1000, "the job to end")
        b = c.bsm
        assert b.job(c.job_id).state.status.name == "COMPLETED"
        events = _upheld_against(c, 3)
        posted = {e.args["member"] for e in events if e.name == "TranscriptPosted"}
        assert posted and posted <= {o.address for o in c.ops[:3]}
        price = c.spec.price_per_operator_epoch
        assert b.credit_of(c.ops[3].address) == price * 40 // 100, "paid, its bond not back"


def _upheld_against(c: Cluster, i: int | None, challenger: str = "") -> list:
    """Member `i` (or the outsider `challenger`) challenged an honest quorum and lost: the
    referees upheld the certified vote, nobody was slashed, every member was paid and kept its
    stake, and the contract's balance equals its accounting. Returns the job's events."""
    b = c.bsm
    events = b.events(job_id=c.job_id)
    (challenged,) = [e.args for e in events if e.name == "Challenged"]
    assert challenged["challenger"] == (c.ops[i].address if i is not None else challenger)
    (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
    assert not resolved["overturned"]
    assert bytes(resolved["verdictKey"]) == bytes(challenged["certifiedKey"])
    assert not [e for e in events if e.name == "Slashed"]
    paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
    assert paid == sorted(o.address for o in c.ops)
    for o in c.ops:
        assert b.pool(o.address).total_assets == ETH
    assert b.w3.eth.get_balance(b.address) == b.accounting().total
    return events


@pytest.mark.timeout(1200)
def test_the_caller_overturns_a_fabrication_by_every_member(tmp_path) -> None:
    """Every seat is a colluder's: no member challenges their fabricated quorum. The caller,
    an outsider with no transcript of its own, disputes it; the members name their files as
    any voter does, none of them leads to the fabricated checkpoint, and the referees' union
    does not either: every member is slashed and unpaid, the caller gets its bond and the whole
    escrow back."""
    with _cluster(tmp_path, 3, 8) as c:
        b = c.bsm
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i, ["collude"])
        c.wait(lambda: any(b.certified_vote(c.job_id)[0]), 600, "a certified vote")
        caller = b.with_account(c.caller.key)
        caller.challenge(c.job_id, 0, bytes(32))
        c.wait(c.ended, 900, "the job to end")
        events = b.events(job_id=c.job_id)
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        assert challenged["challenger"] == c.caller.address
        (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
        assert resolved["overturned"]
        slashed = sorted(
            (e.args["operator"], SlashReason(e.args["reason"]))
            for e in events
            if e.name == "Slashed"
        )
        assert slashed == sorted((o.address, SlashReason.FABRICATION) for o in c.ops)
        assert not [e for e in events if e.name == "OperatorPaid"]
        escrow = c.spec.price_per_operator_epoch * c.spec.max_operators * c.spec.total_epochs
        assert b.credit_of(c.caller.address) == escrow + _kept(c, events)
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


@pytest.mark.timeout(1200)
def test_a_challenge_with_a_packet_signed_after_the_epoch_loses_its_bond(tmp_path) -> None:
    """A member of an honest 4-member quorum challenges it with its transcript in which its
    round-0 packet is replaced by one it signed after the epoch (valid by its signature; united
    with the others' files it would drop the member from that round and make every honest vote
    look fabricated). A certified voter's own posted file leads to the certified vote, so the
    referees uphold it: the challenger loses its bond, nobody is slashed, everyone is paid."""
    with _cluster(tmp_path, 4, 8) as c:
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["inject"])
        c.wait(c.ended, 1000, "the job to end")
        events = _upheld_against(c, 3)
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        injected = sorted((c.tmp / node_name(3) / "jobs").glob("*/inject-*.bin"))
        assert injected and sha256_file(injected[0]) == bytes(challenged["transcript"])


@pytest.mark.timeout(1200)
def test_a_coalition_voting_its_own_file_without_the_honest_packets_pays_the_dissenter(
    tmp_path,
) -> None:
    """Two of three members leave the honest member's packets out of their transcript files
    after the epoch (as if they never got them) and vote what those files re-execute to, a
    quorum. Which packets reached whom in time is not provable, so the referees uphold the
    coalition's vote; but each vote named its own file, and the honest member's file leads to
    the honest member's vote: the referees find every voter consistent, the honest challenger
    is paid and gets its bond back, and nobody is slashed."""
    with _cluster(tmp_path, 3, 8) as c:
        b = c.bsm
        for r in range(3):
            c.spawn_referee(r)
        honest = c.ops[2].address
        c.spawn(0, [f"shun={honest}"])
        c.spawn(1, [f"shun={honest}"])
        c.spawn(2)
        c.wait(c.ended, 1000, "the job to end")
        events = b.events(job_id=c.job_id)
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        assert challenged["challenger"] == honest
        (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
        assert not resolved["overturned"], "the coalition's own file leads to its vote"
        files = {
            e.args["operator"]: bytes(e.args["transcript"])
            for e in events
            if e.name == "CheckpointRevealed"
        }
        assert len(files) == 3 and all(any(f) for f in files.values())
        assert files[c.ops[0].address] == files[c.ops[1].address] != files[honest]
        verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
        assert verdicts and all(
            set(v["consistent"]) == {o.address for o in c.ops} for v in verdicts
        )
        assert not [e for e in events if e.name == "Slashed"]
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops)
        for o in c.ops:
            assert b.pool(o.address).total_assets == ETH
        price = c.spec.price_per_operator_epoch
        assert b.credit_of(honest) == price * 40 // 100 + _kept(c, events), "paid, bond back"
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


@pytest.mark.timeout(1200)
def test_a_free_rider_caught_by_replay_is_slashed_through_a_challenge(
    tmp_path, monkeypatch
) -> None:
    """op4 of 4 trains round 0 and then re-sends that packet every round (`stale`): its
    packets are valid, the transcript holds them and its vote is the quorum's. Every round a
    member replays another's round from the private state it committed to (rate 1 here, the
    default is 0.1); op4's replays give other packets, so an honest checker challenges the
    certified vote with its signed claim. The referees replay the same round from op4's
    committed state and catch it: op4 is slashed (`FailedReplay`) and unpaid, the checkpoint
    stands, the honest members are paid, the checker gets its bond back, the wei add up."""
    monkeypatch.setenv(spotcheck.RATE_ENV, "1")  # inherited by the node processes
    with _cluster(tmp_path, 4, 8) as c:
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["stale"])
        c.wait(c.ended, 1000, "the job to end")
        _caught_by_replay(c, c.ops[3].address, {o.address for o in c.ops[:3]})


@pytest.mark.timeout(1200)
def test_a_member_serving_its_state_a_byte_a_minute_is_caught_by_the_referees_own_request(
    tmp_path, monkeypatch
) -> None:
    """op4 of 4 trains honestly but serves each private state a checker asks for at one byte
    per 55 s (`drip`): never idle long enough for a fetch's idle timeout, never done. Its
    checker gives up at the state's deadline (the most bytes a state of the job has, at the
    documented minimum bandwidth), claims "withheld" and runs every later check; the claim is
    a request in the open: the challenge names it, and each drawn referee asks for the state
    itself, for half a challenge phase. Nobody serves it: op4 is caught (`FailedReplay`) and
    unpaid, the checkpoint stands, the honest members are paid, the checker gets its bond
    back, the wei add up."""
    monkeypatch.setenv(spotcheck.RATE_ENV, "1")  # inherited by the node processes
    with _cluster(tmp_path, 4, 2 * ROUNDS) as c:  # the state's deadline (14.7 s) fits a phase
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["drip"])
        c.wait(c.ended, 1000, "the job to end")
        drip, honest = c.ops[3].address, {o.address for o in c.ops[:3]}
        checked = [m for i in range(4) for m in c.metrics(i) if m["kind"] == "replay_checked"]
        # every honest member's every round was checked and matched: none waited on op4
        fair = sorted((m["member"], m["round"]) for m in checked if m["member"] != drip)
        assert fair == sorted((a, r) for a in honest for r in range(ROUNDS))
        assert all(m["match"] and m["bytes"] > 0 for m in checked if m["member"] != drip)
        asked = [m for m in checked if m["member"] == drip]
        assert asked and all(m["reason"] == "withheld" for m in asked), asked
        made = [m for i in range(3) for m in c.metrics(i) if m["kind"] == "replay_claim"]
        assert made and {(m["member"], m["reason"]) for m in made} == {(drip, "withheld")}
        _caught_by_replay(c, drip, honest)


@pytest.mark.timeout(1200)
def test_a_forged_withheld_claim_about_a_check_not_its_own_is_refused_and_costs_its_bond(
    tmp_path,
) -> None:
    """Attack: op4 of 4 trains honestly, then signs with the product's own claim code a
    "withheld" claim about another member's round whose check was not its own (`forge-claim`)
    and challenges the certified vote with it, to have an honest member judged. Each referee
    recomputes the round's assignment from the transcript and refuses the claim before it
    fetches or re-runs anything: nobody is caught or slashed, the checkpoint stands, all four
    (the forger too: its vote was honest) are paid and keep their stake, and the forger's bond
    goes to the referees and the treasury."""
    with _cluster(tmp_path, 4, 2 * ROUNDS) as c:
        b = c.bsm
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.spawn(3, ["forge-claim"])
        c.wait(c.ended, 1000, "the job to end")
        forger = c.ops[3].address
        (made,) = [m for m in c.metrics(3) if m["kind"] == "replay_claim"]
        assert made["reason"] == "withheld" and made["member"] != forger
        events = b.events(job_id=c.job_id)
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        assert challenged["challenger"] == forger
        (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
        assert any(bytes(resolved["verdictKey"])) and not resolved["overturned"]
        verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
        forged = f"{made['member']}/{made['round']}/{forger}"
        assert verdicts and all(v["caught"] == [] for v in verdicts)
        assert all(v["claims"] == {forged: "refused"} for v in verdicts), verdicts
        assert "Slashed" not in {e.name for e in events}
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in c.ops)
        for o in c.ops:
            assert b.pool(o.address).total_assets == ETH
        assert b.credit_of(forger) == c.spec.price_per_operator_epoch * 40 // 100, "bond lost"
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


@pytest.mark.timeout(1200)
def test_a_challenge_of_a_proven_unworkable_vote_loses_its_bond(tmp_path) -> None:
    """The job's dataset changes after its members applied: every member's epoch fails the
    dataset's pin and votes UNWORKABLE, a quorum. The caller disputes it anyway (a dispute that
    would get every member slashed), naming a transcript nobody serves. The referees rebuild the
    job from its own files, meet the same failure and reveal UNWORKABLE: the vote is upheld,
    the caller's bond goes to the treasury, nobody is slashed and the members are compensated."""
    with Cluster(
        tmp_path,
        operators=3,
        epochs=1,
        steps=8,
        sync=2,
        round_deadline=4.0,
        epoch_duration=240,
        challenge_window=WINDOW,
        referees=3,
        seat_draw_window=20,  # the seats wait: the dataset changes after every member applied
    ) as c:
        b = c.bsm
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.wait(lambda: len(b.job(c.job_id).members) == 3, 300, "three applications")
        Path(c.spec.dataset_uri).write_bytes(b"not the dataset the job pins\n")
        c.wait(lambda: any(b.certified_vote(c.job_id)[0]), 600, "a certified vote")
        assert b.certified_vote(c.job_id)[0] == UNWORKABLE
        treasury = b.credit_of(c.treasury.address)
        b.with_account(c.caller.key).challenge(c.job_id, 0, bytes(32))
        c.wait(c.ended, 900, "the job to end")
        events = b.events(job_id=c.job_id)
        (resolved,) = [e.args for e in events if e.name == "ChallengeResolved"]
        assert not resolved["overturned"] and bytes(resolved["verdictKey"]) == UNWORKABLE
        verdicts = [m for r in range(3) for m in _referee_metrics(c, r) if m["kind"] == "verdict"]
        assert verdicts and {v["checkpoint"] for v in verdicts} == {UNWORKABLE.hex()}
        assert [e for e in events if e.name == "JobAborted"]
        assert not [e for e in events if e.name == "Slashed"]
        assert b.credit_of(c.treasury.address) >= treasury + _kept(c, events), "the caller's bond"
        comp = c.spec.price_per_operator_epoch * b.params().unworkable_comp_bps // 10_000
        for o in c.ops:
            assert b.pool(o.address).total_assets == ETH, "nobody lost stake"
            assert b.credit_of(o.address) >= comp, "compensated (plus, maybe, a finalizer's fee)"
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


@pytest.mark.timeout(1200)
def test_a_minority_that_withholds_its_votes_to_block_the_quorum_is_judged_and_slashed(
    tmp_path,
) -> None:
    """Two of five members train, commit their votes and never reveal them (`no-reveal`): the
    three honest reveals are under the 2/3 quorum, so nothing is certified. Without a challenge
    the attempt would fail and be retried, every member unpaid: a veto for the price of the
    withheld-reveal slash. An honest member takes the attempt to the referees, who re-execute
    the epoch; the epoch settles on their verdict (the honest vote), the two are slashed and
    unpaid, the three honest members are paid and keep their stake, the wei add up."""
    with _cluster(tmp_path, 5, 8) as c:
        b = c.bsm
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        for i in (3, 4):
            c.spawn(i, ["no-reveal"])
        c.wait(c.ended, 1100, "the job to end")
        honest, vetoers = c.ops[:3], c.ops[3:]
        assert b.job(c.job_id).state.status.name == "COMPLETED"
        events = b.events(job_id=c.job_id)
        revealed = {e.args["operator"] for e in events if e.name == "CheckpointRevealed"}
        assert revealed == {o.address for o in honest}, "3 of 5 reveals: no quorum"
        (challenged,) = [e.args for e in events if e.name == "Challenged"]
        assert challenged["challenger"] in {o.address for o in honest}
        assert [e.name for e in events].count("ChallengeResolved") == 1
        votes = {
            m["checkpoint"] for i in range(3) for m in c.metrics(i) if m["kind"] == "epoch_trained"
        }
        (finalized,) = [e.args for e in events if e.name == "EpochFinalized"]
        assert {bytes(finalized["checkpoint"]).hex()} == votes, "settled on the honest vote"
        assert "EpochFailed" not in [e.name for e in events], "not retried"
        slashed = sorted(
            (e.args["operator"], SlashReason(e.args["reason"]))
            for e in events
            if e.name == "Slashed"
        )
        assert [a for a, _ in slashed] == sorted(o.address for o in vetoers), slashed
        paid = sorted(e.args["operator"] for e in events if e.name == "OperatorPaid")
        assert paid == sorted(o.address for o in honest)
        for o in honest:
            assert b.pool(o.address).total_assets == ETH, "no honest member lost stake"
        for o in vetoers:
            assert b.pool(o.address).total_assets < ETH and b.credit_of(o.address) == 0
        assert b.w3.eth.get_balance(b.address) == b.accounting().total


class _SybilJury:
    """An attacker's operators at the minimum stake, registered once the job exists. One of
    them challenges the honest certified vote; each one drawn as a referee commits, then
    reveals, a forged checkpoint with no voter consistent: were it the verdict, every member
    would be slashed as a fabricator."""

    def __init__(self, c: Cluster, n: int) -> None:
        from eth_account import Account

        self.c, self.b = c, c.bsm
        made = [Account.create() for _ in range(n)]
        self.keys = {a.address: "0x" + bytes(a.key).hex() for a in made}
        stake = self.b.params().min_stake
        for address, key in self.keys.items():
            self.b.w3.provider.make_request("anvil_setBalance", [address, hex(stake + ETH)])
            self.b.with_account(key).register_operator(stake, os.urandom(32), [], "cpu", 0)
        self.challenger = made[0].address
        self.forged, self.salt = os.urandom(32), os.urandom(32)
        self.committed: set[str] = set()
        self.revealed: set[str] = set()
        self.attempt = 0  # the challenged attempt

    def challenge_once_certified(self) -> bool:
        key, closes = self.b.certified_vote(self.c.job_id)
        if not any(key) or closes <= max(time.time(), self.b.latest_block_timestamp()):
            return False
        self.attempt = self.b.job(self.c.job_id).state.attempt
        self.b.with_account(self.keys[self.challenger]).challenge(self.c.job_id, 0, os.urandom(32))
        return True

    def judge(self) -> None:
        """Commits and reveals the forged verdict for each drawn sybil, phase by phase."""
        b, w = self.b, self.c.challenge_window
        ch = b.challenge_of(self.attempt)
        for r in set(ch.referees) & set(self.keys):
            b.w3.provider.make_request("evm_mine", [])  # the chain's clock to the wall clock's
            now = b.latest_block_timestamp()
            trained = [m for m in self.c.metrics(0) if m["kind"] == "epoch_trained"]
            (p,) = {tuple(m["participation"]) for m in trained}
            bsm = b.with_account(self.keys[r])
            if r not in self.committed and ch.opened_at + w <= now < ch.opened_at + 2 * w:
                h = commitment_hash(self.c.job_id, 0, r, self.forged, p, bytes(32), self.salt)
                bsm.commit_verdict(self.c.job_id, 0, h)
                self.committed.add(r)
            elif r in self.committed - self.revealed and (
                ch.committed == len(ch.referees) or now >= ch.opened_at + 2 * w
            ):
                bsm.reveal_verdict(self.c.job_id, 0, self.forged, p, 0, self.salt)
                self.revealed.add(r)


@pytest.mark.timeout(1200)
def test_32_sybils_registered_once_the_job_exists_cannot_judge_its_honest_epoch(
    tmp_path,
) -> None:
    """Once the job exists, an attacker registers 32 operators at the minimum stake (32 to 3
    against the outsiders registered before it), challenges the three honest members'
    certified vote and has every sybil drawn as a referee reveal a forged checkpoint. A job's
    juries come from the operators registered when it was created, no heavier than then: the
    three honest referee nodes are drawn and uphold the vote; nobody is slashed, every member
    is paid and keeps its stake, the attacker's bond goes to the treasury, the wei add up."""
    with _cluster(tmp_path, 3, 8) as c:
        jury = _SybilJury(c, 32)
        for r in range(3):
            c.spawn_referee(r)
        for i in range(3):
            c.spawn(i)
        c.wait(jury.challenge_once_certified, 600, "a certified vote to challenge")
        c.wait(lambda: jury.judge() or c.ended(), 1000, "the job to end")
        b = c.bsm
        assert b.job(c.job_id).state.status.name == "COMPLETED"
        events = _upheld_against(c, None, jury.challenger)
        ch = b.challenge_of(jury.attempt)
        assert set(ch.referees) <= {a.address for a in c.referees} and len(ch.referees) == 3
        assert not jury.committed, "no sybil was drawn"
        (finalized,) = [e.args for e in events if e.name == "EpochFinalized"]
        assert bytes(finalized["checkpoint"]) != jury.forged
        assert b.credit_of(jury.challenger) == 0, "the bond went to the treasury"


def _referee_metrics(c: Cluster, r: int) -> list[dict]:
    from dtrain_node.devnet.cluster import read_metrics

    return read_metrics(c.tmp / f"referee{r + 1}")

"""Replay spot checks in the node (docs/protocol.md 4.6): the private-state digest signed into
each commitment, the canonical state file a member keeps and serves, the assignment of checks,
the checker's verdict on real `builtin:tiny` rounds and the signed claim a failed check
becomes. Every parser here is fuzzed: anything malformed is refused with its own error."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import threading
import time
from pathlib import Path

import pytest
import torch
from eth_account import Account
from eth_utils import to_checksum_address
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain_node.errors import EnvelopeError
from dtrain_node.operator.faults import Faults, RoundContext
from dtrain_node.optim import reproduce as rp
from dtrain_node.optim import statefile
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.p2p import envelope as envmod
from dtrain_node.train.start import start_model
from dtrain_node.verify import claims, fraudcheck, replaycheck, spotcheck
from dtrain_node.verify import evidence as ev

K, CHAIN, JOB, ATTEMPT = 2, 31337, 7, 3
CONTRACT = to_checksum_address("0x" + "cc" * 20)
CFG = DeMoConfig(
    mode="local", sync_interval=K, lr=1.0, compress=CompressConfig(k2d=4, k1d=1, bits=1)
)
ACCOUNTS = sorted((Account.create() for _ in range(4)), key=lambda a: a.address.lower())
MEMBERS = [a.address for a in ACCOUNTS]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _commit(account, rnd: int, payload: bytes, state: bytes = b"") -> envmod.Envelope:
    chunks = envmod.seal(
        account, chain_id=CHAIN, contract=CONTRACT, job_id=JOB, epoch=ATTEMPT, round=rnd,
        payload=payload,
    )  # fmt: skip
    return envmod.commitment(account, chunks, state)


# -- the state digest on the wire ------------------------------------------------------------


def test_a_commitment_signs_the_private_state_digest_and_old_ones_still_parse() -> None:
    state = hashlib.sha256(b"state").digest()
    c = _commit(ACCOUNTS[0], 2, b"packet", state)
    back = envmod.decode(c.encode())
    assert back == c and back.state_digest == state
    assert back.recover_signer() == MEMBERS[0]
    assert len(c.encode()) == envmod.OVERHEAD + 32
    # another digest under the same signature is another signer (the digest is signed)
    forged = dataclasses.replace(back, chunk=hashlib.sha256(b"other").digest())
    assert forged.recover_signer() != MEMBERS[0]
    old = envmod.decode(_commit(ACCOUNTS[0], 2, b"packet").encode())
    assert old.state_digest is None and old.recover_signer() == MEMBERS[0]
    chunk = envmod.seal(
        ACCOUNTS[0], chain_id=CHAIN, contract=CONTRACT, job_id=JOB, epoch=0, round=0,
        payload=b"x" * 32,
    )[0]  # fmt: skip
    assert chunk.state_digest is None  # a packet chunk of 32 bytes is no state digest


@pytest.mark.parametrize("size", [1, 31, 33, 64])
def test_a_commitment_with_any_other_chunk_length_is_malformed(size: int) -> None:
    raw = bytearray(_commit(ACCOUNTS[1], 0, b"p", bytes(32)).encode())
    # rewrite chunk_len and the chunk, keeping the frame consistent
    head, sig = bytes(raw[: envmod.HEADER_LEN - 4]), bytes(raw[-65:])
    bad = head + size.to_bytes(4, "big") + b"\x01" * size + sig
    with pytest.raises(EnvelopeError) as e:
        envmod.decode(bad)
    assert e.value.reason == "malformed"


@FUZZ
@given(st.integers(0, envmod.OVERHEAD + 31), st.binary(min_size=1, max_size=8))
def test_fuzz_mutated_commitments_raise_only_envelope_error(at: int, junk: bytes) -> None:
    raw = _commit(ACCOUNTS[2], 5, b"payload", bytes(range(32))).encode()
    for bad in (raw[:at] + junk + raw[at + len(junk) :], raw[:at] + junk + raw[at:], raw[:at]):
        try:
            env = envmod.decode(bad)
        except EnvelopeError as e:
            assert e.reason == "malformed"
            continue
        assert env.kind in (envmod.CHUNK, envmod.COMMIT)
        if env.kind == envmod.COMMIT:
            assert len(env.chunk) in (0, 32) and env.chunk_index == 0


def test_the_evidence_file_keeps_the_state_digest_of_each_packet() -> None:
    state = hashlib.sha256(b"s").digest()
    packet = b"\x00\x01" * 10
    rounds = ((ev.Packet(MEMBERS[0], packet, _commit(ACCOUNTS[0], 0, packet, state).encode()),),)
    t = ev.EpochTranscript(CHAIN, CONTRACT, JOB, 0, ATTEMPT, rounds)
    back = ev.decode(t.encode())
    ev.verify(back, MEMBERS)
    assert back == t and back.rounds[0][0].state == state
    assert ev.Packet(MEMBERS[0], packet, _commit(ACCOUNTS[0], 0, packet).encode()).state is None


# -- assignment ------------------------------------------------------------------------------


def test_assignment_is_a_pure_function_never_self_and_at_the_rate() -> None:
    seeds = [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(3000)]
    total = 0
    for r, seed in enumerate(seeds):
        pairs = spotcheck.assign(seed, MEMBERS, r, 0.1)
        assert pairs == spotcheck.assign(seed, list(reversed(MEMBERS)), r, 0.1)
        assert [p for p in pairs if p[0] == p[1]] == []
        assert {c for c, _ in pairs} <= set(MEMBERS) and len({m for _, m in pairs}) == len(pairs)
        total += len(pairs)
    rate = total / (len(seeds) * len(MEMBERS))
    assert 0.09 < rate < 0.11, rate
    seed = seeds[0]
    assert spotcheck.assign(seed, MEMBERS, 0, 0.0) == []
    assert sorted(m for _, m in spotcheck.assign(seed, MEMBERS, 0, 1.0)) == sorted(MEMBERS)
    assert spotcheck.assign(seed, MEMBERS[:1], 0, 1.0) == []
    # every checker is drawn: no member is the only one that checks
    checkers = {c for r, s in enumerate(seeds[:50]) for c, _ in spotcheck.assign(s, MEMBERS, r, 1)}
    assert checkers == set(MEMBERS)
    with pytest.raises(ValueError):
        spotcheck.assign(seed, MEMBERS, 0, 1.5)


def test_rate_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(spotcheck.RATE_ENV, raising=False)
    assert spotcheck.rate_from_env() == spotcheck.DEFAULT_RATE == 0.09
    monkeypatch.setenv(spotcheck.RATE_ENV, "0")
    assert spotcheck.rate_from_env() == 0.0
    monkeypatch.setenv(spotcheck.RATE_ENV, "2")
    with pytest.raises(ValueError, match="not in"):
        spotcheck.rate_from_env()


# -- retention -------------------------------------------------------------------------------


def test_the_ring_keeps_every_round_of_its_attempt_and_prunes_other_attempts(
    tmp_path: Path,
) -> None:
    """A checker that fell rounds behind (or a referee after the epoch) still finds every state
    a member committed to in its attempt: the protocol's ring keeps them all."""
    served: dict[str, Path] = {}
    old = spotcheck.StateRing(tmp_path, 2, lambda sha, p: served.__setitem__(sha, p))
    old_sha = old.put(0, b"attempt 2")
    ring = spotcheck.StateRing(tmp_path, 3, lambda sha, p: served.__setitem__(sha, p))
    shas = [ring.put(r, f"state {r}".encode()) for r in range(12)]
    assert [sha for _, sha, _ in ring.files()] == shas
    assert all(served[sha].exists() for sha in shas)
    assert not served[old_sha].exists(), "another attempt's states are gone"


def test_the_ring_keeps_serves_and_prunes_the_last_rounds(tmp_path: Path) -> None:
    served: dict[str, Path] = {}
    old = spotcheck.StateRing(tmp_path, 2, lambda sha, p: served.__setitem__(sha, p), keep=2)
    old_sha = old.put(0, b"attempt 2")
    ring = spotcheck.StateRing(tmp_path, 3, lambda sha, p: served.__setitem__(sha, p), keep=2)
    shas = [ring.put(r, f"state {r}".encode()) for r in range(4)]
    assert shas[1] == hashlib.sha256(b"state 1").hexdigest()
    assert [(r, sha) for r, sha, _ in ring.files()] == [(2, shas[2]), (3, shas[3])]
    for sha in shas[2:]:
        assert hashlib.sha256(served[sha].read_bytes()).hexdigest() == sha
    assert not served[shas[0]].exists() and not served[old_sha].exists()
    assert ring.put(3, b"state 3") == shas[3]  # a restarted member keeps the same file
    again: dict[str, Path] = {}
    spotcheck.StateRing(tmp_path, 3, lambda sha, p: again.__setitem__(sha, p), keep=2)
    assert sorted(again) == sorted(shas[2:])  # and serves what it kept


# -- the state file and the checker on real rounds -------------------------------------------


def _member() -> tuple[torch.nn.Module, DeMo]:
    torch.manual_seed(0)
    model = start_model("builtin:tiny").fresh()
    return model, DeMo(model.named_parameters(), CFG, sender="member")


def _batches(member: str, rnd: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(hash(member) % 1000 * 100 + rnd)
    return [torch.randint(0, 256, (2, 32), generator=g) for _ in range(K)]


def _loss(model):
    return lambda ids: model(input_ids=ids, labels=ids).loss


@pytest.fixture(scope="module")
def rounds():
    """A member trains 3 rounds: per round (shared state, state file, packet)."""
    torch.set_num_threads(1)
    model, opt = _member()
    out = []
    for r in range(3):
        shared = [t.clone() for t in opt.theta_sync]
        data = statefile.encode(rp.private_state(opt))
        for b in _batches("m", r):
            _loss(model)(b).backward()
            opt.inner_step()
        packet = opt.prepare()
        opt.apply([(opt.sender, packet)])
        out.append((shared, data, packet))
    return out


def test_the_state_file_is_canonical_and_loads_into_a_checker(rounds) -> None:
    shared, data, _ = rounds[2]
    state = statefile.decode(data)
    assert statefile.encode(state) == data
    _, opt = _member()
    statefile.load(opt, shared, state)
    assert statefile.encode(rp.private_state(opt)) == data
    bad = {**state, "e": {**state["e"], "vec": state["e"]["vec"][:-1]}}
    with pytest.raises(statefile.StateInvalid):
        statefile.load(opt, shared, bad)
    slots = dict(state["inner"]["state"])
    slots[0] = {**slots[0], "exp_avg": torch.zeros(3)}
    with pytest.raises(statefile.StateInvalid):
        statefile.load(opt, shared, {**state, "inner": {"state": slots}})


@FUZZ
@given(st.data())
def test_fuzz_state_files_raise_only_state_invalid(rounds, data) -> None:
    raw = rounds[0][1][:4096]  # a prefix: the tensors' names, dtypes, shapes and first bytes
    at = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(max_size=12))
    for bad in (raw[:at] + junk + raw[at + len(junk) :], raw[:at] + junk, junk):
        with pytest.raises(statefile.StateInvalid):
            statefile.decode(bad)


def _replica(model, opt):
    def replay(member, rnd, shared, state):
        statefile.load(opt, shared, state)
        for b in _batches(member, rnd):
            _loss(model)(b).backward()
            opt.inner_step()
        return opt.prepare()

    return replay


def test_the_checker_matches_honest_rounds_and_catches_each_failure(rounds, tmp_path) -> None:
    files = {hashlib.sha256(d).hexdigest(): d for _, d, _ in rounds}
    junk = b"not a state"
    files[hashlib.sha256(junk).hexdigest()] = junk

    def fetch(sha: str, member: str, dest: Path, within_s: float) -> Path:
        if sha not in files:
            raise RuntimeError("not found")
        dest.write_bytes(files[sha])
        return dest

    replay = _replica(*_member())
    acct = ACCOUNTS[0]

    def check(r: int, packet: bytes, state: bytes | None) -> replaycheck.Outcome:
        commit = _commit(acct, r, packet, b"" if state is None else state).encode()
        c = replaycheck.Check(r, "m", packet, commit, rounds[r][0])
        return replaycheck.run_check(c, replay, fetch, tmp_path, 30.0)

    digest = [hashlib.sha256(d).digest() for _, d, _ in rounds]
    for r in range(3):
        o = check(r, rounds[r][2], digest[r])
        assert o.reason is None and o.bytes == len(rounds[r][1]) and o.replay_s > 0, r
    stale = check(2, rounds[0][2], digest[2])  # the first packet re-sent in round 2
    assert stale.reason == claims.MISMATCH and stale.replayed != bytes(32)
    assert check(1, rounds[1][2], digest[2]).reason == claims.MISMATCH  # another state
    assert check(1, rounds[1][2], hashlib.sha256(junk).digest()).reason == claims.INVALID_STATE
    assert check(1, rounds[1][2], None).reason == claims.NO_STATE
    replaycheck.FETCH_BACKOFF_S, saved = 0.0, replaycheck.FETCH_BACKOFF_S
    try:
        assert check(1, rounds[1][2], bytes(32)).reason == claims.WITHHELD
    finally:
        replaycheck.FETCH_BACKOFF_S = saved
    # a state that replayed to its packet is not kept; one that failed is, for the referees
    kept = sorted(f.read_bytes() for f in tmp_path.iterdir())
    assert kept == sorted([rounds[2][1], rounds[2][1], junk])


def _outcome(rnd: int, packet: bytes, reason: int | None) -> replaycheck.Outcome:
    z = bytes(32)
    return replaycheck.Outcome(replaycheck.Check(rnd, MEMBERS[1], packet, b"", []), reason, z, z,
                               0, 0.0, 0.0)  # fmt: skip


def test_only_failures_on_the_canonical_state_and_packet_stand() -> None:
    sha = hashlib.sha256(b"p").hexdigest()
    canonical = [[(MEMBERS[1], sha)]] * 4
    out = [_outcome(r, b"p", claims.MISMATCH) for r in range(4)] + [_outcome(0, b"p", None)]
    out += [_outcome(1, b"p", claims.WITHHELD)]  # not served: the referees ask again
    assert [o.check.round for o in replaycheck.confirmed(out, None, canonical)] == [0, 1, 2, 3, 1]
    # rounds before round 3 differed live: its start state was not the canonical one
    assert [o.check.round for o in replaycheck.confirmed(out, 2, canonical)] == [0, 1, 2, 1]
    other = [[(MEMBERS[1], hashlib.sha256(b"q").hexdigest())]] * 4
    assert replaycheck.confirmed(out, None, other) == []


# -- the claim -------------------------------------------------------------------------------


def _claim(reason: int = claims.MISMATCH, state: bytes = b"\x07" * 32) -> claims.Claim:
    member, checker = ACCOUNTS[1], ACCOUNTS[2]
    commit = _commit(member, 4, b"stale packet", b"" if reason == claims.NO_STATE else state)
    return claims.Claim(
        chain_id=CHAIN, contract=CONTRACT, job_id=JOB, attempt=ATTEMPT, round=4,
        member=member.address, checker=checker.address, reason=reason,
        state=bytes(32) if reason == claims.NO_STATE else state,
        packet=hashlib.sha256(b"stale packet").digest(), replayed=b"\x09" * 32,
        commitment=commit.encode(),
    ).sign(checker)  # fmt: skip


def test_a_claim_round_trips_and_verifies_and_tampering_is_refused() -> None:
    for reason in range(len(claims.REASONS)):
        c = _claim(reason)
        back = claims.decode(c.encode())
        assert back == c
        claims.verify(back)
        assert claims.signer(back) == ACCOUNTS[2].address
    c = _claim()
    for bad in (
        dataclasses.replace(c, round=5),  # not the round the commitment names
        dataclasses.replace(c, replayed=b"\x00" * 32),  # not what the checker signed
        dataclasses.replace(c, state=b"\x08" * 32),
        dataclasses.replace(c, reason=claims.NO_STATE),
        dataclasses.replace(c, member=ACCOUNTS[3].address),
        dataclasses.replace(c, checker=ACCOUNTS[1].address),
        dataclasses.replace(c, commitment=c.commitment[:-1] + bytes([c.commitment[-1] ^ 1])),
    ):
        with pytest.raises(claims.ClaimInvalid):
            claims.verify(bad)
    with pytest.raises(claims.ClaimInvalid):
        dataclasses.replace(c, signature=b"").encode()


@FUZZ
@given(st.data())
def test_fuzz_claims_raise_only_claim_invalid(data) -> None:
    raw = _claim().encode()
    at = data.draw(st.integers(0, len(raw)))
    junk = data.draw(st.binary(min_size=1, max_size=8))
    for bad in (raw[:at] + junk + raw[at + len(junk) :], raw[:at], junk + raw[at:]):
        if bad == raw:
            continue
        try:
            c = claims.decode(bad)
        except claims.ClaimInvalid:
            continue
        with pytest.raises(claims.ClaimInvalid):
            claims.verify(c)  # decodes, but no longer what the checker and member signed


def test_claims_are_saved_and_loaded(tmp_path: Path) -> None:
    c = _claim()
    path = claims.save(tmp_path / "claims", c)
    assert path.read_bytes() == c.encode() and claims.load_all(tmp_path / "claims") == [c]


# -- the free-rider fault --------------------------------------------------------------------


def test_the_stale_fault_trains_once_then_resends_its_first_packet() -> None:
    f = Faults.parse(["stale"])
    assert f.stale and f.any
    spec = None
    first = RoundContext(spec, MEMBERS[0])  # type: ignore[arg-type]
    assert not f.skips_compute(first) and f.packet(0, b"honest 0", first) == b"honest 0"
    later = RoundContext(spec, MEMBERS[0], b"honest 0", (), first_sent=b"honest 0")  # type: ignore[arg-type]
    assert f.skips_compute(later) and f.packet(3, b"honest 3", later) == b"honest 0"
    assert not Faults().skips_compute(later) and Faults().packet(3, b"h", later) == b"h"


# -- the referee's re-run: which claims it takes -------------------------------------------


def _transcript(payload: bytes, attempt: int = ATTEMPT) -> ev.EpochTranscript:
    """Five rounds in which ACCOUNTS[1] sent `payload` in round 4 and ACCOUNTS[0] a packet
    every round."""
    rounds = []
    for r in range(5):
        ps = [ev.Packet(MEMBERS[0], b"honest", _commit(ACCOUNTS[0], r, b"honest").encode())]
        if r == 4:
            commit = _commit(ACCOUNTS[1], r, payload, b"\x07" * 32).encode()
            ps.append(ev.Packet(MEMBERS[1], payload, commit))
        rounds.append(tuple(ps))
    return ev.EpochTranscript(CHAIN, CONTRACT, JOB, 0, attempt, tuple(rounds))


def test_a_referee_reruns_only_a_claim_on_the_packet_the_transcript_holds() -> None:
    c = _claim()
    assert fraudcheck.applies(c, _transcript(b"stale packet"))
    # the transcript holds another packet of the member in that round: not this claim's
    assert not fraudcheck.applies(c, _transcript(b"another packet"))
    # a transcript of another attempt, or one too short for the claim's round
    assert not fraudcheck.applies(c, _transcript(b"stale packet", attempt=ATTEMPT + 1))
    short = _transcript(b"stale packet")
    assert not fraudcheck.applies(c, dataclasses.replace(short, rounds=short.rounds[:4]))
    # a claim whose checker signature does not hold is never re-run
    forged = dataclasses.replace(c, replayed=b"\x00" * 32)
    assert not fraudcheck.applies(forged, _transcript(b"stale packet"))


def test_a_withheld_claim_is_a_request_only_about_a_round_the_transcript_holds() -> None:
    """A "withheld" claim is no verdict: it asks the referees to request the state themselves
    (`fraudcheck.caught`), so it is taken up like any claim on the transcript's packet. Attack:
    a member signs one, with the product's own claim code, about a round the attempt never had
    (a state nobody keeps) or a packet the transcript does not hold: refused before anything
    is fetched or re-run. One about a round it was not assigned is refused too (below)."""
    withheld = _claim(claims.WITHHELD)
    claims.verify(withheld)  # the signatures hold
    assert fraudcheck.applies(withheld, _transcript(b"stale packet"))
    assert not fraudcheck.applies(withheld, _transcript(b"another packet"))
    short = _transcript(b"stale packet")
    assert not fraudcheck.applies(withheld, dataclasses.replace(short, rounds=short.rounds[:4]))


def test_the_state_bound_is_the_size_of_a_full_state_and_no_state_exceeds_it(rounds) -> None:
    """Every node computes the same cap on a member's state (and the deadline to serve it)
    from the model and recipe alone: exactly the size of a state with its inner moments, and
    round 0's, before any inner step, is smaller."""
    _, opt = _member()
    bound = statefile.size_bound(opt)
    sizes = [len(data) for _, data, _ in rounds]
    assert sizes[1] == sizes[2] == bound
    assert sizes[0] < bound
    assert replaycheck.state_deadline(bound) == pytest.approx(
        replaycheck.STATE_FETCH_BASE_S + bound / replaycheck.STATE_MIN_BANDWIDTH
    )


def test_a_check_asks_again_within_one_deadline_for_all_its_tries(
    rounds, tmp_path, monkeypatch
) -> None:
    """Attack: a member serves its state slowly, so that every try takes the whole time a
    fetch allows. The tries share one deadline: each is given only what is left of it."""
    asked: list[float] = []

    def slow(sha: str, member: str, dest: Path, within_s: float) -> Path:
        asked.append(within_s)
        time.sleep(0.1)  # the try takes its time: what is left for the next is less
        raise RuntimeError("gave up")

    monkeypatch.setattr(replaycheck, "FETCH_BACKOFF_S", 0.0)
    commit = _commit(ACCOUNTS[0], 1, rounds[1][2], hashlib.sha256(rounds[1][1]).digest())
    c = replaycheck.Check(1, "m", rounds[1][2], commit.encode(), rounds[1][0])
    o = replaycheck.run_check(c, _replica(*_member()), slow, tmp_path, 5.0)
    assert o.reason == claims.WITHHELD
    assert len(asked) == replaycheck.FETCH_TRIES
    assert asked[-1] > 0 and asked[0] <= 5.0
    assert all(later <= earlier - 0.1 for earlier, later in itertools.pairwise(asked)), asked


def test_a_member_that_withheld_once_holds_up_no_later_check(tmp_path, monkeypatch) -> None:
    """After one withheld state, the checker does not fetch that member again in the attempt:
    the checks of the others queued behind it run, and the one claim stands for it."""
    fetched: list[str] = []

    def fetch(sha: str, member: str, dest: Path, within_s: float) -> Path:
        fetched.append(member)
        if member == "slow":
            raise RuntimeError("not served in time")
        dest.write_bytes(b"state")
        return dest

    outcomes: list[replaycheck.Outcome] = []
    monkeypatch.setattr(replaycheck, "FETCH_BACKOFF_S", 0.0)
    checker = replaycheck.Checker(
        lambda *a: b"p", fetch, tmp_path, outcomes.append, within=lambda: 1.0
    )
    for rnd, member in enumerate(["slow", "other", "slow", "third"]):
        commit = _commit(ACCOUNTS[0], rnd, b"p", hashlib.sha256(b"state").digest())
        checker.submit(replaycheck.Check(rnd, member, b"p", commit.encode(), []))
    assert checker.drain(30.0)
    checker.stop()
    withheld = [(o.check.member, o.reason == claims.WITHHELD) for o in outcomes]
    assert withheld == [("slow", True), ("other", False), ("third", False)]
    assert fetched == ["slow"] * replaycheck.FETCH_TRIES + ["other", "third"]


def test_an_abandoned_checker_drops_its_queue_and_claims_nothing(tmp_path) -> None:
    """A node that gave its epoch up stops spending compute on checks: the check running
    finishes, the queued ones are dropped (never claimed), and `drain` still returns."""
    started, release = threading.Event(), threading.Event()
    fetched: list[str] = []

    def fetch(sha: str, member: str, dest: Path, within_s: float) -> Path:
        fetched.append(member)
        started.set()
        release.wait(10)
        dest.write_bytes(b"state")
        return dest

    outcomes: list[replaycheck.Outcome] = []
    checker = replaycheck.Checker(
        lambda *a: b"p", fetch, tmp_path, outcomes.append, within=lambda: 1.0
    )
    for rnd, member in enumerate(["a", "b", "c"]):
        commit = _commit(ACCOUNTS[0], rnd, b"p", hashlib.sha256(b"state").digest())
        checker.submit(replaycheck.Check(rnd, member, b"p", commit.encode(), []))
    assert started.wait(10)
    checker.abandon()
    release.set()
    assert checker.drain(10.0)
    assert fetched == ["a"] and [o.check.member for o in outcomes] == ["a"]


def test_a_claim_counts_only_if_its_checker_was_assigned_that_check() -> None:
    """Attack: a member signs a claim (with the product's own claim code) about a member and a
    round it was not assigned, to have an honest member judged. The referee recomputes the
    round's assignment from the shared state after it and refuses the claim."""
    members = [a.address for a in ACCOUNTS[:4]]
    seed = hashlib.sha256(b"shared state after round 4").digest()
    pairs = spotcheck.assign(seed, members, 4, 1.0)
    checker_of = {m.lower(): c for c, m in pairs}
    c = _claim()
    real = checker_of[c.member.lower()]
    honest = dataclasses.replace(c, checker=real)
    assert fraudcheck.assigned(honest, seed, members, 1.0)
    others = [a for a in members if a.lower() not in {real.lower(), c.member.lower()}]
    for forger in others:
        assert not fraudcheck.assigned(dataclasses.replace(c, checker=forger), seed, members, 1.0)
    # another round, another seed or a rate under which nobody was checked: refused too
    assert not fraudcheck.assigned(dataclasses.replace(honest, round=5), seed, members, 0.0)
    assert not fraudcheck.assigned(honest, seed, members, 0.0)


def test_a_withheld_state_is_asked_for_once_more_before_it_is_claimed(
    tmp_path, monkeypatch
) -> None:
    """A member that was restarting while its check ran serves its state by the epoch's end:
    the checker asks once more before it claims anything, and the check then runs."""
    calls: list[str] = []

    def fetch(sha: str, member: str, dest: Path, within_s: float) -> Path:
        calls.append(member)
        if len(calls) <= replaycheck.FETCH_TRIES:
            raise RuntimeError("restarting")
        dest.write_bytes(b"state")
        return dest

    reported: list[replaycheck.Outcome] = []
    monkeypatch.setattr(replaycheck, "FETCH_BACKOFF_S", 0.0)
    checker = replaycheck.Checker(
        lambda *a: b"p", fetch, tmp_path, reported.append, within=lambda: 1.0
    )
    commit = _commit(ACCOUNTS[0], 0, b"p", hashlib.sha256(b"state").digest())
    checker.submit(replaycheck.Check(0, "m", b"p", commit.encode(), []))
    assert checker.drain(30.0)
    checker.stop()
    (first,) = checker.outcomes
    again = checker.again(first)
    assert first.reason == claims.WITHHELD
    assert again.reason != claims.WITHHELD and again.bytes == len(b"state")
    assert reported[-1] is again and checker.again(again) is again

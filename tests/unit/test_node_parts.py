"""Checkpoints, shards, faults, the built-in model and the corpus: pure logic of the node."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch
from harness.jobs import tiny_job
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain import UNWORKABLE
from dtrain_node.errors import CheckpointInvalid
from dtrain_node.operator import vote
from dtrain_node.operator.faults import Faults, RoundContext
from dtrain_node.operator.vote import Vote
from dtrain_node.optim import codec
from dtrain_node.optim.attacks import Attack
from dtrain_node.optim.compress import EXP_MAX
from dtrain_node.optim.optimizer import DeMo, DeMoConfig
from dtrain_node.train import checkpoint, corpus, shard
from dtrain_node.train import models as hf
from dtrain_node.train.backend import BackendUnavailable, TrainJob, make_backend


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "b.weight": torch.randn(64, 64, generator=g),
        "a.bias": torch.randn(64, generator=g),
        "step": torch.tensor(3),
        "empty": torch.zeros(0),
    }


def test_canonical_hash_ignores_insertion_order_and_sees_every_bit() -> None:
    t = tensors()
    h = checkpoint.canonical_hash(t)
    assert checkpoint.canonical_hash(dict(reversed(list(t.items())))) == h
    flipped = {k: v.clone() for k, v in t.items()}
    flipped["b.weight"].view(torch.int32)[0, 0] ^= 1
    assert checkpoint.canonical_hash(flipped) != h
    assert checkpoint.canonical_hash({**t, "a.bias": t["a.bias"].double()}) != h


def test_stream_is_the_hash_preimage_and_round_trips() -> None:
    t = tensors()
    s = checkpoint.to_stream(t)
    digest = hashlib.sha256(s).digest()
    assert digest == checkpoint.canonical_hash(t)
    back = checkpoint.from_stream(s, digest)
    assert all(torch.equal(back[k], t[k]) and back[k].dtype == t[k].dtype for k in t)


def test_a_streams_size_is_known_before_it_is_built() -> None:
    """A member caps the previous epoch's checkpoint download at the stream size of its own
    model's tensors: exact, for every dtype and shape (a scalar and an empty tensor too)."""
    from dtrain_node.train.models import initial_model

    odd = {
        "s": torch.tensor(3.0, dtype=torch.float64),
        "e": torch.zeros(0, 4, dtype=torch.bfloat16),
    }
    for t in (tensors(), odd, initial_model("builtin:tiny").state_dict()):
        assert checkpoint.stream_size(t) == len(checkpoint.to_stream(t))


def test_stream_rejects_corruption() -> None:
    t = tensors()
    s = bytearray(checkpoint.to_stream(t))
    s[100] ^= 0xFF
    with pytest.raises(CheckpointInvalid, match="does not match"):
        checkpoint.from_stream(bytes(s), checkpoint.canonical_hash(t))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_from_stream_fuzz(data: bytes) -> None:
    # Whatever the bytes, parsing with their own hash either works or raises CheckpointInvalid.
    try:
        out = checkpoint.from_stream(data, hashlib.sha256(data).digest())
    except CheckpointInvalid:
        return
    assert checkpoint.to_stream(out) == data


def test_save_load_verifies(tmp_path) -> None:
    t = tensors()
    digest = checkpoint.save(tmp_path / "c.safetensors", t)
    assert digest == checkpoint.canonical_hash(t)
    assert torch.equal(
        checkpoint.load(tmp_path / "c.safetensors", digest)["b.weight"], t["b.weight"]
    )
    with pytest.raises(CheckpointInvalid, match="!= expected"):
        checkpoint.load(tmp_path / "c.safetensors", b"\1" * 32)
    with pytest.raises(CheckpointInvalid, match="does not exist"):
        checkpoint.load(tmp_path / "missing.safetensors")


def test_shards_disjoint_cover_and_agree() -> None:
    members = ["0xB0", "0xa1", "0xC2"]
    parts = [shard.assign(100, 7, 2, members, m) for m in members]
    assert sorted(torch.cat(parts).tolist()) == list(range(100))
    # Any member order, any address case: the same assignment.
    again = shard.assign(100, 7, 2, list(reversed(members)), "0XA1".lower())
    assert torch.equal(again, shard.assign(100, 7, 2, members, "0xa1"))
    assert not torch.equal(shard.assign(100, 7, 3, members, "0xa1"), again)  # new epoch
    with pytest.raises(ValueError, match="not a member"):
        shard.assign(100, 7, 2, members, "0xdd")


def test_faults_parse_and_scope() -> None:
    f = Faults.parse(["fabricate", "epoch=1", "once"])
    assert f.fabricate_checkpoint and f.epoch == 1 and f.first_attempt_only
    assert f.active(1) == f and f.active(0) == Faults() and f.active(1, retry=True) == Faults()
    assert Faults.parse(["offline=2"]).offline_at_round == 2
    assert Faults.parse(["drip", "forge-claim"]) == Faults(drip=True, forge_claim=True)
    assert Faults().reveals and not Faults.parse(["no-reveal"]).reveals
    assert Faults.parse(["no-reveal", "epoch=2"]).active(1).reveals
    with pytest.raises(ValueError, match="unknown fault"):
        Faults.parse(["explode"])
    with pytest.raises(ValueError, match="unknown fault"):
        Faults.parse(["no-reveal=1"])


def test_vote_is_saved_durably_and_its_commitment_binds_everything(tmp_path) -> None:
    me, other = "0x" + "ab" * 20, "0x" + "cd" * 20
    v = Vote.fresh(b"\x01" * 32, [3, 2])
    w = Vote.fresh(b"\x01" * 32, [3, 2])
    assert len(v.salt) == 32 and v.salt != w.salt  # a fresh salt every time
    p = vote.path(tmp_path, 7)
    assert vote.load(p) is None
    vote.save(p, v)
    assert vote.load(p) == v and [f.name for f in tmp_path.iterdir()] == [p.name]
    c = v.commitment(1, 0, me)
    assert c == v.commitment(1, 0, me) and len(c) == 32
    changed = [
        w.commitment(1, 0, me),
        v.commitment(2, 0, me),
        v.commitment(1, 1, me),
        v.commitment(1, 0, other),
        Vote(b"\x02" * 32, v.participation, v.salt).commitment(1, 0, me),
        Vote(v.checkpoint, (3, 1), v.salt).commitment(1, 0, me),
    ]
    assert c not in changed
    u = Vote.unworkable(3)
    assert u.is_unworkable and u.checkpoint == UNWORKABLE and u.participation == (0, 0, 0)
    assert not v.is_unworkable


def test_fault_wrappers_replace_honest_behaviour_only_when_active() -> None:
    honest, packet, digest = Faults(), b"\x01" * 40, b"\x02" * 32
    assert honest.packet(5, packet) == packet and honest.digest(digest, "0xa1", 0) == digest
    vanished: list[int] = []
    honest.before_round(9, lambda *a, **k: None, vanished.append)
    assert vanished == []
    stop = Faults.parse(["stop-sync=2"])
    assert [stop.packet(r, packet) for r in range(4)] == [packet, packet, b"", b""]
    garbage = Faults.parse(["garbage"]).packet(0, packet)
    assert len(garbage) == len(packet) and garbage != packet
    made_up = Faults.parse(["fabricate"]).digest(digest, "0xa1", 3)
    assert len(made_up) == 32 and made_up != digest
    assert made_up == Faults.parse(["fabricate"]).digest(digest, "0xa1", 3)
    offline, seen = Faults.parse(["offline=2"]), []
    for r in range(4):
        offline.before_round(r, lambda kind, **kw: seen.append((kind, kw)), vanished.append)
    assert vanished == [3, 3]
    assert seen == [("fault_offline", {"round": 2}), ("fault_offline", {"round": 3})]
    scoped = Faults.parse(["fabricate", "epoch=1"])
    assert scoped.active(0).digest(digest, "0xa1", 0) == digest


def test_faults_parse_attacks() -> None:
    assert Faults.parse(["attack=poison"]).attack == Attack("poison")
    assert Faults.parse(["attack=scale=100", "epoch=3"]) == Faults(
        attack=Attack("scale", 100.0), epoch=3
    )
    for kind in ("signflip", "noise", "stale", "copy"):
        assert Faults.parse([f"attack={kind}"]).attack == Attack(kind)
    assert Faults.parse(["attack=orth=8"]).attack == Attack("orth", 8.0)
    bad_ones = ("attack", "attack=", "attack=explode", "attack=scale", "attack=scale=x")
    for bad in (*bad_ones, "attack=adapt", "attack=edge"):
        with pytest.raises(ValueError, match=r"attack|unknown fault") as err:
            Faults.parse([bad])
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="attack=KIND"):
        Faults.parse(["epoch=-1"])


def honest_packets(n: int) -> tuple[codec.Spec, list[bytes]]:
    """One round's honest packets of `n` DeMo members on a small random model."""
    g = torch.Generator().manual_seed(0)
    init = {"w": torch.randn(64, 32, generator=g), "b": torch.randn(32, generator=g)}
    cfg = DeMoConfig(mode="local", sync_interval=1, lr=1.0, inner_lr=0.01)
    out = []
    for w in range(n):
        opt = DeMo([(k, torch.nn.Parameter(t.clone())) for k, t in init.items()], cfg, sender=w)
        sum((p * torch.randn(p.shape, generator=g)).sum() for p in opt.params).backward()
        opt.inner_step()
        out.append(opt.prepare())
    return opt.spec, out


def test_attack_fault_replaces_the_packet_with_a_valid_attack_packet() -> None:
    spec, (mine, theirs, old) = honest_packets(3)
    first = RoundContext(spec, "0xa1")
    later = RoundContext(spec, "0xa1", old, [("0xA1", old), ("0xb2", theirs)])
    poison = Faults.parse(["attack=poison"])
    bad = poison.packet(0, mine, first)
    assert bad != mine and all(s.exp == EXP_MAX for s in codec.decode(spec, bad))
    assert Faults.parse(["attack=stale"]).packet(0, mine, first) == mine  # nothing to re-send
    assert Faults.parse(["attack=stale"]).packet(1, mine, later) == old
    assert Faults.parse(["attack=copy"]).packet(0, mine, first) == mine
    assert Faults.parse(["attack=copy"]).packet(1, mine, later) == theirs  # not our own
    for kind in ("scale=100", "signflip", "noise"):
        out = Faults.parse([f"attack={kind}"]).packet(1, mine, later)
        assert out != mine and len(codec.decode(spec, out)) == len(codec.decode(spec, mine))
    assert Faults().packet(1, mine, later) == mine
    assert Faults.parse(["attack=poison", "epoch=3"]).active(2).packet(0, mine, first) == mine
    with pytest.raises(ValueError, match="context"):
        poison.packet(0, mine)


def test_bad_fault_option_is_a_one_line_error(tmp_path, capsys) -> None:
    from dtrain.cli import main

    for bad in ("explode", "attack=explode", "attack=scale=-1"):
        args = ["node", "run", "--data-dir", str(tmp_path), "--job", "1", "--fault", bad]
        assert main(args) != 0
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --fault:") and "\n" not in err, err


def test_train_job_from_chain_job() -> None:
    from dtrain.models import Job, JobSpec, JobState, JobStatus, Method

    spec = JobSpec(
        price_per_operator_epoch=1,
        method=Method.SFT,
        model_uri="builtin:tiny",
        dataset_uri="/data/x.jsonl",
        dataset_hash=b"\3" * 32,
    )
    state = JobState("0x" + "00" * 20, JobStatus.RUNNING, 0, 0, 0, 0, 0, b"\0" * 32)
    job = TrainJob.from_job(Job(id=7, spec=spec, state=state), batch_size=16)
    assert job == TrainJob(
        job_id=7,
        method="sft",
        model_uri="builtin:tiny",
        dataset_uri="/data/x.jsonl",
        dataset_hash=b"\3" * 32,
        batch_size=16,
    )


def test_builtin_model_is_deterministic_and_exports(tmp_path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = hf.PRESETS["tiny"]
    a, b = hf.build(cfg, seed=5), hf.build(cfg, seed=5)
    ha = checkpoint.canonical_hash(dict(a.state_dict()))
    assert ha == checkpoint.canonical_hash(dict(b.state_dict()))
    assert ha != checkpoint.canonical_hash(dict(hf.build(cfg, seed=6).state_dict()))
    for name, p in a.named_parameters():
        assert all(d % 64 == 0 for d in p.shape), name
    out = hf.export(a, tmp_path / "m")
    m = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert checkpoint.canonical_hash(dict(m.state_dict())) == ha
    ids = tok("print(", return_tensors="pt")
    assert tok.decode(ids["input_ids"][0]) == "print("
    gen = m.generate(**ids, max_new_tokens=4, do_sample=False)
    assert gen.shape[1] == ids["input_ids"].shape[1] + 4


def test_model_config_validation() -> None:
    with pytest.raises(ValueError, match="multiple of 64"):
        hf.ModelConfig(hidden=100)
    with pytest.raises(ValueError, match="unknown builtin"):
        hf.model_config("builtin:huge")


def test_corpus_hash_is_checked(tmp_path) -> None:
    path = tmp_path / "c.txt"
    digest = corpus.build_stdlib_corpus(path, max_bytes=50_000)
    data = corpus.load_text(path, digest, ctx=128)
    x, y = data.windows(torch.tensor([0, 1]))
    assert x.shape == (2, 128) and torch.equal(x[0, 1:], y[0, :-1])
    with pytest.raises(corpus.DatasetError, match="sha256"):
        corpus.load_text(path, b"\1" * 32, ctx=128)


def test_external_backend_missing_names_the_install_command(tmp_path) -> None:
    job = tiny_job("cpt", tmp_path / "x")
    with pytest.raises(BackendUnavailable, match="pip install axolotl"):
        make_backend(job, "axolotl")
    with pytest.raises(ValueError, match="unknown backend"):
        make_backend(job, "magic")


def test_faults_slow_and_equivocate() -> None:
    slow = Faults.parse(["slow=3"])
    assert slow.slow == 3.0 and Faults().slow == 1.0
    slept: list[float] = []
    slow.throttle(2.0, slept.append)
    Faults().throttle(2.0, slept.append)  # an honest, normal machine never waits
    assert slept == [4.0]  # 2 s of steps made to take 6 s
    assert Faults.parse(["equivocate=1"]).equivocate_rounds == (1,)
    assert Faults.parse(["ahead", "attack=poison"]).ahead and not Faults().ahead
    assert Faults.parse(["withhold=1"]).withhold_rounds == (1,)
    assert Faults.parse(["late=2"]).late_rounds == (2,)
    for bad in (["slow=0.5"], ["slow=1000"]):
        with pytest.raises(ValueError, match="slow must be in"):
            Faults.parse(bad)
    for bad in (
        ["slow=fast"],
        ["equivocate"],
        ["equivocate=x"],
        ["ahead=1"],
        ["withhold"],
        ["late"],
    ):
        with pytest.raises(ValueError, match="unknown fault"):
            Faults.parse(bad)
    assert Faults.parse(["attack=flip=4"]).attack == Attack("flip", 4.0)
    assert Faults.parse(["attack=push=2"]).attack == Attack("push", 2.0)


def test_a_job_is_refused_when_its_measured_step_time_misses_the_epoch(monkeypatch) -> None:
    """The capacity check times forward and backward on the job's own batches (after one
    warm-up batch) and refuses an epoch this machine cannot finish in time."""
    from types import SimpleNamespace

    import torch

    from dtrain_node.operator import preflight

    clock = iter([0.0, 5.0, 10.0, 13.0])  # warm-up 5 s, then 3 s a batch

    class Backend:
        model = torch.nn.Linear(2, 1)

        def n_items(self) -> int:
            return 100

        def batches(self, idx, batch_size, seed):
            while True:
                yield torch.ones(batch_size, 2)

        def loss(self, batch):
            return self.model(batch).sum()

    monkeypatch.setattr(preflight.time, "perf_counter", lambda: next(clock))
    step_s = preflight.measure_step_s(Backend(), 4, grad_accum=2)
    assert step_s == 6.0, "the second batch's 3 s, times two micro-batches"
    spec = SimpleNamespace(steps_per_epoch=20, sync_interval=2, epoch_duration=120)
    with pytest.raises(preflight.TooSlow, match="an epoch of 120 s needs 154 s here"):
        preflight.fits(SimpleNamespace(spec=spec), step_s)
    preflight.fits(SimpleNamespace(spec=spec), 1.0)  # 20 + 14 + 20 s: it fits


def test_a_restarted_member_serves_the_states_of_its_attempt_to_the_referees(tmp_path) -> None:
    """A member restarted after its epoch (waiting on a challenge) must serve the private
    states it kept: a replay claim has the referees ask for one, and a state not served in
    time catches it. It serves the attempt's states once, and no other attempt's."""
    from types import SimpleNamespace

    from dtrain_node.operator.node import Node
    from dtrain_node.verify import spotcheck

    served: list[str] = []
    node = Node.__new__(Node)
    node.dir, node._states_served = tmp_path, set()
    node.transport = SimpleNamespace(serve_file=lambda sha, path: served.append(sha))
    ring = spotcheck.StateRing(node.job_dir(7), 3, lambda sha, path: None)
    kept = [ring.put(r, f"state {r}".encode()) for r in range(2)]
    old = hashlib.sha256(b"old attempt").hexdigest()
    (ring.dir / f"2-0-{old}.dtps").write_bytes(b"old attempt")
    job = SimpleNamespace(id=7, state=SimpleNamespace(attempt=3))
    for _ in range(2):
        node._serve_transcript(job, None)
    assert served == kept


def test_a_member_that_finds_its_epoch_settled_by_another_logs_that_epochs_settlement(
    tmp_path,
) -> None:
    """A member that reaches FINALIZE after another member settled the job's last epoch reads
    the job as completed and already one epoch on: it still logs the settlement of the epoch
    it trained (with its slashes), not a search for the next epoch's, which never comes."""
    from types import SimpleNamespace

    from dtrain.models import JobStatus
    from dtrain_node.operator.node import Node

    liar = "0x" + "ab" * 20
    settled = [
        SimpleNamespace(name="EpochFinalized", args={"epoch": 0, "jobId": 7}),
        SimpleNamespace(
            name="Slashed",
            args={"epoch": 0, "jobId": 7, "operator": liar, "amount": 5, "reason": 0},
        ),
    ]
    done = SimpleNamespace(state=SimpleNamespace(epoch=1, attempt=3, status=JobStatus.COMPLETED))
    node = Node.__new__(Node)
    node.status, node._entered_why = SimpleNamespace(state=""), ""
    node.stop_now, node.transport, node.dir = threading.Event(), None, tmp_path
    node.cfg = SimpleNamespace(faults=Faults())
    node._first_attempt = {}
    node._params = lambda: SimpleNamespace(challenge_window=0)
    node.bsm = SimpleNamespace(
        job=lambda job_id: done, events=lambda **kw: settled, sender=liar, account=None
    )
    logged: list[tuple[str, dict]] = []
    node._metric = lambda kind, **kw: logged.append((kind, kw))
    node.finalize(7, 3, since=10, epoch=0)
    [(kind, fin)] = logged
    assert kind == "finalized" and fin["epoch"] == 0 and fin["by"] == "other"
    assert [s["operator"] for s in fin["slashed"]] == [liar]

"""Provable UNWORKABLE: a referee votes UNWORKABLE only when the job's own files, fetched
intact, fail to build, read or match their pins (what every honest node reproduces); a file it
cannot fetch at all proves nothing and raises; with no transcript delivered, every round is
empty (a packet nobody shows counts as absent)."""

from __future__ import annotations

import pytest
from eth_utils import to_checksum_address

from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain_node.errors import DatasetError
from dtrain_node.operator import referee
from dtrain_node.operator.node import NodeConfig
from dtrain_node.p2p.files import sha256_file
from dtrain_node.train import tasks
from dtrain_node.train.backend import TrainJob, make_backend
from dtrain_node.verify import evidence


def _job(dataset: str, dataset_hash: bytes, model_hash: bytes) -> Job:
    spec = JobSpec(
        price_per_operator_epoch=1,
        method=Method.SFT,
        steps_per_epoch=8,
        sync_interval=2,
        model_uri="builtin:tiny",
        model_hash=model_hash,
        dataset_uri=dataset,
        dataset_hash=dataset_hash,
    )
    state = JobState("0x" + "00" * 20, JobStatus.RUNNING, 0, 0, 0, 0, 0, b"\0" * 32)
    return Job(id=3, spec=spec, state=state)


@pytest.fixture
def cfg(tmp_path) -> NodeConfig:
    return NodeConfig(key="0x01", rpc_url="", contract="", data_dir=tmp_path / "r", job_id=3)


@pytest.fixture
def workable(tmp_path) -> Job:
    data = tmp_path / "sft.jsonl"
    tasks.make_dataset(data, "sft", tasks.addition(40, digits=2, seed=0))
    pin = make_backend(TrainJob.from_job(_job(str(data), sha256_file(data), b"\0" * 32), 4))
    return _job(str(data), sha256_file(data), pin.start_pin)


def test_a_workable_job_is_not_unworkable(workable, cfg) -> None:
    assert referee.unworkable(workable, cfg) is None


def test_a_dataset_failing_its_pin_proves_unworkable(workable, cfg) -> None:
    spec = workable.spec
    job = _job(spec.dataset_uri, bytes(31) + b"\1", spec.model_hash)
    why = referee.unworkable(job, cfg)
    assert why is not None and why.startswith("DatasetError:"), why


def test_a_model_failing_its_pin_proves_unworkable(workable, cfg) -> None:
    spec = workable.spec
    job = _job(spec.dataset_uri, spec.dataset_hash, b"\7" * 32)
    why = referee.unworkable(job, cfg)
    assert why is not None and why.startswith("CheckpointInvalid:"), why


def test_a_record_that_does_not_parse_proves_unworkable(tmp_path, workable, cfg) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "1+1="}\n')  # an SFT record without its completion
    job = _job(str(bad), sha256_file(bad), workable.spec.model_hash)
    why = referee.unworkable(job, cfg)
    assert why is not None and "missing key 'completion'" in why, why


def test_a_dataset_nobody_serves_proves_nothing(workable, cfg) -> None:
    """Fetching fails (nothing listens on port 1): the referee cannot tell a caller's broken
    data from a server that is down, so it raises instead of voting UNWORKABLE."""
    sha = workable.spec.dataset_hash
    job = _job(f"http://127.0.0.1:1/data.jsonl#sha256={sha.hex()}", sha, workable.spec.model_hash)
    with pytest.raises(DatasetError):
        referee.unworkable(job, cfg)


def test_no_transcript_delivered_is_every_round_empty(workable) -> None:
    contract = to_checksum_address("0x" + "ab" * 20)  # as the chain names it
    t = referee.empty(workable, epoch=0, attempt=5, chain_id=31337, contract=contract)
    assert len(t.rounds) == 8 // 2 and all(r == () for r in t.rounds)
    assert evidence.decode(t.encode()) == t
    evidence.verify(t, ["0x" + "11" * 20])  # nothing to refuse

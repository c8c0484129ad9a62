"""What `dtrain serve --model-dir` accepts: only a folder whose CHECKPOINT_SHA256 names the
job's on-chain final checkpoint AND whose weights re-hash to it. A folder that says the right
hash over other weights is refused in one line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from dtrain.errors import DtrainError
from dtrain.models import Job, JobSpec, JobState, JobStatus, Method
from dtrain_node.serve.source import ModelRefused, Verified, exported
from dtrain_node.train import checkpoint
from dtrain_node.train.start import start_model


def _job(digest: bytes, status: JobStatus = JobStatus.COMPLETED) -> Job:
    spec = JobSpec(price_per_operator_epoch=1, method=Method.CPT, model_uri="builtin:tiny")
    state = JobState("0x" + "00" * 20, status, 1, 0, 0, 0, 0, digest)
    return Job(id=3, spec=spec, state=state)


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    """A builtin:tiny model exported as `dtrain job fetch` exports it, and its hash."""
    start = start_model("builtin:tiny")
    model = start.fresh()
    digest = checkpoint.canonical_hash(dict(model.state_dict()))
    out = start.export(model, tmp_path_factory.mktemp("export") / "model")
    (out / "CHECKPOINT_SHA256").write_text(digest.hex() + "\n")
    return out, digest


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "copy"))


def test_the_job_s_own_export_is_served(export: tuple[Path, bytes]) -> None:
    folder, digest = export
    v = exported(_job(digest), folder)
    assert isinstance(v, Verified) and v.checkpoint == digest and v.model is not None
    assert checkpoint.canonical_hash(dict(v.model.state_dict())) == digest


def test_right_hash_file_over_other_weights_is_refused(
    export: tuple[Path, bytes], tmp_path: Path
) -> None:
    folder, digest = export
    bad = _copy(folder, tmp_path)
    weights = load_file(bad / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name].clone()
    weights[name].view(-1)[0] += 1e-3  # one number
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelRefused, match="its weights hash to 0x") as err:
        exported(_job(digest), bad)
    assert "\n" not in str(err.value) and "refusing to serve it" in str(err.value)
    assert isinstance(err.value, DtrainError)  # the CLI prints it as one `error: ...` line


def test_half_precision_weights_are_other_weights(
    export: tuple[Path, bytes], tmp_path: Path
) -> None:
    folder, digest = export
    bad = _copy(folder, tmp_path)
    weights = {k: v.to(torch.float16) for k, v in load_file(bad / "model.safetensors").items()}
    save_file(weights, str(bad / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelRefused, match="weights hash to"):
        exported(_job(digest), bad)


def test_another_checkpoint_s_folder_is_refused(export: tuple[Path, bytes]) -> None:
    folder, _ = export
    with pytest.raises(ModelRefused, match="not job 3's final checkpoint 0xabab"):
        exported(_job(b"\xab" * 32), folder)


def test_a_folder_without_the_hash_file_is_refused(
    export: tuple[Path, bytes], tmp_path: Path
) -> None:
    folder, digest = export
    bare = _copy(folder, tmp_path)
    (bare / "CHECKPOINT_SHA256").unlink()
    with pytest.raises(ModelRefused, match="no CHECKPOINT_SHA256"):
        exported(_job(digest), bare)


def test_a_folder_that_does_not_load_is_refused(export: tuple[Path, bytes], tmp_path: Path) -> None:
    folder, digest = export
    broken = _copy(folder, tmp_path)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ModelRefused, match="does not load as a model"):
        exported(_job(digest), broken)


def test_a_lora_export_is_sent_to_the_fetching_path(
    export: tuple[Path, bytes], tmp_path: Path
) -> None:
    folder, digest = export
    lora = _copy(folder, tmp_path)
    (lora / "adapter").mkdir()
    with pytest.raises(ModelRefused, match="without --model-dir"):
        exported(_job(digest), lora)


def test_a_job_that_has_not_completed_has_no_model_to_serve(
    export: tuple[Path, bytes],
) -> None:
    folder, digest = export
    with pytest.raises(DtrainError, match="job 3 is running, not completed"):
        exported(_job(digest, JobStatus.RUNNING), folder)

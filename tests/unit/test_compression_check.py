"""A caller who wants its escrow back without paying anyone: the contract takes any top-k above 0
and the recipe any token k up to 4096, so a job can name a compression no member can sync (more
coefficients than a 64x64 chunk holds, a packet over the gossip limit). Every honest node would pass
its pre-flight, bond a seat and then fail at the epoch's start. The job is refused where its
inputs are checked: the node's pre-flight (no seat is bonded), a referee's re-execution
(`PROVES_UNWORKABLE`), a member that joined anyway (`UNWORKABLE_ERRORS`: it votes UNWORKABLE)
and `dtrain job submit` (before any transaction)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dtrain import pins
from dtrain.errors import ConfigError
from dtrain.models import Job, JobSpec, JobState, JobStatus
from dtrain.recipe import Recipe
from dtrain_node.errors import CompressionInvalid
from dtrain_node.operator import epoch, preflight
from dtrain_node.optim import codec, settings
from dtrain_node.optim.optimizer import DeMo
from dtrain_node.train.start import start_model

SPEC = JobSpec(price_per_operator_epoch=1, model_uri="builtin:tiny")


def _model(uri: str = "builtin:tiny") -> torch.nn.Module:
    return start_model(uri).fresh()


def test_the_checked_layout_is_the_one_members_build() -> None:
    model = _model("builtin:small")
    spec8 = replace(SPEC, max_operators=8, topk_per_chunk=6)
    for spec, recipe in ((SPEC, None), (spec8, Recipe(token_topk=16)), (spec8, None)):
        checked = settings.check_compression(spec, recipe, model)
        cfg = settings.demo_config(None, Job(1, spec, None), recipe or Recipe())  # type: ignore[arg-type]
        assert checked == DeMo.of_model(model, cfg).spec


@pytest.mark.parametrize(
    ("model", "spec", "recipe", "why"),
    [
        ("builtin:tiny", replace(SPEC, topk_per_chunk=5000), None, "k2d must be in"),  # > 64x64
        ("builtin:small", replace(SPEC, topk_per_chunk=4096), None, "gossip limit"),
        ("builtin:tiny", SPEC, Recipe(token_topk=4096, token_rows=64), None),  # 133 kB: fine
    ],
)
def test_a_compression_no_member_can_sync_is_refused(model, spec, recipe, why) -> None:
    m = _model(model)
    if why is None:
        assert settings.check_compression(spec, recipe, m).packet_bytes <= codec.MAX_BYTES
        return
    with pytest.raises(CompressionInvalid, match=why):
        settings.check_compression(spec, recipe, m)


def _chain_job(tmp_path, **spec) -> Job:
    data = tmp_path / "text.txt"
    data.write_text("the quick brown fox jumps over the lazy dog\n" * 400)
    pinned = replace(
        SPEC,
        dataset_uri=str(data),
        dataset_hash=pins.dataset_hash(str(data)),
        model_hash=pins.model_hash("builtin:tiny"),
        **spec,
    )
    state = JobState("0x" + "00" * 20, JobStatus.OPEN, 0, 0, 0, 0, 0, b"\0" * 32)
    return Job(id=7, spec=pinned, state=state)


def test_the_preflight_refuses_the_job_before_a_seat_is_bonded(tmp_path) -> None:
    assert preflight.check(_chain_job(tmp_path), 8) is None
    why = preflight.check(_chain_job(tmp_path, topk_per_chunk=5000), 8)
    assert why is not None and why.startswith("CompressionInvalid: ") and "5000" in why
    assert issubclass(CompressionInvalid, preflight.PROVES_UNWORKABLE)  # referees agree
    assert issubclass(CompressionInvalid, epoch.UNWORKABLE_ERRORS)  # a member votes so


def test_job_submit_refuses_it_before_any_transaction(tmp_path) -> None:
    data = _chain_job(tmp_path).spec.dataset_uri
    pin, sync = pins.check_job("builtin:tiny", data, "cpt", None, compression=(4, 1, 3))
    assert pin and sync is not None and sync["topk"] == 4 and sync["packet_bytes"] > 0
    with pytest.raises(ConfigError, match=r"this job could not train: .*4096"):
        pins.check_job("builtin:small", data, "cpt", None, compression=(4096, 1, 3))


def test_a_default_topk_over_the_gossip_limit_is_lowered_to_the_largest_that_fits(
    tmp_path,
) -> None:
    """`job submit`'s default top-k (coverage 1 in a short epoch) can ask more of a large
    model than one gossip message carries: it is lowered, the caller's own choice is not."""
    data = _chain_job(tmp_path).spec.dataset_uri
    small = ("builtin:small", data, "cpt", None)
    _, sync = pins.check_job(*small, compression=(4096, 1, 3), fit_topk=True)
    assert sync is not None and 1 <= sync["topk"] < 4096
    assert sync["packet_bytes"] <= codec.MAX_BYTES
    with pytest.raises(ConfigError, match="gossip limit"):
        pins.check_job(*small, compression=(sync["topk"] + 1, 1, 3))
    _, kept = pins.check_job(*small, compression=(8, 1, 3), fit_topk=True)
    assert kept is not None and kept["topk"] == 8  # it fits: nothing lowered

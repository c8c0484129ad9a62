"""The job spec as a gateway reads it: every field round-trips, and a body that is not a spec
is refused field by field before anyone pays."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dtrain.models import JobSpec, Method
from dtrain.paidjobs import SpecError, spec_from_json, spec_to_json

SPEC = JobSpec(
    price_per_operator_epoch=10_000,
    total_epochs=3,
    method=Method.SFT,
    model_hash=bytes(range(32)),
    model_uri="builtin:tiny",
    dataset_hash=b"\xff" * 32,
    dataset_uri="/data/train.jsonl",
    tee_required=True,
    seat_bond=10**17,
    recipe_uri="r.toml",
)


def test_a_spec_round_trips_through_json() -> None:
    wire = json.loads(json.dumps(spec_to_json(SPEC)))
    assert wire["method"] == "sft" and wire["model_hash"] == "0x" + bytes(range(32)).hex()
    assert spec_from_json(wire) == SPEC
    assert spec_from_json({"price_per_operator_epoch": 1}) == JobSpec(price_per_operator_epoch=1)
    assert spec_from_json({**wire, "method": 3}).method is Method.GRPO


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"price": 1}, "unknown job spec field(s): price"),
        ({"price_per_operator_epoch": None}, "price_per_operator_epoch: must be a non-negative"),
        ({"total_epochs": -1}, "total_epochs: must be a non-negative"),
        ({"total_epochs": True}, "total_epochs: must be a non-negative"),
        ({"total_epochs": 2**256}, "total_epochs: must be a non-negative"),
        ({"steps_per_epoch": "100"}, "steps_per_epoch: must be a non-negative"),
        ({"method": "rlhf"}, "method: 'rlhf' is not one of cpt, sft, dpo, grpo"),
        ({"method": 9}, "method: 9 is not one of"),
        ({"model_hash": "0x1234"}, "model_hash: must be 32 bytes"),
        ({"dataset_hash": "zz" * 32}, "dataset_hash: must be 32 bytes"),
        ({"model_uri": 5}, "model_uri: must be a string"),
        ({"dataset_uri": "x" * 5000}, "dataset_uri: must be a string of at most 2048"),
        ({"tee_required": 1}, "tee_required: must be true or false"),
    ],
)
def test_a_body_that_is_not_a_spec_is_refused_by_field(
    change: dict[str, Any], message: str
) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_json({**spec_to_json(SPEC), **change})


def test_a_spec_must_be_an_object_with_a_price() -> None:
    with pytest.raises(SpecError, match="must be a JSON object"):
        spec_from_json([1, 2])
    with pytest.raises(SpecError, match="price_per_operator_epoch is required"):
        spec_from_json({"total_epochs": 1})

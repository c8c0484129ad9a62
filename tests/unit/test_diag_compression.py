"""The pure functions of scripts/diag_compression.py (the per-tensor compression diagnostic)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import diag_compression as dc  # noqa: E402


def test_tensor_kinds_of_the_builtin_llama_and_gpt2_names() -> None:
    k = dc.tensor_kind
    assert k("model.embed_tokens.weight", (320, 128)) == "embedding"
    assert k("lm_head.weight", (320, 128)) == "head"
    assert k("model.layers.0.self_attn.q_proj.weight", (128, 128)) == "attention"
    assert k("model.layers.1.mlp.down_proj.weight", (128, 256)) == "mlp"
    assert k("model.layers.0.input_layernorm.weight", (128,)) == "norm"
    assert k("model.norm.weight", (128,)) == "norm"
    assert k("transformer.h.0.ln_1.bias", (768,)) == "norm"
    assert k("transformer.h.0.attn.c_attn.bias", (2304,)) == "bias"
    assert k("transformer.wte.weight", (50257, 768)) == "embedding"
    assert k("transformer.h.0.mlp.c_fc.weight", (768, 3072)) == "mlp"


def test_energy_kept_per_chunk() -> None:
    coef = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    # chunk 0: top-1 keeps 16/25; chunk 1: 1/4; the empty chunk is left out
    assert math.isclose(dc.energy_kept(coef, 1), (16 / 25 + 1 / 4) / 2)
    assert math.isclose(dc.energy_kept(coef, 2), (1.0 + 0.5) / 2)
    assert dc.energy_kept(torch.zeros(2, 4), 1) == 1.0
    # chunk 2 is empty, chunk 1 holds 4 / (29 / 3) of the mean: one weak chunk of three
    assert math.isclose(dc.weak_chunks(coef), 1 / 3)


def test_errors_ratios_and_growth() -> None:
    ref = torch.tensor([3.0, 4.0])
    assert dc.rel_error(ref, ref) == 0.0
    assert math.isclose(dc.rel_error(torch.zeros(2), ref), 1.0)
    assert dc.rel_error(torch.zeros(2), torch.zeros(2)) == 0.0
    assert dc.rel_error(ref, torch.zeros(2)) == math.inf
    assert math.isclose(dc.cosine(ref, -2 * ref), -1.0)
    assert dc.cosine(ref, torch.zeros(2)) == 0.0
    assert math.isclose(dc.rel_ratio(ref / 2, ref), 0.5)
    assert math.isclose(dc.growth([1, 1, 2, 2, 3, 3, 4, 4]), 4.0)
    # bf16 ring: 2 (N - 1) / N x 2 bytes per value
    assert dc.ring_upload(1000, 4) == 3000 and dc.ring_upload(1000, 8) == 3500


def test_compress_groups_split_by_kind() -> None:
    named = [
        ("model.embed_tokens.weight", torch.zeros(320, 128)),
        ("model.layers.0.mlp.up_proj.weight", torch.zeros(256, 128)),
        ("model.norm.weight", torch.zeros(128)),
    ]
    arm = dc.Arm("x", k=4, k_by_kind=(("embedding", 16), ("norm", 8)))
    groups = dc.compress_groups(arm, [named[0], named[2]], 4)
    assert {(c.k2d, c.k1d): n for c, n in groups.items()} == {
        (16, 1): {"model.embed_tokens.weight"},
        (4, 8): {"model.norm.weight"},
    }


def test_split_blocks_share_the_parameters_storage() -> None:
    emb = torch.nn.Parameter(torch.arange(128.0 * 64).reshape(128, 64))
    norm = torch.nn.Parameter(torch.ones(64))
    named = [("model.embed_tokens.weight", emb), ("model.norm.weight", norm)]
    out = dc.split_blocks(named, dc.Arm("x", split=("embedding",)))
    assert [n for n, _ in out] == [
        "model.embed_tokens.weight[0:64,0:64]",
        "model.embed_tokens.weight[64:128,0:64]",
        "model.norm.weight",
    ]
    block = out[1][1]
    assert block.is_leaf and block.requires_grad and torch.equal(block, emb.detach()[64:])
    block.data.fill_(7.0)  # what DeMo's reset to theta_sync does
    assert bool((emb.detach()[64:] == 7.0).all()) and emb.detach()[0, 1] == 1.0


def test_split_rows_and_their_kind() -> None:
    emb = torch.nn.Parameter(torch.zeros(3, 128))
    out = dc.split_blocks([("lm_head.weight", emb)], dc.Arm("x", rows=("head",)))
    assert [(n, tuple(t.shape)) for n, t in out] == [
        (f"lm_head.weight[{r}]", (128,)) for r in range(3)
    ]
    arm = dc.Arm("x", k=4, rows=("head",), k_by_kind=(("head", 2),))
    groups = dc.compress_groups(arm, out, 4)
    assert [(c.k2d, c.k1d) for c in groups] == [(4, 2)]

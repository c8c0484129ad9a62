"""The energy shares of scripts/diag_energy.py: a rank-1 matrix is all rank-1 image, a matrix
made of k DCT basis patterns per chunk is all top-k picks, and noise is neither."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import diag_energy as de  # noqa: E402


def test_a_rank_one_matrix_is_all_rank_one_image() -> None:
    torch.manual_seed(0)
    x = torch.outer(torch.randn(128), torch.randn(64))
    r1, r2, _ = de.shares(x, 4)
    assert r1 > 0.999 and r2 > 0.999


def test_k_dct_patterns_per_chunk_are_all_top_k_picks_and_noise_is_not() -> None:
    torch.manual_seed(0)
    ch = torch.zeros(2, 4096)
    ch[:, [3, 70, 900, 4000]] = torch.randn(2, 4)
    x = de.dct.idct(ch, (128, 64))
    assert de.shares(x, 4)[2] > 0.999
    r1, _, top = de.shares(torch.randn(128, 64), 4)
    assert top < 0.02 and r1 < 0.2  # Gaussian: the 4 largest of 4096 hold about 1.2%


def test_matrices_are_sorted_into_attention_and_mlp() -> None:
    assert de.kind("model.layers.0.self_attn.q_proj.weight") == "attention"
    assert de.kind("model.layers.0.mlp.up_proj.weight") == "MLP"
    assert de.kind("model.embed_tokens.weight") is None

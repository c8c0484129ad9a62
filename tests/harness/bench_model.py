"""Small causal transformer (nanoGPT-style) over bytes; every dimension a multiple of 64."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256  # bytes
    ctx: int = 128
    d: int = 256
    n_layer: int = 4
    n_head: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab", "ctx", "d"):
            v = getattr(self, name)
            if v <= 0 or v % 64:
                raise ValueError(f"{name} must be a positive multiple of 64, got {v}")
        if self.n_layer < 1 or self.n_head < 1 or self.d % self.n_head:
            raise ValueError(f"need n_layer >= 1 and d % n_head == 0: {self.d} % {self.n_head}")


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.h = c.n_head
        self.ln1 = nn.LayerNorm(c.d, bias=False)
        self.qkv = nn.Linear(c.d, 3 * c.d, bias=False)
        self.proj = nn.Linear(c.d, c.d, bias=False)
        self.ln2 = nn.LayerNorm(c.d, bias=False)
        self.fc = nn.Linear(c.d, 4 * c.d, bias=False)
        self.out = nn.Linear(4 * c.d, c.d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=2)
        q, k, v = (t.view(B, T, self.h, D // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Token + position embeddings, pre-norm blocks, tied output head."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c.vocab, c.d)
        self.pos = nn.Embedding(c.ctx, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.ln = nn.LayerNorm(c.d, bias=False)
        for n, p in self.named_parameters():
            if p.dim() == 2:
                # residual projections scaled down with depth (GPT-2)
                std = (
                    0.02 / math.sqrt(2 * c.n_layer)
                    if n.endswith(("proj.weight", "out.weight"))
                    else 0.02
                )
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.ln(x) @ self.tok.weight.T
        if targets is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def numel(self) -> int:
        return sum(p.numel() for p in self.parameters())

"""How a model's parameters become the tensors of a DeMo packet.

Every parameter is one packet tensor, except token tensors (the input embedding and the
output head) under `CompressConfig.token_rows`: those are cut into blocks of that many rows,
each its own packet tensor with its own scale exponent. A token row moves only when its token
is in some batch, so with one scale per tensor a block no batch touched would still send k
values at the busy blocks' magnitude (1-bit levels have no zero); with its own scale an
untouched block sends them at 2^EXP_MIN, below any parameter's precision. The blocks are
views: the shared state stays one tensor per parameter.

With `CompressConfig.k_mean` an output head's whole blocks of rows beyond the tokenizer's length
are no packet tensors: one more, the head's mean row (a vector), carries the mean of those
rows' moves, and the blocks tokens reach send their rows' moves less that mean (`parts`,
`deltas`); the mean row's update is applied to every row of the head (`views` gives the whole
parameter for it, and the update broadcasts over its rows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace

import torch

from dtrain_node.optim.codec import MEAN, TOKEN, Spec
from dtrain_node.optim.compress import K_AUTO, CompressConfig

K_TOKEN_MAX = 64  # auto k per token chunk: at most 1/64 of a 64x64 chunk
BUDGET = 1 / 1000  # auto k: a sync's upload as a share of a dense bf16 ring all-reduce's
ENVELOPES = 512  # bytes a sync's upload adds to its packet: the signed gossip envelopes of the
# packet and of its commitment (p2p/envelope.py), rounded up


@dataclass(frozen=True)
class Segment:
    """Packet tensor from parameter `param`: rows [start, stop), or the whole parameter when
    stop is 0; or, when `mean`, the mean of those rows, whose update goes to every row of the
    parameter."""

    param: int
    start: int = 0
    stop: int = 0
    mean: bool = False

    def of(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.rows(tensors[self.param])

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """This segment's rows of its parameter `t`."""
        return t[self.start : self.stop] if self.stop else t


def plan(
    named: Sequence[tuple[str, tuple[int, ...]]],
    cfg: CompressConfig,
    tokens: Collection[str] = (),
    heads: Collection[str] = (),
    reach: int = 0,
) -> tuple[Spec, tuple[Segment, ...]]:
    """The packet spec and the segments of parameters (name, shape) in order; `tokens` names
    the token tensors (matrices only; ignored when cfg compresses them like the rest), `heads`
    those of them that are output heads. `reach` (0: all) is how many rows a token can reach
    (the tokenizer's length): with cfg.k_mean, a head's whole blocks of rows beyond it are no
    packet tensors, and those rows move by the head's mean row alone (the mean of their moves,
    which no batch's tokens set apart), so the budget goes to the rows tokens reach. A head
    without such blocks has no mean row."""
    unknown = set(tokens) - {n for n, _ in named}
    if unknown:
        raise ValueError(f"token tensors not among the parameters: {sorted(unknown)}")
    if set(heads) - set(tokens):
        raise ValueError(
            f"output heads that are not token tensors: {sorted(set(heads) - set(tokens))}"
        )
    if not cfg.tokens_apart:
        tokens = ()
    names, shapes, marks, parents, segs, weights = [], [], [], [], [], []
    for p, (name, shape) in enumerate(named):
        token = name in tokens and len(shape) == 2
        rows = cfg.token_rows if token and shape[0] > cfg.token_rows else 0
        end = _covered(shape[0], rows, reach) if token else 0
        mean = token and bool(cfg.k_mean) and name in heads and end < shape[0]
        end = end if mean else (shape[0] if rows else 0)
        for start in range(0, end, rows) if rows else (0,):
            stop = min(start + rows, end) if rows else (end if mean else 0)
            names.append(f"{name}[{start}:{stop}]" if stop else name)
            shapes.append((stop - start, *shape[1:]) if stop else tuple(shape))
            marks.append(TOKEN if token else 0)
            parents.append(p)
            segs.append(Segment(p, start, stop))
            weights.append(1)
        if mean:
            names.append(f"{name}[mean {end}:]")
            shapes.append((shape[1],))
            marks.append(MEAN)
            parents.append(p)
            segs.append(Segment(p, end, shape[0], mean=True))
            weights.append(shape[0])
    split = len(segs) != len(named)
    numel = sum(math.prod(shape) for _, shape in named)

    def spec_for(c: CompressConfig) -> Spec:
        marked = tuple(marks) if any(marks) else ()
        w = tuple(weights) if MEAN in marks else ()
        return Spec(tuple(names), tuple(shapes), c, marked, tuple(parents) if split else (), w)

    if cfg.k_token == K_AUTO:
        cfg = replace(cfg, k_token=auto_k(spec_for, cfg, numel) if any(marks) else cfg.k2d)
    return spec_for(cfg), tuple(segs)


def _covered(n: int, rows: int, reach: int) -> int:
    """The rows of an n-row head that keep blocks: up to the block that holds row reach - 1."""
    if not 0 < reach < n:
        return n
    return min(n, -(-reach // rows) * rows) if rows else reach


def auto_k(spec_for: Callable[[CompressConfig], Spec], cfg: CompressConfig, numel: int) -> int:
    """The token tensors' k for k_token = K_AUTO: the largest whose packet and its ENVELOPES
    stay within BUDGET of a member's upload in a dense bf16 ring all-reduce among cfg.ring
    members, searched in [k2d, K_TOKEN_MAX], so that the token tensors take the bytes the other
    tensors leave; or, when the token tensors are most of the model's parameters (a folder's
    50,257-row embedding, most of whose rows no batch reaches), in [1, K_TOKEN_MAX], since
    only they can bring its packet within the budget. Otherwise, and when no k fits, k2d:
    the token tensors lose the most under compression (docs/benchmarks.md), so they are not
    starved to save bytes the other tensors spend anyway."""
    base = spec_for(replace(cfg, k_token=cfg.k2d))
    budget = ring_upload(numel, cfg.ring) * BUDGET - ENVELOPES  # a ring sends every parameter
    tokens = sum(math.prod(sh) for i, sh in enumerate(base.shapes) if base.is_token(i))
    most = 2 * tokens > base.numel
    best = 0
    for k in range(1 if most else cfg.k2d, min(K_TOKEN_MAX, cfg.chunk**2) + 1):  # bytes grow
        if spec_for(replace(cfg, k_token=k)).packet_bytes > budget:
            break
        best = k
    return best or cfg.k2d


def ring_upload(numel: int, members: int) -> float:
    """Bytes one member uploads in a bf16 ring all-reduce of numel parameters: 2(N-1)/N x 2."""
    return 4 * (members - 1) / members * numel


def views(tensors: Sequence[torch.Tensor], segs: Sequence[Segment]) -> list[torch.Tensor]:
    """Where each packet tensor's update goes in per-parameter `tensors`: views where a
    parameter is cut, the whole parameter for a mean row (its update broadcasts over the rows)."""
    return [tensors[s.param] if s.mean else s.of(tensors) for s in segs]


def deltas(
    a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], segs: Sequence[Segment]
) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """The parts of a - b as (minuends, subtrahends) for Feedback.fold: views of both where no
    mean row is sent (fold subtracts them chunk by chunk), and for a parameter with a mean row
    its parts of one difference taken once and centred in place (subtrahend None): one copy of
    a head per round, not one per side."""
    centred = {}
    for s in segs:
        if s.mean:
            d = a[s.param].float() - b[s.param].float()
            m = s.rows(d).mean(0)
            centred[s.param] = (d.sub_(m), m)
    out_a: list[torch.Tensor] = []
    out_b: list[torch.Tensor | None] = []
    for s in segs:
        if s.param in centred:
            d, m = centred[s.param]
            out_a.append(m if s.mean else s.rows(d))
            out_b.append(None)
        else:
            out_a.append(s.of(a))
            out_b.append(s.of(b))
    return out_a, out_b


def parts(tensors: Sequence[torch.Tensor], segs: Sequence[Segment]) -> list[torch.Tensor]:
    """The packet tensors' values of per-parameter `tensors`: views where a parameter is cut
    and no mean row is sent; with a mean row, that mean (of the rows beyond the blocks) and
    every block's rows less it. Linear, so the parts of a difference are the differences of
    the parts."""
    means = {s.param: s.of(tensors).float().mean(0) for s in segs if s.mean}

    def part(s: Segment) -> torch.Tensor:
        if s.mean:
            return means[s.param]
        x = s.of(tensors)
        return x - means[s.param] if s.param in means else x

    return [part(s) for s in segs]


def token_names(model: torch.nn.Module) -> tuple[str, ...]:
    """Names of the model's trainable input-embedding and output-head weights (Hugging Face
    `get_input_embeddings` / `get_output_embeddings`; a tied head is the embedding itself)."""
    return _named_weights(model, ("get_input_embeddings", "get_output_embeddings"))


def head_names(model: torch.nn.Module) -> tuple[str, ...]:
    """Names of the model's trainable output-head weights (the embedding, when tied)."""
    return _named_weights(model, ("get_output_embeddings",))


def _named_weights(model: torch.nn.Module, getters: Sequence[str]) -> tuple[str, ...]:
    found = []
    for get in getters:
        fn = getattr(model, get, None)
        try:
            module = fn() if callable(fn) else None
        except (NotImplementedError, AttributeError):
            module = None
        w = getattr(module, "weight", None)
        if isinstance(w, torch.Tensor):
            found.append(w)
    return tuple(
        n for n, p in model.named_parameters() if p.requires_grad and any(p is w for w in found)
    )

"""DeMo: decoupled momentum with compressed, exactly aggregated syncs.

One optimizer, two modes (see docs/demo-optimizer.md):

- paper (the DeMo paper): every step is a sync. e = beta * e + grad; send the top-k DCT part of
  e (removed from e); theta_sync -= lr * sign(mean of what everybody sent); theta = theta_sync.
- local (DiLoCo/SparseLoCo family): K inner AdamW steps on theta_local, then
  delta = theta_sync - theta_local; e = beta * e + delta; send; theta_sync -= lr * U (or
  lr * sign(U)); theta_local = theta_sync.

The shared state theta_sync depends only on the packets (aggregate.py makes it bitwise exact);
local training (inner AdamW, forward/backward) need not be deterministic.

Transport is injected: `sync(gather)` calls gather(packet) -> [(sender, packet bytes), ...] with
every member's packet for this round, own included. For asynchronous transports use the two
halves directly: `packet = opt.prepare()`, publish/collect, then `opt.apply(packets)`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from dtrain_node.optim import codec, inverse, packed, segments, select
from dtrain_node.optim.aggregate import Aggregate, aggregate
from dtrain_node.optim.codec import PacketError
from dtrain_node.optim.compress import CompressConfig
from dtrain_node.optim.feedback import Feedback
from dtrain_node.optim.robust import RobustConfig, screen_weighted

Gather = Callable[[bytes], Sequence[tuple[Hashable, bytes]]]


@dataclass(frozen=True)
class DeMoConfig:
    """DeMo hyper-parameters. lr / weight_decay act on theta_sync (outer step, all nodes);
    inner_* configure the local AdamW of local mode (ignored in paper mode)."""

    mode: Literal["paper", "local"] = "local"
    sync_interval: int = 1  # K: inner steps per sync; paper mode requires 1
    lr: float = 1.0
    beta: float = 0.9  # decay of the error-feedback momentum e
    sign: bool = False  # outer step lr * sign(U) instead of lr * U
    # U averages each DCT coefficient over the senders that sent it, not over all senders
    per_coefficient_mean: bool = False
    # local mode: e loses what the shared state moved (every member's sent part, averaged), not
    # what this member sent; e is then what it wants that the job has not done yet
    shared_feedback: bool = False
    weight_decay: float = 0.0  # decoupled, on theta_sync at each sync
    inner_lr: float = 1e-3
    inner_betas: tuple[float, float] = (0.9, 0.95)
    inner_weight_decay: float = 0.0
    compress: CompressConfig = field(default_factory=CompressConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    max_packet_bytes: int = codec.MAX_BYTES

    def __post_init__(self) -> None:
        if self.mode not in ("paper", "local"):
            raise ValueError(f"mode must be 'paper' or 'local', got {self.mode!r}")
        if self.sync_interval < 1:
            raise ValueError(f"sync_interval must be >= 1, got {self.sync_interval}")
        if self.mode == "paper" and self.sync_interval != 1:
            raise ValueError(
                f"paper mode syncs every step: sync_interval 1, not {self.sync_interval}"
            )
        if not (self.lr > 0 and self.inner_lr > 0):
            raise ValueError(f"learning rates must be > 0, got lr={self.lr}, inner={self.inner_lr}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {self.beta}")
        if self.shared_feedback and self.mode != "local":
            raise ValueError("shared_feedback needs local mode: paper mode's e holds gradients")
        if self.weight_decay < 0 or self.weight_decay * self.lr >= 1:
            raise ValueError(f"need 0 <= weight_decay * lr < 1, got {self.weight_decay * self.lr}")


@dataclass
class SyncStats:
    """What one sync did. `applied` are the senders whose packets made up the update (canonical
    order); `rejected` maps a sender to the reason its packet was dropped as malformed;
    `excluded` maps a sender whose valid packet the robust rule left out to the rule's reason
    (robust.py). Neither rejected nor excluded senders are in `applied`. `clipped` maps an
    applied sender whose update the rule's bound scaled down to the largest power of two it
    was divided by (a member far above the others' norm, honest or not); `distrusted` are the
    applied senders the trust rule scaled down (pointing nowhere the others point) and
    `copies` the groups of applied senders whose updates were near copies of each other: what
    a node reports as a suspected coalition."""

    bytes_sent: int = 0
    applied: tuple[Hashable, ...] = ()
    rejected: dict[Hashable, str] = field(default_factory=dict)
    excluded: dict[Hashable, str] = field(default_factory=dict)
    clipped: dict[Hashable, int] = field(default_factory=dict)
    distrusted: tuple[Hashable, ...] = ()
    copies: tuple[tuple[Hashable, ...], ...] = ()
    compress_s: float = 0.0
    aggregate_s: float = 0.0
    screen_s: float = 0.0
    aggregate: Aggregate | None = None


class DeMo:
    """DeMo optimizer over a fixed, ordered set of named parameters.

    Construct it from `model.named_parameters()` (order and names define the packet layout);
    `sender` is this node's id (ids of one job must be distinct and mutually sortable, e.g.
    lowercase hex addresses). Call `loss.backward()` then `step(gather)` every training step;
    it returns SyncStats on sync steps and None otherwise. `tokens` names the token tensors
    (input embedding, output head: segments.token_names), compressed as cfg.compress says.
    """

    def __init__(
        self,
        named_params: Iterable[tuple[str, torch.nn.Parameter]],
        cfg: DeMoConfig,
        sender: Hashable = 0,
        tokens: Collection[str] = (),
        heads: Collection[str] = (),
        reach: int = 0,
    ) -> None:
        items = [(n, p) for n, p in named_params if p.requires_grad]
        if not items:
            raise ValueError("no trainable parameters")
        self.cfg, self.sender = cfg, sender
        self.names = tuple(n for n, _ in items)
        self.params = [p for _, p in items]
        named = [(n, tuple(p.shape)) for n, p in items]
        self.spec, self.segs = segments.plan(named, cfg.compress, tokens, heads, reach)
        if self.spec.packet_bytes > cfg.max_packet_bytes:
            raise ValueError(
                f"packet of {self.spec.packet_bytes} bytes exceeds limit {cfg.max_packet_bytes}"
            )
        # The shared state and the error feedback live on the CPU whatever the model's device:
        # every node computes them with the same CPU arithmetic, so they stay bitwise identical
        # between a node training on a GPU and one on a CPU.
        ks = [t[2] for t in self.spec.layout]
        self.feedback = Feedback(self.spec.shapes, cfg.compress, ks)
        inverse.warm()
        packed.warm()
        select.warm()
        self.steps = 0
        self._compress_s = 0.0
        self._sent: list | None = None  # shared_feedback: what this round's take sent
        self.inner: torch.optim.Optimizer | None = None
        self.theta_sync = [p.detach().to("cpu", copy=True) for p in self.params]
        if cfg.mode == "local":
            self.inner = torch.optim.AdamW(
                self.params,
                lr=cfg.inner_lr,
                betas=cfg.inner_betas,
                weight_decay=cfg.inner_weight_decay,
            )

    @classmethod
    def of_model(
        cls, model: torch.nn.Module, cfg: DeMoConfig, sender: Hashable = 0, reach: int = 0
    ) -> DeMo:
        """DeMo over the model's parameters, its embedding and output head as token tensors
        (how every node of a job builds it, so that all agree on the packet layout); `reach`:
        the rows its tokenizer can reach (segments.plan; 0: all)."""
        tokens, heads = _tokens(model, cfg.compress)
        named = model.named_parameters()
        return cls(named, cfg, sender=sender, tokens=tokens, heads=heads, reach=reach)

    @property
    def due(self) -> bool:
        """Whether the next prepare() is due (K inner steps since the last sync)."""
        return self.cfg.mode == "paper" or (
            self.steps > 0 and self.steps % self.cfg.sync_interval == 0
        )

    def inner_step(self) -> None:
        """One local AdamW step on the current gradients; in paper mode the step only counts
        (its gradients stay for the round's prepare(), which takes them)."""
        self.steps += 1
        if self.inner is None:
            return
        self.inner.step()
        self.inner.zero_grad(set_to_none=True)

    @torch.no_grad()
    def prepare(self) -> bytes:
        """Fold this round's pseudo-gradient into e, take its compressed part out (error
        feedback) and encode it. The pseudo-gradient is the gradient (paper mode: taken out of
        the parameters, none counting as zeros) or theta_sync - theta_local (local mode)."""
        t0 = time.perf_counter()
        if self.cfg.mode == "paper":
            grads = [
                torch.zeros(p.shape) if p.grad is None else p.grad.float().cpu()
                for p in self.params
            ]
            for p in self.params:
                p.grad = None
            self.feedback.fold(self.cfg.beta, segments.parts(grads, self.segs))
        else:
            local = [p.detach().cpu() for p in self.params]
            a, b = segments.deltas(self.theta_sync, local, self.segs)
            self.feedback.fold(self.cfg.beta, a, b)
        sent = self.feedback.take()
        self._sent = sent if self.cfg.shared_feedback else None
        data = codec.encode(self.spec, sent)
        self._compress_s = time.perf_counter() - t0
        return data

    def decode_all(
        self, packets: Iterable[tuple[Hashable, bytes]]
    ) -> tuple[list[tuple[Hashable, list]], dict[Hashable, str]]:
        """Validate packets; drop malformed ones and senders with conflicting packets.

        The result depends only on the multiset of (sender, bytes), never on arrival order.
        """
        seen: dict[Hashable, bytes] = {}
        rejected: dict[Hashable, str] = {}
        for s, data in packets:
            if s in rejected:
                continue
            if s in seen and seen[s] != data:
                rejected[s] = "conflicting packets"
                del seen[s]
                continue
            seen[s] = bytes(data)
        good = []
        decoded = codec.decode_many(self.spec, list(seen.values()), self.cfg.max_packet_bytes)
        for s, res in zip(seen, decoded, strict=True):
            if isinstance(res, PacketError):
                rejected[s] = res.reason
            else:
                good.append((s, res))
        return good, rejected

    def _least_senders(self, kept: int) -> int:
        """Senders a coefficient needs to be aggregated (RobustConfig.support)."""
        r = self.cfg.robust
        return max(1, math.ceil(r.support * kept)) if r.enabled else 1

    @torch.no_grad()
    def apply(self, packets: Iterable[tuple[Hashable, bytes]]) -> SyncStats:
        """Aggregate this round's packets exactly and take the outer step on theta_sync."""
        t0 = time.perf_counter()
        good, rejected = self.decode_all(packets)
        t1 = time.perf_counter()
        judged = screen_weighted(self.spec, good, self.cfg.robust)
        good, excluded = judged.kept, judged.excluded
        t2 = time.perf_counter()
        agg = (
            aggregate(
                self.spec,
                good,
                device=torch.device("cpu"),
                per_coefficient=self.cfg.per_coefficient_mean,
                least_senders=self._least_senders(len(good)),
                majority_sign=self.cfg.robust.enabled and self.cfg.robust.majority,
            )
            if good
            else None
        )
        if agg is not None:
            agg.weight = judged.weight
        dt = time.perf_counter() - t2 + t1 - t0
        st = SyncStats(rejected=rejected, excluded=excluded, aggregate_s=dt, screen_s=t2 - t1)
        st.clipped, st.distrusted, st.copies = judged.clipped, judged.distrusted, judged.copies
        st.compress_s = self._compress_s
        st.bytes_sent = self.spec.packet_bytes
        before = [th.clone() for th in self.theta_sync] if self._sent is not None else None
        if agg is not None:
            self.apply_aggregate(agg)
            st.applied, st.aggregate = agg.senders, agg
        else:
            self._reset_local()
        if before is not None:
            self._settle(before)
        return st

    @torch.no_grad()
    def _settle(self, before: list[torch.Tensor]) -> None:
        """shared_feedback: e gets back what this member's take sent and loses what the
        shared state moved from `before` instead (both through the fold's own transform)."""
        sent, self._sent = self._sent, None
        self.feedback.give(sent)
        a, b = segments.deltas(self.theta_sync, before, self.segs)
        self.feedback.fold(1.0, a, b)

    @torch.no_grad()
    def apply_aggregate(self, agg: Aggregate) -> None:
        """Outer step from an already computed aggregate (bitwise the same on every node)."""
        c = self.cfg
        for i, (th, seg) in enumerate(
            zip(segments.views(self.theta_sync, self.segs), self.segs, strict=True)
        ):
            u = agg.update(i, c.lr, c.sign, th.dtype).to(th.device)
            if c.weight_decay and not seg.mean:  # the parameter's other parts decayed it
                th.mul_(1.0 - c.lr * c.weight_decay)
            # elementwise, hence the same bits everywhere: no packet set makes the state non-finite
            m = c.robust.theta_max
            torch.nan_to_num_(th.sub_(u), 0.0, m, -m).clamp_(-m, m)
        self._reset_local()

    @torch.no_grad()
    def replay(
        self,
        start: Sequence[torch.Tensor],
        rounds: Iterable[Iterable[tuple[Hashable, bytes]]],
    ) -> list[SyncStats]:
        """Recompute the shared state from `start` (as theta_sync was when the rounds began)
        by applying each round's packets in turn: aggregation only, no training. The result
        is bitwise what a node that applied exactly these packets holds."""
        shared = self.theta_sync
        if len(start) != len(shared):
            raise ValueError(f"start has {len(start)} tensors, the shared state {len(shared)}")
        for th, s in zip(shared, start, strict=True):
            th.copy_(s)
        self._sent = None  # a replay moves the shared state only, never e
        return [self.apply(packets) for packets in rounds]

    def _reset_local(self) -> None:
        for p, th in zip(self.params, self.theta_sync, strict=True):
            p.data.copy_(th)

    def sync(self, gather: Gather) -> SyncStats:
        """prepare(), exchange through `gather`, apply(): one full round."""
        return self.apply(gather(self.prepare()))

    def step(self, gather: Gather) -> SyncStats | None:
        """Training step after loss.backward(): inner step, then a sync when one is due."""
        self.inner_step()
        return self.sync(gather) if self.due else None


def _tokens(
    model: torch.nn.Module, compress: CompressConfig
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The model's token tensors and, of them, its output heads (when compressed apart)."""
    if not compress.tokens_apart:
        return (), ()
    return segments.token_names(model), segments.head_names(model)


def model_spec(model: torch.nn.Module, compress: CompressConfig, reach: int = 0) -> codec.Spec:
    """The packet spec `DeMo.of_model` builds for `model`, without building any state."""
    named = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
    return segments.plan(named, compress, *_tokens(model, compress), reach)[0]


def lockstep(opts: Sequence[DeMo]) -> list[SyncStats]:
    """Run one sync round for in-process workers: everyone prepares, everyone applies all."""
    packets = [(o.sender, o.prepare()) for o in opts]
    return [o.apply(packets) for o in opts]

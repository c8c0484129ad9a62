"""Training objectives as small pure functions of logits / log-probs (see docs/methods.md).

Conventions: `logits` are [B, T, V] from a causal LM over `ids` [B, T]; position t predicts
token t + 1, so every per-token function shifts by one. `labels` are `ids` with the tokens that
carry no loss (prompt, padding) set to IGNORE.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # label of a token that is not trained on (prompt, padding)


def cpt_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Continued pre-training: mean next-token cross-entropy; targets are already shifted."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def mask_prompt(
    ids: torch.Tensor, prompt_lens: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """Labels for `ids`: IGNORE on the first prompt_lens[i] tokens and past lengths[i] (padding)."""
    pos = torch.arange(ids.size(1))[None, :]
    keep = (pos >= prompt_lens[:, None]) & (pos < lengths[:, None])
    return torch.where(keep, ids, torch.full_like(ids, IGNORE))


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Supervised fine-tuning: mean cross-entropy over the response tokens only."""
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )


def token_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(label_t+1 | <= t) [B, T-1], mask [B, T-1]) for the labelled tokens (0 elsewhere)."""
    tgt = labels[:, 1:]
    mask = tgt != IGNORE
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = lp.gather(-1, tgt.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * mask, mask


def sequence_logps(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of the response tokens' log-probs per sequence, [B]."""
    lp, _ = token_logps(logits, labels)
    return lp.sum(-1)


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sigmoid DPO (Rafailov et al. 2023) on summed response log-probs, [B] each.

    Returns (mean loss, chosen rewards, rejected rewards) with reward = beta * (pi - ref).
    """
    if beta <= 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}")
    chosen = beta * (policy_chosen - ref_chosen)
    rejected = beta * (policy_rejected - ref_rejected)
    loss = -F.logsigmoid(chosen - rejected).mean()
    return loss, chosen.detach(), rejected.detach()


def group_advantages(rewards: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO advantages (r - mean) / (std + eps) within each group (row) of [P, G] rewards.

    std is the unbiased sample std (as torch.std and the GRPO reference implementations); a group
    whose samples all got the same reward gets advantage 0 and so no policy gradient.
    """
    if rewards.dim() != 2 or rewards.size(1) < 2:
        raise ValueError(f"rewards must be [prompts, G >= 2], got {tuple(rewards.shape)}")
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True)
    return (rewards - mean) / (std + eps)


def k3_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """Per-token unbiased, non-negative KL(pi || ref) estimate exp(d) - d - 1, d = ref - pi."""
    d = logp_ref - logp
    return torch.exp(d) - d - 1


def grpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    logp_ref: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
) -> torch.Tensor:
    """Clipped policy-gradient objective with a k3 KL penalty to the reference, to minimise.

    logp / logp_old / logp_ref: [N, T] log-probs of the sampled tokens under the policy being
    trained, the policy that sampled them, and the frozen reference; advantages: [N] (one per
    sample, shared by its tokens). Token losses are averaged per sequence, then over sequences.
    """
    if mask is None:
        mask = torch.ones_like(logp, dtype=torch.bool)
    m = mask.to(logp.dtype)
    ratio = torch.exp(logp - logp_old)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv)
    per_token = -surrogate + kl_coef * k3_kl(logp, logp_ref)
    per_seq = (per_token * m).sum(-1) / m.sum(-1).clamp(min=1)
    return per_seq.mean()


def exact_match(completions: list[str], answer: str) -> torch.Tensor:
    """Verifiable reward: 1.0 where a completion equals the answer exactly, else 0.0."""
    return torch.tensor([1.0 if c == answer else 0.0 for c in completions])

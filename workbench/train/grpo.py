"""GRPO's loss (Shao et al. 2024, DeepSeekMath §4.1) as pure functions of tensors: group-normalised advantages and
the clipped token-level policy-gradient objective, with an optional k3 KL to a reference.

A step samples G completions of each prompt from the current policy, scores each with a reward, and gives every
token of a completion its group's advantage ``A = (r − mean_group) / (std_group + 1e-4)`` (``scale_std=False``:
``r − mean_group``, Dr. GRPO's, Liu et al. 2025, which drops the std as a question-difficulty bias). Each token's
loss is PPO's clipped surrogate ``−min(ρ A, clip(ρ, 1 − ε_low, 1 + ε_high) A)`` with ``ρ = exp(logp − logp_old)``,
plus ``β · (exp(ref − logp) − (ref − logp) − 1)`` (Schulman's k3 estimator of KL(π‖ref), DeepSeekMath eq. 4) when
β > 0. The tokens' losses are then averaged in one of four ways (TRL's ``loss_type`` names, the same formulas):

* ``grpo``: each completion's token mean, then the mean over completions (DeepSeekMath's 1/|o_i| — a long wrong
  answer is punished less per token than a short one: the length bias DAPO and Dr. GRPO point out);
* ``bnpo``: the mean over every completion token of the micro-batch;
* ``dapo``: the sum over tokens divided by the completion tokens of the whole step (every micro-batch: ``tokens``),
  DAPO's token-level loss (Yu et al. 2025) and TRL's default; with one micro-batch a step it is ``bnpo``;
* ``dr_grpo``: the sum over tokens divided by completions × the longest completion allowed (a constant, Dr. GRPO).

The std is Bessel-corrected and the epsilon 1e-4, as TRL's (``trl.trainer.utils.nanstd``); parity with TRL's
``GRPOTrainer._compute_loss``, loss and gradients to 1e-5 in fp32 for all four: tests/train/test_grpo.py.

Defaults (the table of objectives and the schema hold them; why): G = 8 (TRL's ``num_generations``; DeepSeekMath
sampled 64, too many for a laptop), ε = 0.2 (PPO's, DeepSeekMath's and TRL's; DAPO raises ε_high to 0.28 so
unlikely tokens can rise), β = 0 (TRL's default since 0.19, DAPO and Dr. GRPO drop the KL term — with verifiable
rewards the clip already bounds each step, and no reference forward is paid; DeepSeekMath used 0.04), ``dapo``
normalisation (TRL's default: no length bias), std scaling on (DeepSeekMath, TRL ``scale_rewards="group"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo")
STD_EPS = 1e-4   # TRL's: the std of a group whose rewards are all equal is 0, so its advantages are 0, not NaN


@dataclass(frozen=True)
class GroupAdvantages:
    """Each completion's advantage [B] and what the groups looked like."""
    advantages: torch.Tensor
    mean: torch.Tensor        # [B / G]: each group's mean reward
    std: torch.Tensor         # [B / G]: each group's reward std (Bessel-corrected)
    no_signal: torch.Tensor   # [B / G] bool: every reward of the group equal, so every advantage 0

    @property
    def no_signal_share(self) -> float:
        return float(self.no_signal.float().mean())


def group_advantages(rewards: torch.Tensor, group: int, scale_std: bool = True) -> GroupAdvantages:
    """``rewards`` [B] of B / ``group`` prompts' groups of ``group`` consecutive completions, as advantages."""
    if group < 2 or rewards.numel() % group:
        raise ValueError(f"{rewards.numel()} rewards are not groups of {group} (a group needs at least 2)")
    r = rewards.float().view(-1, group)
    mean = r.mean(1)
    std = r.std(1, unbiased=True)
    adv = r - mean[:, None]
    if scale_std:
        adv = adv / (std[:, None] + STD_EPS)
    return GroupAdvantages(adv.reshape(-1), mean, std, torch.isclose(std, torch.zeros_like(std)))


@dataclass(frozen=True)
class GRPOLoss:
    loss: torch.Tensor          # the scalar to back-propagate
    kl: torch.Tensor | None     # mean k3 KL to the reference over completion tokens (beta > 0), detached
    clipped: torch.Tensor       # share of completion tokens whose ratio was clipped (the region that bites)


def grpo_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              ref_logps: torch.Tensor | None = None, beta: float = 0.0, clip_low: float = 0.2,
              clip_high: float | None = None, loss_type: str = "dapo", max_completion: int | None = None,
              tokens: torch.Tensor | float | None = None) -> GRPOLoss:
    """GRPO's loss of completions [B, T] (``logps`` the policy's per-token log-probs with gradient, ``old_logps``
    the sampling policy's, detached; ``mask`` 1 on each completion's tokens), ``advantages`` [B].

    ``max_completion``: ``dr_grpo``'s constant (the most new tokens a completion may have); ``tokens``: ``dapo``'s
    count of completion tokens of the whole step (default this batch's)."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
    mask = mask.to(logps.dtype)
    clip_high = clip_low if clip_high is None else clip_high
    adv = advantages[:, None].to(logps.dtype)
    ratio = torch.exp(logps - old_logps)
    clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)
    kl = None
    if beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta > 0 needs the reference's log-probs")
        d = ref_logps - logps
        per_token_kl = torch.exp(d) - d - 1
        per_token = per_token + beta * per_token_kl
        kl = ((per_token_kl * mask).sum() / mask.sum().clamp(min=1.0)).detach()
    if loss_type == "grpo":
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    elif loss_type == "bnpo":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "dr_grpo":
        if not max_completion:
            raise ValueError("dr_grpo divides by the longest completion allowed: give max_completion")
        loss = (per_token * mask).sum() / (per_token.size(0) * max_completion)
    else:
        n = mask.sum() if tokens is None else torch.as_tensor(tokens, dtype=logps.dtype, device=logps.device)
        loss = (per_token * mask).sum() / n.clamp(min=1.0)
    with torch.no_grad():
        bites = ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0))
        clipped = (bites.to(mask.dtype) * mask).sum() / mask.sum().clamp(min=1.0)
    return GRPOLoss(loss, kl, clipped)


__all__ = ["GRPOLoss", "GroupAdvantages", "LOSS_TYPES", "STD_EPS", "grpo_loss", "group_advantages"]

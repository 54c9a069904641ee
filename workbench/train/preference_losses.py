"""Preference objectives: which of two answers is better (DPO, SimPO, ORPO) or whether one answer is good
(KTO), as losses on the log-probabilities a model gives to the answer tokens.

The losses are pure functions of per-sequence log-probabilities, so each is checked against an independent
implementation (TRL's trainers, tests/train/test_preference.py):

* **dpo**: sigmoid DPO (Rafailov et al. 2023) on *summed* log-probs against a frozen reference:
  ``-log σ(β [(π_c − ref_c) − (π_r − ref_r)])``; with ``label_smoothing`` ε > 0, robust DPO (Chowdhury et al.
  2024), TRL's ``robust``: ``[−(1−ε) log σ(βΔ) + ε log σ(−βΔ)] / (1 − 2ε)``. Rewards: ``β (π − ref)``. At the
  first step the policy is the reference, so the loss is ln 2 and both rewards 0 (the trainer checks it). With
  ``dpop`` λ > 0, DPO-Positive (Pal et al. 2024, eq. 3): Δ less ``λ · max(0, ref_c − π_c)``, a penalty on the
  chosen answer's fall below the reference (0 while it has not fallen, so step 0 is still ln 2, its gradient
  DPO's).
* **simpo**: reference-free (Meng et al. 2024), on *length-averaged* log-probs: ``−log σ(β (π̄_c − π̄_r) − γ)``
  (with ε, the conservative form, as TRL's CPO trainer: ``−(1−ε) log σ(x) − ε log σ(−x)``). Rewards: ``β π̄``.
* **orpo**: reference-free (Hong et al. 2024): the chosen answers' SFT loss plus ``−λ log σ(log odds_c − log
  odds_r)`` with ``odds = p / (1 − p)`` of the length-averaged probability. Rewards: ``λ π̄``.
* **kto**: unpaired (Ethayarajh et al. 2024): a desirable answer's loss ``1 − σ(β (r − z))``, an undesirable one's
  ``1 − σ(β (z − r))``, ``r = π − ref`` (summed) and ``z`` the batch's KL estimate, clamped at 0 and detached.
* An optional SFT term on the chosen answers (``sft_weight``): their token-mean negative log-likelihood, as TRL
  adds its ``sft`` loss type — it holds the chosen answers' probability up while DPO widens the margin (both
  rewards may fall under DPO alone; that is expected).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from workbench.config.objectives import DEFAULT_SIMPO_GAMMA

LN2 = math.log(2.0)
# Each objective's defaults (its β, summed or averaged log-probs, whether it needs a reference) are the table's,
# torch-free: workbench.config.objectives. The trainer picks these losses by its names (workbench.train.objective).


@dataclass(frozen=True)
class AnswerLogps:
    """The log-probabilities of a batch of answers (rows), over their trained tokens (the mask)."""
    per_token: torch.Tensor   # [B, T]: each target's log-probability, 0 where the mask is 0
    mask: torch.Tensor        # [B, T]: 1 on the answer's tokens
    total: torch.Tensor       # [B]: summed over the answer
    count: torch.Tensor       # [B]: its tokens

    @property
    def mean(self) -> torch.Tensor:
        """Length-averaged (SimPO, ORPO)."""
        return self.total / self.count.clamp(min=1)

    def take(self, averaged: bool) -> torch.Tensor:
        return self.mean if averaged else self.total

    def rows(self, index: slice | torch.Tensor) -> "AnswerLogps":
        return AnswerLogps(self.per_token[index], self.mask[index], self.total[index], self.count[index])


@dataclass(frozen=True)
class PreferenceLoss:
    """One batch's loss and what the run logs beside it (per pair / per answer, detached)."""
    loss: torch.Tensor
    chosen_rewards: torch.Tensor
    rejected_rewards: torch.Tensor

    @property
    def margin(self) -> torch.Tensor:
        return self.chosen_rewards - self.rejected_rewards

    @property
    def accuracy(self) -> torch.Tensor:
        """The share of pairs whose chosen answer has the higher reward."""
        return (self.chosen_rewards > self.rejected_rewards).float().mean()


def _smoothed(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``−(1−ε) log σ(x) − ε log σ(−x)``: the conservative (label-smoothed) logistic loss."""
    return -(1 - eps) * F.logsigmoid(x) - eps * F.logsigmoid(-x)


def sft_term(chosen: AnswerLogps) -> torch.Tensor:
    """The chosen answers' token-mean negative log-likelihood (over every chosen token of the batch)."""
    return -chosen.per_token.sum() / chosen.mask.sum().clamp(min=1)


def dpo_loss(chosen: AnswerLogps, rejected: AnswerLogps, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor,
             beta: float, label_smoothing: float = 0.0, sft_weight: float = 0.0,
             dpop: float = 0.0) -> PreferenceLoss:
    """Sigmoid DPO (robust DPO with ``label_smoothing``, DPOP with ``dpop`` λ); ``ref_*``: the reference's summed
    log-probs [B]."""
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing {label_smoothing} must be in [0, 0.5)")
    if dpop < 0:
        raise ValueError(f"dpop {dpop} must be >= 0")
    chosen_ratio, rejected_ratio = chosen.total - ref_chosen, rejected.total - ref_rejected
    delta = chosen_ratio - rejected_ratio
    if dpop:
        delta = delta - dpop * torch.relu(-chosen_ratio)   # gradient 0 at the hinge: step 1 is DPO's (clamp: 1)
    x = beta * delta
    if label_smoothing:
        per_pair = (-(1 - label_smoothing) * F.logsigmoid(x) + label_smoothing * F.logsigmoid(-x)) \
            / (1 - 2 * label_smoothing)
    else:
        per_pair = -F.logsigmoid(x)
    loss = per_pair.mean() + (sft_weight * sft_term(chosen) if sft_weight else 0.0)
    return PreferenceLoss(loss, beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def simpo_loss(chosen: AnswerLogps, rejected: AnswerLogps, beta: float, gamma: float = DEFAULT_SIMPO_GAMMA,
               label_smoothing: float = 0.0, sft_weight: float = 0.0) -> PreferenceLoss:
    """SimPO: reference-free, length-averaged, with a target margin ``gamma``."""
    x = beta * (chosen.mean - rejected.mean) - gamma
    loss = _smoothed(x, label_smoothing).mean() + (sft_weight * sft_term(chosen) if sft_weight else 0.0)
    return PreferenceLoss(loss, beta * chosen.mean.detach(), beta * rejected.mean.detach())


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 − e^x) for x < 0, stable on both sides of −ln 2."""
    return torch.where(x > -LN2, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def orpo_loss(chosen: AnswerLogps, rejected: AnswerLogps, lam: float) -> PreferenceLoss:
    """ORPO: the chosen answers' SFT loss plus λ times the odds-ratio term, on length-averaged log-probs."""
    pc, pr = chosen.mean.float(), rejected.mean.float()
    log_odds = (pc - pr) - (_log1mexp(pc) - _log1mexp(pr))
    loss = sft_term(chosen) - lam * F.logsigmoid(log_odds).mean()
    return PreferenceLoss(loss, lam * pc.detach(), lam * pr.detach())


def kto_loss(answers: AnswerLogps, ref: torch.Tensor, desirable: torch.Tensor, kl: torch.Tensor, beta: float,
             desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> PreferenceLoss:
    """KTO on unpaired answers (``desirable`` [B] bool): ``kl`` is the batch's estimate of the policy's KL from the
    reference (mismatched prompt and answer pairs), clamped at 0 and detached here. Rewards are per answer: the
    desirable ones' as "chosen", the undesirable ones' as "rejected" (either may be empty)."""
    z = kl.detach().clamp(min=0)
    ratio = answers.total - ref
    good = desirable.bool()
    losses = torch.where(good, desirable_weight * (1 - torch.sigmoid(beta * (ratio - z))),
                         undesirable_weight * (1 - torch.sigmoid(beta * (z - ratio))))
    rewards = beta * ratio.detach()
    return PreferenceLoss(losses.mean(), rewards[good], rewards[~good])


__all__ = ["AnswerLogps", "LN2", "PreferenceLoss", "dpo_loss", "kto_loss", "orpo_loss", "sft_term",
           "simpo_loss"]
